"""ERNIE 2.0 continual multi-task pre-training (Sun et al., AAAI 2020) on transformers' `ErnieModel`.

The encoder is transformers' own (`ErnieModel` with `task_type_ids`) and the knowledge-masking head transformers'
`ErnieOnlyMLMHead` (tied to the word embeddings) but for its output bias, which the decoder alone holds
(`Ernie2LMPredictionHead`), under the names of `ErnieForPreTraining` (`ernie.*`, `cls.predictions.*`), so a
converted ERNIE folder loads into it and its encoder saves back to a plain `ernie` folder.
The other six heads are single linear layers: on every token's output for capitalization and token-document
relation, on the pooled [CLS] output (`fc(pooled_output, num_labels)`, as the released code's task heads) for
sentence reordering, sentence distance, discourse relation and IR relevance. The original pre-training code was
never released; these heads and the loss (the plain sum of each task's mean cross-entropy) are this port's choice.
"""

import dataclasses
import itertools
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from transformers import ErnieConfig, ErnieForMaskedLM, ErnieForPreTraining
from transformers.conversion_mapping import register_checkpoint_conversion_mapping
from transformers.core_model_loading import WeightRenaming
from transformers.models.ernie.modeling_ernie import ErnieModel, ErniePredictionHeadTransform, ErniePreTrainedModel
from transformers.utils import ModelOutput, can_return_tuple

from .configuration_ernie2 import PRETRAINING_TASKS, TOKEN_LEVEL_TASKS, Ernie2PreTrainingConfig

IGNORE_INDEX = -100

# The MLM decoder's bias is a parameter of the decoder alone (Ernie2LMPredictionHead). Checkpoints keep the name
# transformers' ERNIE saves it under, which transformers renames on loading and back on saving.
register_checkpoint_conversion_mapping(
    Ernie2PreTrainingConfig.model_type,
    [WeightRenaming(r"cls\.predictions\.bias", "cls.predictions.decoder.bias")], overwrite=True)


# ----- sentence reordering labels ----------------------------------------------------------------------------------

def sentence_reordering_label(permutation: Sequence[int] | torch.Tensor) -> int:
    """The class of a shuffled paragraph. `permutation[i]` is the original index of the segment shown at position i
    (a permutation of 0..n-1). Classes enumerate n = 1, 2, ..., m in turn: the n-segment orders take the classes from
    sum_{j<n} j! on, each at its lexicographic rank among the n! permutations of 0..n-1 (the identity first). So m=3
    gives 0: (0); 1: (0 1), 2: (1 0); 3: (0 1 2), 4: (0 2 1), 5: (1 0 2), 6: (1 2 0), 7: (2 0 1), 8: (2 1 0)."""
    permutation = [int(p) for p in permutation]
    n = len(permutation)
    if sorted(permutation) != list(range(n)):
        raise ValueError(f"{permutation} is not a permutation of 0..{n - 1}")
    offset = sum(math.factorial(j) for j in range(1, n))
    rank = 0
    for position, value in enumerate(permutation):  # Lehmer code
        smaller_later = sum(later < value for later in permutation[position + 1:])
        rank += smaller_later * math.factorial(n - 1 - position)
    return offset + rank


def sentence_reordering_permutation(label: int, max_segments: int) -> list[int]:
    """The inverse of `sentence_reordering_label` for paragraphs of at most `max_segments` segments."""
    for n in range(1, max_segments + 1):
        if label < math.factorial(n):
            return list(next(itertools.islice(itertools.permutations(range(n)), label, None)))
        label -= math.factorial(n)
    raise ValueError(f"there are only {sum(math.factorial(n) for n in range(1, max_segments + 1))} reordering classes "
                     f"for {max_segments} segments")


# ----- model -------------------------------------------------------------------------------------------------------

@dataclass
class Ernie2PreTrainingOutput(ModelOutput):
    r"""
    loss (`torch.FloatTensor` of shape `()`): the sum of the losses of the tasks that have labels in the batch.
    <task>_loss (`torch.FloatTensor` of shape `()`): one per task of `PRETRAINING_TASKS`, its mean cross-entropy over
        the labelled items (tokens or rows whose label is not -100); `None` when the batch has no label for it.
    <task>_logits: the task head's output, for the tasks with labels (all of them when no labels are given): token
        tasks `(batch, length, classes)` (knowledge masking: the vocabulary), sentence tasks `(batch, classes)`.
    hidden_states, attentions: the encoder's, when requested.
    """

    loss: torch.Tensor | None = None
    knowledge_masking_loss: torch.Tensor | None = None
    capitalization_loss: torch.Tensor | None = None
    token_document_relation_loss: torch.Tensor | None = None
    sentence_reordering_loss: torch.Tensor | None = None
    sentence_distance_loss: torch.Tensor | None = None
    discourse_relation_loss: torch.Tensor | None = None
    ir_relevance_loss: torch.Tensor | None = None
    knowledge_masking_logits: torch.Tensor | None = None
    capitalization_logits: torch.Tensor | None = None
    token_document_relation_logits: torch.Tensor | None = None
    sentence_reordering_logits: torch.Tensor | None = None
    sentence_distance_logits: torch.Tensor | None = None
    discourse_relation_logits: torch.Tensor | None = None
    ir_relevance_logits: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


def take_the_bias_under_its_saved_name(module: nn.Module, state_dict: dict[str, torch.Tensor], prefix: str,
                                       *args: Any) -> None:
    """A `load_state_dict` pre-hook of `Ernie2LMPredictionHead`: its decoder's bias from `bias`, the name checkpoints
    and transformers' ERNIE state dicts give it (these also hold it as `decoder.bias`, which wins)."""
    bias = state_dict.pop(f"{prefix}bias", None)
    if bias is not None:
        state_dict.setdefault(f"{prefix}decoder.bias", bias)


class Ernie2LMPredictionHead(nn.Module):
    """transformers' `ErnieLMPredictionHead` (a transform, then the decoder, whose weight is the word embeddings'),
    the output bias the decoder's own. transformers' head also holds that bias as its `bias` (tied to `decoder.bias`),
    so one parameter belongs to two modules, which accelerate's FSDP2 plan puts in two units: the decoder in the word
    embeddings' unit, the head in the model's; FSDP2 refuses a parameter two units share."""

    def __init__(self, config: ErnieConfig):
        super().__init__()
        self.transform = ErniePredictionHeadTransform(config)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size)
        # Trainer resumes from a checkpoint by `load_state_dict` of its tensors as saved, without transformers'
        # renaming: the bias is found under its saved name there too
        self.register_load_state_dict_pre_hook(take_the_bias_under_its_saved_name)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.transform(hidden_states))


class Ernie2OnlyMLMHead(nn.Module):
    """transformers' `ErnieOnlyMLMHead` on `Ernie2LMPredictionHead`: the weights are named as transformers' ERNIE
    names them (`cls.predictions.*`)."""

    def __init__(self, config: ErnieConfig):
        super().__init__()
        self.predictions = Ernie2LMPredictionHead(config)

    def forward(self, sequence_output: torch.Tensor) -> torch.Tensor:
        return self.predictions(sequence_output)


class Ernie2ForPreTraining(ErniePreTrainedModel):
    r"""
    ERNIE 2.0 with the heads of its seven pre-training tasks. Give `task_type_ids` (each row: its task's id,
    `config.task_ids[task]`; zeros when omitted, as in `ErnieModel`) and the labels of the batch's tasks,
    `<task>_labels`: `(batch, length)` for token tasks, `(batch,)` for sentence tasks, -100 where an item has no label
    (padding, unmasked tokens, rows of another task).

    `from_ernie_pretrained` starts from a converted or fine-tuned ERNIE folder; `to_ernie` / `save_ernie_pretrained`
    give the encoder and MLM head back as a plain transformers `ErnieForPreTraining` for fine-tuning.
    """

    config: Ernie2PreTrainingConfig
    _tied_weights_keys = {"cls.predictions.decoder.weight": "ernie.embeddings.word_embeddings.weight"}
    # the loss is a mean per task, not a sum over the items of the accumulated batches
    accepts_loss_kwargs = False

    def __init__(self, config):
        super().__init__(config)
        self.ernie = ErnieModel(config)
        self.cls = Ernie2OnlyMLMHead(config)
        self.heads = nn.ModuleDict({task: nn.Linear(config.hidden_size, classes)
                                    for task, classes in config.task_num_labels.items()
                                    if task != "knowledge_masking"})
        self.post_init()

    def get_output_embeddings(self) -> nn.Linear:
        return self.cls.predictions.decoder

    def set_output_embeddings(self, new_embeddings: nn.Module) -> None:
        self.cls.predictions.decoder = new_embeddings

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        task_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        knowledge_masking_labels: torch.Tensor | None = None,
        capitalization_labels: torch.Tensor | None = None,
        token_document_relation_labels: torch.Tensor | None = None,
        sentence_reordering_labels: torch.Tensor | None = None,
        sentence_distance_labels: torch.Tensor | None = None,
        discourse_relation_labels: torch.Tensor | None = None,
        ir_relevance_labels: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> Ernie2PreTrainingOutput:
        outputs = self.ernie(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                             task_type_ids=task_type_ids, position_ids=position_ids, inputs_embeds=inputs_embeds,
                             return_dict=True, **kwargs)
        passed = dict(zip(PRETRAINING_TASKS, (
            knowledge_masking_labels, capitalization_labels, token_document_relation_labels,
            sentence_reordering_labels, sentence_distance_labels, discourse_relation_labels, ir_relevance_labels),
            strict=True))
        labels = {task: value for task, value in passed.items() if value is not None}
        result = {}
        for task in labels or PRETRAINING_TASKS:
            features = outputs.last_hidden_state if task in TOKEN_LEVEL_TASKS else outputs.pooler_output
            logits = self.cls(features) if task == "knowledge_masking" else self.heads[task](features)
            result[f"{task}_logits"] = logits
            if task in labels:
                result[f"{task}_loss"] = task_loss(logits, labels[task])
        losses = [result[f"{task}_loss"] for task in labels if result[f"{task}_loss"] is not None]
        return Ernie2PreTrainingOutput(loss=torch.stack(losses).sum() if losses else None, **result,
                                       hidden_states=outputs.hidden_states, attentions=outputs.attentions)

    # ----- to and from plain ERNIE folders -----

    @classmethod
    def from_ernie(cls, ernie_model: ErnieForPreTraining | ErnieForMaskedLM, **config_kwargs: Any,
                   ) -> "Ernie2ForPreTraining":
        """A pre-training model whose encoder and MLM head are those of `ernie_model` (an `ErnieForPreTraining` or
        `ErnieForMaskedLM`, whose missing pooler is then freshly initialised); the task heads are new.

        The task embedding gets a row for every task id: the source's rows are kept; a source without task
        embeddings (the released English checkpoints) gets zero rows, so every task starts from the exact function
        of the source model, and rows beyond the source's start as copies of its row 0 (the id fine-tuning uses).
        `config_kwargs` set the `Ernie2PreTrainingConfig` fields (`task_ids`, `max_reorder_segments`, ...).
        """
        source = ernie_model.config
        settings = encoder_settings(source)
        task_ids = config_kwargs.get("task_ids") or {task: i for i, task in enumerate(PRETRAINING_TASKS)}
        needed = max(task_ids.values()) + 1 if task_ids else 0
        settings.update(use_task_id=True, task_type_vocab_size=max(source.task_type_vocab_size, needed),
                        architectures=[cls.__name__])
        settings.update(config_kwargs)
        model = cls(Ernie2PreTrainingConfig(**settings))
        state = {name: tensor for name, tensor in ernie_model.state_dict().items()
                 if name.startswith(("ernie.", "cls.predictions."))}
        task_embedding = state.pop("ernie.embeddings.task_type_embeddings.weight", None)
        missing, _ = model.load_state_dict(state, strict=False)
        untouched = {name for name in missing if not name.startswith(("heads.", "ernie.pooler."))}
        untouched -= {"ernie.embeddings.task_type_embeddings.weight", *model._tied_weights_keys}
        if untouched:
            raise ValueError(f"{type(ernie_model).__name__} lacks weights of the pre-training model: "
                             f"{', '.join(sorted(untouched)[:4])}")
        with torch.no_grad():
            rows = model.ernie.embeddings.task_type_embeddings.weight
            if task_embedding is None:
                rows.zero_()
            else:
                rows[:len(task_embedding)] = task_embedding
                rows[len(task_embedding):] = task_embedding[0]
        return model

    @classmethod
    def from_ernie_pretrained(cls, pretrained_model_name_or_path: str | os.PathLike,
                              config_kwargs: dict[str, Any] | None = None, **kwargs: Any) -> "Ernie2ForPreTraining":
        """`from_ernie` of `ErnieForPreTraining.from_pretrained(pretrained_model_name_or_path, **kwargs)` (a folder
        written by `hf-ext convert ernie2`, or any ernie repo)."""
        return cls.from_ernie(ErnieForPreTraining.from_pretrained(pretrained_model_name_or_path, **kwargs),
                              **(config_kwargs or {}))

    def to_ernie(self) -> ErnieForPreTraining:
        """The encoder (with its pooler and task embeddings) and the MLM head as transformers' own
        `ErnieForPreTraining`, which needs no remote code. That class also has a next-sentence head, which ERNIE 2.0
        does not train: it is written as zeros (it predicts 50/50)."""
        settings = encoder_settings(self.config)
        settings["architectures"] = ["ErnieForPreTraining"]
        # transformers' PreTrainedModel.to is functools.wraps(nn.Module.to) of a method, which mypy does not bind
        model = ErnieForPreTraining(ErnieConfig(**settings)).to(self.device, self.dtype)  # type: ignore[arg-type]
        state = {name: tensor for name, tensor in self.state_dict().items()
                 if name.startswith(("ernie.", "cls.predictions."))}
        model.load_state_dict(state, strict=False)
        with torch.no_grad():
            model.cls.seq_relationship.weight.zero_()
            model.cls.seq_relationship.bias.zero_()
        return model.eval()

    def save_ernie_pretrained(self, save_directory: str | os.PathLike, **kwargs: Any) -> None:
        """Save `to_ernie()` to `save_directory` (`save_pretrained` arguments in `kwargs`): a plain `ernie` folder
        that `ErnieForSequenceClassification.from_pretrained` and the other Ernie heads load for fine-tuning."""
        self.to_ernie().save_pretrained(save_directory, **kwargs)


def encoder_settings(config: ErnieConfig) -> dict[str, Any]:
    """The `ErnieConfig` fields of `config` (an ERNIE or ERNIE 2.0 pre-training config): the encoder's settings
    without the pre-training tasks'."""
    fields = {field.name for field in dataclasses.fields(ErnieConfig)}
    return {key: value for key, value in config.to_dict().items() if key in fields}


def task_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor | None:
    """Mean cross-entropy over the labelled items (label != -100); `None` when there are none."""
    labels = labels.reshape(-1)
    if not bool((labels != IGNORE_INDEX).any()):
        return None
    return F.cross_entropy(logits.reshape(labels.numel(), -1).float(), labels, ignore_index=IGNORE_INDEX)


__all__ = ["Ernie2ForPreTraining", "Ernie2PreTrainingOutput", "encoder_settings", "sentence_reordering_label",
           "sentence_reordering_permutation", "task_loss"]
