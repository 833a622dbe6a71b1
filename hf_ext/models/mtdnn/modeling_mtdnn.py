"""MT-DNN (Liu et al., ACL 2019): a shared encoder with one head per task, as in namisan/mt-dnn.

The encoder is any bidirectional transformers encoder (BERT, RoBERTa, XLM-RoBERTa, DeBERTa, DeBERTa-v2/v3, ELECTRA,
ModernBERT, ...), built with `AutoModel`. It sits at `bert` whatever its type, as in the original
(`SANBertNetwork.bert` holds its RoBERTa, DeBERTa or ELECTRA encoder too), so state-dict keys match the original's.
Every head reads the first token's final hidden state, as the original does for every encoder type (its task
Pooler reads `last_hidden_state[:, 0]`; no encoder's own pooler is used), so encoders without a pooler need none.

Heads, exactly as the original (HEAD 3228e7c):
- linear: `out_proj(dense(dropout(h_[CLS])))`. The task "Pooler" has no activation: the original's activation
  lookup fails silently and falls back to identity, whatever the task definition says.
- SAN (stochastic answer network, Liu et al. 2018): a self-attentive initial state over the hypothesis tokens, then K
  turns of bilinear attention over the premise tokens, a classifier on [x, h, |x-h|, x*h] and a GRU update; the
  output is the log of the turn-averaged probabilities, with stochastic prediction dropout of whole turns in training.

- token heads (sequence labeling, span classification): `Linear(dropout(h_t))` on every token, as the original's
  SeqenceLabeling and SpanClassification tasks (`nn.Sequential(Dropout, Linear)`, no pooler).

Regression heads output a raw score [B, 1]; ranking heads one score per (premise, candidate) row [B*K, 1], and the
loss is a cross-entropy over each group of K rows (the original's RankCeCriterion). Sequence-labeling heads output
[B, L, C] tag logits (loss: the original's SeqCeCriterion, a cross-entropy over every labelled token); span heads
[B, L, 2], the start and end score of every token (loss: SpanCeCriterion, the mean of the start and end
cross-entropies over the positions).
"""

import inspect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from transformers import AutoModel, PretrainedConfig, PreTrainedModel
from transformers import initialization as init
from transformers.modeling_outputs import (
    BaseModelOutput,
    QuestionAnsweringModelOutput,
    SequenceClassifierOutput,
    TokenClassifierOutput,
)
from transformers.models.auto.modeling_auto import MODEL_MAPPING
from transformers.utils import ModelOutput, can_return_tuple

from .configuration_mtdnn import SPAN_TASK_TYPES, TOKEN_TASK_TYPES, MTDNNConfig

RNN_CELLS = {"gru": nn.GRUCell, "lstm": nn.LSTMCell, "rnn": nn.RNNCell}
SENTENCE_TASK_TYPES = ("classification", "regression", "ranking")


@dataclass
class MTDNNSANStates(ModelOutput):
    r"""
    Intermediate states of a SAN head (T turns, B examples, L positions, H hidden size, C labels).

    initial_state (`torch.FloatTensor` of shape `(B, H)`): self-attentive sum over the hypothesis tokens.
    attention_scores (`torch.FloatTensor` of shape `(T, B, L)`): bilinear attention scores over the positions,
        `-inf` outside the premise.
    premise_summaries (`torch.FloatTensor` of shape `(T, B, H)`): the attention-weighted premise of each turn.
    states (`torch.FloatTensor` of shape `(T, B, H)`): the state each turn's classifier reads.
    rnn_outputs (`torch.FloatTensor` of shape `(T, B, H)`): the recurrent cell's output after each turn (the last one
        is computed, as in the original, but not read).
    turn_logits (`torch.FloatTensor` of shape `(T, B, C)`): each turn's classifier logits.
    """

    initial_state: torch.Tensor | None = None
    attention_scores: torch.Tensor | None = None
    premise_summaries: torch.Tensor | None = None
    states: torch.Tensor | None = None
    rnn_outputs: torch.Tensor | None = None
    turn_logits: torch.Tensor | None = None


@dataclass
class MTDNNOutput(ModelOutput):
    r"""
    loss (`torch.FloatTensor` of shape `()`): the task's loss (cross-entropy, MSE, or cross-entropy over ranking
        groups), when `labels` are given.
    logits (`torch.FloatTensor`): the head's output, as the original's: classification `(B, C)` logits (SAN: log of
        the turn-averaged probabilities), regression `(B, 1)` scores, ranking `(B*K, 1)` scores, one per row,
        sequence labeling `(B, L, C)` tag logits, span tasks `(B, L, 2)` start and end scores.
    group_logits (`torch.FloatTensor` of shape `(B, K)`): ranking only: the scores grouped by candidate set (a softmax
        over the last dimension ranks the candidates).
    start_logits, end_logits (`torch.FloatTensor` of shape `(B, L)`): span tasks only: each token's score as the
        answer's first and last token.
    hidden_states, attentions: the encoder's, when requested.
    san_states (`MTDNNSANStates`): SAN heads only, with `output_san_states=True`.
    """

    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    group_logits: torch.Tensor | None = None
    start_logits: torch.Tensor | None = None
    end_logits: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None
    san_states: MTDNNSANStates | None = None


def premise_hypothesis_masks(token_type_ids: torch.Tensor, attention_mask: torch.Tensor,
                             ) -> tuple[torch.Tensor, torch.Tensor]:
    """The SAN masks (bool, True = excluded) as the original's collater builds them for right-padded pairs: the
    premise is `[CLS] premise [SEP]` (segment 0), the hypothesis `hypothesis [SEP]` (segment 1); padding is in
    neither. Reading the segment of each token also keeps left-padded batches right."""
    real = attention_mask.bool()
    hypothesis = token_type_ids.bool()
    return ~(real & ~hypothesis), ~(real & hypothesis)


def build_encoder(config: PretrainedConfig) -> PreTrainedModel:
    """The encoder for `config` (`AutoModel`), without its pooling layer where its class has one: no head reads it."""
    # MODEL_MAPPING maps a config class to its model class; transformers annotates the values of its lazy mappings as
    # the tokenizer mappings' (slow, fast) pairs
    parameters = inspect.signature(MODEL_MAPPING[type(config)].__init__).parameters  # type: ignore[misc]
    return AutoModel.from_config(config, **({"add_pooling_layer": False} if "add_pooling_layer" in parameters else {}))


def variational_dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """The original's DropoutWrapper on a (B, L, H) sequence: one mask per example and feature, shared over L."""
    if not training or p == 0:
        return x
    keep = torch.bernoulli(x.new_full((x.size(0), 1, x.size(2)), 1 - p))
    return x * keep / (1 - p)


class MTDNNLinearHead(nn.Module):
    """The original's `nn.Sequential(Pooler, Linear)`: dropout on the [CLS] vector, dense (no activation), linear."""

    def __init__(self, hidden_size, num_labels, dropout):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.out_proj = nn.Linear(hidden_size, num_labels)

    def forward(self, sequence_output: torch.Tensor) -> torch.Tensor:
        return self.out_proj(self.dense(self.dropout(sequence_output[:, 0])))


class MTDNNTokenHead(nn.Module):
    """The original's token-level head (SeqenceLabeling, SpanClassification): dropout, then a linear layer, on every
    token."""

    def __init__(self, hidden_size, num_labels, dropout):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.out_proj = nn.Linear(hidden_size, num_labels)

    def forward(self, sequence_output: torch.Tensor) -> torch.Tensor:
        return self.out_proj(self.dropout(sequence_output))


class MTDNNSANHead(nn.Module):
    """The original's SANClassifier (`answer` options, `mem_cum_type=simple`, bilinear attention)."""

    def __init__(self, hidden_size, num_labels, dropout, san):
        super().__init__()
        self.dropout = dropout
        self.num_turns = san["num_turns"]
        self.memory_type = san["memory_type"]
        self.memory_dropout = san["memory_dropout"]
        self.merge_opt = san["merge_opt"]
        self.hypothesis_attn = nn.Linear(hidden_size, 1)  # LinearSelfAttn: the initial state
        self.premise_attn = nn.Linear(hidden_size, hidden_size)  # BilinearFlatSim: x . (W h + b)
        self.rnn = RNN_CELLS[san["rnn_type"]](hidden_size, hidden_size)
        self.classifier = nn.Linear(hidden_size * (4 if self.merge_opt == 1 else 2), num_labels)

    def forward(self, sequence_output: torch.Tensor, premise_mask: torch.Tensor, hypothesis_mask: torch.Tensor,
                output_states: bool = False) -> tuple[torch.Tensor, MTDNNSANStates | None]:
        x, p, training = sequence_output, self.dropout, self.training
        memory = variational_dropout(x, p, training)
        scores = self.hypothesis_attn(memory).squeeze(-1).masked_fill(hypothesis_mask, -math.inf)
        h = torch.bmm(F.softmax(scores, 1).unsqueeze(1), memory).squeeze(1)
        initial_state = h
        c = torch.zeros_like(h) if isinstance(self.rnn, nn.LSTMCell) else None
        states, attention_scores, summaries, rnn_outputs, turn_logits = [], [], [], [], []
        for _ in range(self.num_turns):
            keys = variational_dropout(x, p, training)
            query = self.premise_attn(F.dropout(h, p, training))
            att = torch.bmm(keys, query.unsqueeze(2)).squeeze(2).masked_fill(premise_mask, -math.inf)
            x_sum = torch.bmm(F.softmax(att, 1).unsqueeze(1), x).squeeze(1)
            merged = torch.cat([x_sum, h, (x_sum - h).abs(), x_sum * h] if self.merge_opt == 1 else [x_sum, h], 1)
            turn_logits.append(self.classifier(F.dropout(merged, p, training)))
            states.append(h)
            attention_scores.append(att)
            summaries.append(x_sum)
            h_in = F.dropout(h, p, training)
            if c is None:
                h = self.rnn(x_sum, h_in)
            else:
                h, c = self.rnn(x_sum, (h_in, c))
            rnn_outputs.append(h)
        logits = self._combine_turns(torch.stack(turn_logits, 1))
        san_states = None
        if output_states:
            san_states = MTDNNSANStates(
                initial_state=initial_state, attention_scores=torch.stack(attention_scores),
                premise_summaries=torch.stack(summaries), states=torch.stack(states),
                rnn_outputs=torch.stack(rnn_outputs), turn_logits=torch.stack(turn_logits))
        return logits, san_states

    def _combine_turns(self, turn_logits):
        """(B, T, C) turn logits -> the head's output: the last turn's logits (memory_type 0), or the log of the mean
        over all T turns of the probabilities, whole turns dropped at random per example in training (one turn
        always kept; the mean still divides by T)."""
        if self.memory_type == 0:
            return turn_logits[:, -1]
        probs = F.softmax(turn_logits, -1)
        p = self.memory_dropout if self.training else 0.0
        if p > 0:
            batch, turns = turn_logits.shape[:2]
            keep = torch.bernoulli(turn_logits.new_full((batch, turns), 1 - p))
            keep[torch.arange(batch, device=keep.device), torch.randint(turns, (batch,), device=keep.device)] = 1
            probs = probs * (keep / (1 - p)).unsqueeze(-1)
        return probs.mean(1).log()


IGNORE_INDEX = -100  # label of tokens no loss reads (padding, continuation pieces), as transformers' token heads


def task_loss(task: dict[str, Any], logits: torch.Tensor, labels: torch.Tensor, group_size: int | None,
              ) -> torch.Tensor:
    """The original's loss for the task's type: CeCriterion, MseCriterion, RankCeCriterion (over groups of K),
    SeqCeCriterion (over the labelled tokens; `IGNORE_INDEX` marks the others, where the original's -1 did) or
    SpanCeCriterion (half the sum of the start and end cross-entropies; `labels` hold `(start, end)` per row)."""
    if task["type"] == "sequence_labeling":
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1), ignore_index=IGNORE_INDEX)
    if task["type"] in SPAN_TASK_TYPES:
        if labels.dim() != 2 or labels.size(-1) != 2:
            raise ValueError(f"span task {task['name']}: labels must be (start, end) token positions of shape (B, 2), "
                             f"got {tuple(labels.shape)}")
        if ((labels < 0) | (labels >= logits.size(1))).any():
            raise ValueError(f"span task {task['name']}: an answer position lies outside the {logits.size(1)} tokens "
                             "of its row")
        starts, ends = logits.unbind(-1)
        return 0.5 * (F.cross_entropy(starts, labels[:, 0]) + F.cross_entropy(ends, labels[:, 1]))
    if task["type"] == "regression":
        return F.mse_loss(logits.view(-1), labels.view(-1).to(logits.dtype))
    if task["type"] == "ranking":
        assert group_size is not None  # MTDNNModel.forward passes the task's when the batch gives none
        groups = logits.view(-1, group_size)
        # one label per row (the group's, repeated, as the original's collater builds them) or one per group
        targets = labels.view(-1, group_size)[:, 0] if labels.numel() == logits.size(0) else labels.view(-1)
        return F.cross_entropy(groups, targets)
    return F.cross_entropy(logits, labels.view(-1))


def build_head(task: dict[str, Any], hidden_size: int) -> nn.Module:
    """The head of one task (a task of `MTDNNConfig.tasks`)."""
    if task["head"] == "san":
        return MTDNNSANHead(hidden_size, task["num_labels"], task["dropout"], task["san"])
    if task["type"] in TOKEN_TASK_TYPES:
        return MTDNNTokenHead(hidden_size, task["num_labels"], task["dropout"])
    return MTDNNLinearHead(hidden_size, task["num_labels"], task["dropout"])


# Copied from hf_ext.models.optimus.modeling_optimus.no_split_modules_outside_input_embeddings
def no_split_modules_outside_input_embeddings(model: PreTrainedModel) -> set[str]:
    """`model._no_split_modules` (its backbones', which `post_init` collects) less the classes of the modules that hold
    its input embeddings, such as BERT's `BertEmbeddings` or RoBERTa's `RobertaEmbeddings`. accelerate's FSDP2 plan
    (`fsdp2_prepare_model`) makes each no-split module an FSDP unit, then the input embeddings a unit of their own:
    inside a no-split unit they would be sharded a second time, which FSDP2 cannot do."""
    embeddings = model.get_input_embeddings()
    path = next(name for name, module in model.named_modules() if module is embeddings).split(".")
    holders = {type(model.get_submodule(".".join(path[:depth]))).__name__ for depth in range(1, len(path))}
    return set(model._no_split_modules or ()) - holders


class MTDNNPreTrainedModel(PreTrainedModel):
    config: MTDNNConfig
    base_model_prefix = "bert"  # an encoder's checkpoint loads into the encoder, the heads start fresh
    main_input_name = "input_ids"
    supports_gradient_checkpointing = True
    # the attention implementation and the modules not to split are the encoder's own (post_init collects the latter,
    # less its embedding module: no_split_modules_outside_input_embeddings)
    _supports_sdpa = True
    _supports_attention_backend = True
    # Trainer: the loss is a batch mean, not normalised across gradient-accumulation steps.
    accepts_loss_kwargs = False

    # Copied from hf_ext.models.optimus.modeling_optimus.OptimusPreTrainedModel.post_init
    def post_init(self) -> None:
        super().post_init()
        # the backbones' no-split modules, which super().post_init() collects, less those that hold the input embeddings
        self._no_split_modules = no_split_modules_outside_input_embeddings(self)

    @torch.no_grad()
    def _init_weights(self, module):
        if isinstance(module, nn.RNNCellBase):  # torch's own initialisation of recurrent cells
            bound = 1 / math.sqrt(module.hidden_size)
            for weight in module.parameters():
                init.uniform_(weight, -bound, bound)
        else:
            self._init_linear_weights(module)

    # Copied from hf_ext.models.optimus.modeling_optimus.OptimusPreTrainedModel._init_weights with _init_weights->_init_linear_weights, decoder->encoder  # noqa: E501
    @torch.no_grad()
    def _init_linear_weights(self, module):
        if isinstance(module, nn.Linear):
            init.normal_(module.weight, mean=0.0, std=self.config.encoder.initializer_range)
            if module.bias is not None:
                init.zeros_(module.bias)


class MTDNNModel(MTDNNPreTrainedModel):
    """The multi-task model: `forward(..., task=...)` runs the encoder and that task's head.

    Batches hold one task each, as in the original's training (the `task` of a batch may be a name, an index, or a
    tensor/list of identical ids, e.g. a dataset column collated by Trainer with `remove_unused_columns=False`).
    """

    def __init__(self, config: MTDNNConfig):
        super().__init__(config)
        if not config.tasks:
            raise ValueError("the MTDNNConfig has no tasks")
        hidden = config.encoder.hidden_size
        self.bert = build_encoder(config.encoder)
        forward = inspect.signature(self.bert.forward).parameters
        # segment ids reach the encoder where it has segment embeddings (BERT, ELECTRA, ALBERT); SAN masks read them
        self.encoder_reads_segments = "token_type_ids" in forward and getattr(config.encoder, "type_vocab_size", 0) > 1
        self.heads = nn.ModuleDict({task["name"]: build_head(task, hidden) for task in config.tasks})
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        return self.bert.get_input_embeddings()

    def save_pretrained(self, save_directory: Any, *args: Any, **kwargs: Any) -> None:
        """`PreTrainedModel.save_pretrained`, and where the config names MT-DNN's pipeline in `custom_pipelines` (a
        model loaded from a folder hf-ext wrote), the pipeline's code beside the model's, so that the new folder runs
        it as remote code too."""
        super().save_pretrained(save_directory, *args, **kwargs)
        if getattr(self.config, "custom_pipelines", None):
            from transformers.dynamic_module_utils import custom_object_save

            from .pipeline_mtdnn import MTDNNPipeline

            custom_object_save(MTDNNPipeline, str(save_directory))

    def set_input_embeddings(self, value: nn.Module) -> None:
        self.bert.set_input_embeddings(value)

    @classmethod
    def from_pretrained_encoder(cls, encoder: str | PreTrainedModel, config: MTDNNConfig, **kwargs: Any,
                                ) -> "MTDNNModel":
        """A new model for `config` whose encoder starts from a pretrained encoder (a folder or Hub id, loaded with
        `AutoModel.from_pretrained(encoder, **kwargs)`, or a loaded model) and whose heads start fresh. The
        encoder's type and sizes must be `config.encoder`'s (`ValueError` otherwise); its pooler, which no head reads,
        is left out."""
        pretrained = encoder if isinstance(encoder, PreTrainedModel) else AutoModel.from_pretrained(encoder, **kwargs)
        if pretrained.config.model_type != config.encoder.model_type:
            raise ValueError(f"the pretrained encoder is of type {pretrained.config.model_type}, the config's encoder "
                             f"of type {config.encoder.model_type}")
        model = cls(config)
        misfit = f"the pretrained {pretrained.config.model_type} encoder does not fit the config's encoder"
        try:
            missing, unexpected = model.bert.load_state_dict(pretrained.state_dict(), strict=False)
        except RuntimeError as error:  # weights of other shapes
            raise ValueError(f"{misfit}: {str(error).splitlines()[-1].strip()}") from None
        unexpected = [key for key in unexpected if not key.startswith("pooler.")]
        if missing or unexpected:
            raise ValueError(f"{misfit}: missing {missing[:3]}, unexpected {unexpected[:3]}")
        return model

    def encode(self, input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
               token_type_ids: torch.Tensor | None = None, position_ids: torch.Tensor | None = None,
               inputs_embeds: torch.Tensor | None = None, **kwargs: Any) -> BaseModelOutput:
        """The encoder's output; `token_type_ids` reach it only where it has segment embeddings."""
        if self.encoder_reads_segments:
            kwargs["token_type_ids"] = token_type_ids
        if position_ids is not None:
            kwargs["position_ids"] = position_ids
        return self.bert(input_ids=input_ids, attention_mask=attention_mask, inputs_embeds=inputs_embeds,
                         return_dict=True, **kwargs)

    def resolve_task(self, task: str | int | torch.Tensor | Sequence[str | int] | None) -> dict[str, Any]:
        """A batch's task (name, index, or a tensor/list of one repeated id or name) -> the task's settings."""
        if task is None:
            if self.config.default_task is None and len(self.config.tasks) > 1:
                raise ValueError(f"pass task= (one of {', '.join(self.config.task_names)})")
            task = self.config.default_task or 0
        chosen: Any = task  # unwrapped below to one name or index, which `MTDNNConfig.task_index` checks
        if isinstance(chosen, torch.Tensor):
            chosen = chosen.unique().tolist() if chosen.dim() else chosen.item()
        if isinstance(chosen, (list, tuple)):
            if len(set(chosen)) != 1:
                raise ValueError(f"a batch holds one task, this one mixes tasks {sorted(set(chosen))}")
            chosen = chosen[0]
        return self.config.task(chosen)

    def head_logits(self, task: str | int, sequence_output: torch.Tensor, token_type_ids: torch.Tensor,
                    attention_mask: torch.Tensor, premise_mask: torch.Tensor | None = None,
                    hypothesis_mask: torch.Tensor | None = None, output_san_states: bool = False,
                    ) -> tuple[torch.Tensor, MTDNNSANStates | None]:
        """The logits of one task's head on the encoder's output (a SAN head derives its premise and hypothesis
        masks from the segment ids and the attention mask when they are not given) and a SAN head's states."""
        spec = self.config.task(task)
        head = self.heads[spec["name"]]
        if spec["head"] != "san":
            return head(sequence_output), None
        derived = premise_hypothesis_masks(token_type_ids, attention_mask)
        premise_mask = derived[0] if premise_mask is None else premise_mask
        hypothesis_mask = derived[1] if hypothesis_mask is None else hypothesis_mask
        if not torch.compiler.is_compiling():  # a check on the data, which a compiled or exported graph cannot hold
            empty = premise_mask.all(1) | hypothesis_mask.all(1)
            if empty.any():
                raise ValueError(f"task {spec['name']} (SAN head) reads sentence pairs, but row "
                                 f"{empty.nonzero()[0].item()} has no premise or no hypothesis token (check "
                                 "token_type_ids, attention_mask and the premise/hypothesis masks)")
        return head(sequence_output, premise_mask, hypothesis_mask, output_states=output_san_states)

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        task: str | int | torch.Tensor | None = None,
        premise_mask: torch.Tensor | None = None,
        hypothesis_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        group_size: int | None = None,
        output_san_states: bool = False,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        **kwargs: Any,
    ) -> MTDNNOutput:
        r"""
        task (`str`, `int` or `torch.Tensor`): the batch's task, by name or index (see `resolve_task`).
        premise_mask, hypothesis_mask (`torch.BoolTensor` of shape `(batch_size, sequence_length)`, *optional*): the
            SAN head's masks, True = excluded, as the original's collater passes them. Built from `token_type_ids` and
            `attention_mask` when not given. Other heads ignore them.
        labels (`torch.Tensor`, *optional*): class ids `(B,)`, regression targets `(B,)`, for ranking the index of
            the positive candidate, one per row (`(B*K,)`, the original's layout) or one per group (`(B,)`), for
            sequence labeling tag ids `(B, L)` (-100 on tokens without a tag), for span tasks the answer's start and
            end token `(B, 2)` (the first token for no answer).
        group_size (`int`, *optional*): candidates per ranking group; the task's `group_size` when unset.
        output_san_states (`bool`): also return a SAN head's intermediate states.
        output_attentions, output_hidden_states (`bool`, *optional*): the encoder's; this model's config when unset
            (the encoder reads its own sub-config otherwise).
        """
        kwargs.pop("num_items_in_batch", None)
        spec = self.resolve_task(task)
        if input_ids is not None:
            shape = input_ids.shape[:2]
        elif inputs_embeds is not None:
            shape = inputs_embeds.shape[:2]
        else:
            raise ValueError("give input_ids or inputs_embeds")
        if attention_mask is None:
            attention_mask = torch.ones(shape, dtype=torch.long, device=self.device)
        if token_type_ids is None:
            token_type_ids = torch.zeros(shape, dtype=torch.long, device=self.device)
        for name, mask in (("premise_mask", premise_mask), ("hypothesis_mask", hypothesis_mask)):
            if mask is not None and (mask.shape != shape or mask.dtype != torch.bool):
                raise ValueError(f"{name} must be a bool tensor (True = excluded) of the input's shape {tuple(shape)}, "
                                 f"got {mask.dtype} {tuple(mask.shape)}")
        encoder_outputs = self.encode(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                                      position_ids=position_ids, inputs_embeds=inputs_embeds,
                                      output_attentions=(self.config.output_attentions if output_attentions is None
                                                         else output_attentions),
                                      output_hidden_states=(self.config.output_hidden_states
                                                            if output_hidden_states is None else output_hidden_states),
                                      **kwargs)
        sequence_output = encoder_outputs.last_hidden_state
        assert sequence_output is not None  # an encoder's output always holds it
        logits, san_states = self.head_logits(spec["name"], sequence_output, token_type_ids, attention_mask,
                                              premise_mask, hypothesis_mask, output_san_states)
        group_logits = start_logits = end_logits = None
        if spec["type"] in SPAN_TASK_TYPES:
            start_logits, end_logits = logits.unbind(-1)
        if spec["type"] == "ranking":
            group_size = group_size or spec["group_size"]
            if logits.size(0) % group_size:
                raise ValueError(f"ranking task {spec['name']}: {logits.size(0)} rows do not form groups of "
                                 f"{group_size} candidates")
            group_logits = logits.view(-1, group_size)
        loss = task_loss(spec, logits, labels, group_size) if labels is not None else None
        return MTDNNOutput(loss=loss, logits=logits, group_logits=group_logits, start_logits=start_logits,
                           end_logits=end_logits, hidden_states=encoder_outputs.hidden_states,
                           attentions=encoder_outputs.attentions, san_states=san_states)


def single_task(config: MTDNNConfig, task_types: tuple[str, ...], what: str) -> str:
    """The task a single-task class exposes: `config.default_task`, which must be of one of `task_types`, or else the
    first task of those types; `ValueError` with one line where there is none."""
    if config.default_task is not None:
        spec = config.task(config.default_task)
        if spec["type"] not in task_types:
            raise ValueError(f"task {spec['name']} is a {spec['type']} task, not a {what} task (load with "
                             f"default_task= one of the model's {' or '.join(task_types)} tasks)")
        return spec["name"]
    for spec in config.tasks:
        if spec["type"] in task_types:
            return spec["name"]
    described = ", ".join(f"{spec['name']} ({spec['type']})" for spec in config.tasks)
    raise ValueError(f"the model has no {what} task (its tasks: {described})")


class MTDNNForSequenceClassification(MTDNNModel):
    """One task of an MT-DNN model as a plain sequence classifier (pipelines, single-task fine-tuning).

    The task is `config.default_task` (the first sentence-level task when unset), chosen at load time with
    `from_pretrained(path, default_task="mnli")`. Every head stays in the model, so a fine-tuned copy still loads as
    the multi-task `MTDNNModel`. `config.id2label` and `config.problem_type` follow the chosen task: a classification
    task is single-label, or multi-label where `config.problem_type` asks for it (linear heads only: a SAN head
    outputs one softmax over the labels); regression and ranking tasks are regression (ranking rows get raw scores).
    The loss is transformers' for the problem type, as the original's for single-label and regression; ranking
    keeps the original's cross-entropy over each group of candidates.
    """

    def __init__(self, config: MTDNNConfig):
        super().__init__(config)
        spec = config.task(single_task(config, SENTENCE_TASK_TYPES, "sequence classification"))
        self.task = spec["name"]
        # the pipeline reads label names and the output function from the config
        labels = spec["labels"] if spec["type"] == "classification" and spec["labels"] else \
            [f"LABEL_{i}" for i in range(spec["num_labels"])]
        config.id2label = dict(enumerate(labels))
        config.label2id = {label: i for i, label in enumerate(labels)}
        if spec["type"] != "classification":
            config.problem_type = "regression"
        elif config.problem_type != "multi_label_classification":
            config.problem_type = "single_label_classification"
        elif spec["head"] == "san":
            raise ValueError(f"task {spec['name']} has a SAN head, whose output is one softmax over the labels: "
                             "multi_label_classification needs a linear head")

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        premise_mask: torch.Tensor | None = None,
        hypothesis_mask: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> SequenceClassifierOutput:
        ranking = self.config.task(self.task)["type"] == "ranking"
        outputs = super().forward(input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask,
                                  task=self.task, premise_mask=premise_mask, hypothesis_mask=hypothesis_mask,
                                  labels=labels if ranking else None, position_ids=position_ids,
                                  inputs_embeds=inputs_embeds, return_dict=True, **kwargs)
        loss = outputs.loss
        if labels is not None and not ranking:
            loss = self.loss_function(labels=labels, pooled_logits=outputs.logits, config=self.config)
        return SequenceClassifierOutput(loss=loss, logits=outputs.logits, hidden_states=outputs.hidden_states,
                                        attentions=outputs.attentions)


class MTDNNForTokenClassification(MTDNNModel):
    """One sequence-labeling task of an MT-DNN model as a token classifier (`pipeline("token-classification")`,
    single-task fine-tuning): `config.default_task`, or the first sequence-labeling task when unset. Every head stays
    in the model; `config.id2label` holds the task's tags."""

    def __init__(self, config: MTDNNConfig):
        super().__init__(config)
        self.task = single_task(config, ("sequence_labeling",), "sequence labeling")
        labels = config.task(self.task)["labels"]
        config.id2label = dict(enumerate(labels))
        config.label2id = {label: i for i, label in enumerate(labels)}

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> TokenClassifierOutput:
        outputs = super().forward(input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask,
                                  task=self.task, labels=labels, position_ids=position_ids,
                                  inputs_embeds=inputs_embeds, return_dict=True, **kwargs)
        return TokenClassifierOutput(loss=outputs.loss, logits=outputs.logits, hidden_states=outputs.hidden_states,
                                     attentions=outputs.attentions)


class MTDNNForQuestionAnswering(MTDNNModel):
    """One span task of an MT-DNN model as an extractive question-answering model (`pipeline("question-answering")`,
    single-task fine-tuning): `config.default_task`, or the first span task when unset."""

    def __init__(self, config: MTDNNConfig):
        super().__init__(config)
        self.task = single_task(config, SPAN_TASK_TYPES, "span")

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        start_positions: torch.Tensor | None = None,
        end_positions: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> QuestionAnsweringModelOutput:
        r"""
        start_positions, end_positions (`torch.LongTensor` of shape `(batch_size,)`, *optional*): the answer's first
            and last token (the first token of the row where there is no answer); the loss is the task's.
        """
        if (start_positions is None) != (end_positions is None):
            raise ValueError("give both start_positions and end_positions, or neither")
        labels = None
        if start_positions is not None and end_positions is not None:
            labels = torch.stack([start_positions.view(-1), end_positions.view(-1)], -1)
        outputs = super().forward(input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask,
                                  task=self.task, labels=labels, position_ids=position_ids,
                                  inputs_embeds=inputs_embeds, return_dict=True, **kwargs)
        return QuestionAnsweringModelOutput(loss=outputs.loss, start_logits=outputs.start_logits,
                                            end_logits=outputs.end_logits, hidden_states=outputs.hidden_states,
                                            attentions=outputs.attentions)


__all__ = ["MTDNNModel", "MTDNNForSequenceClassification", "MTDNNForTokenClassification", "MTDNNForQuestionAnswering",
           "MTDNNPreTrainedModel", "MTDNNOutput", "MTDNNSANStates", "MTDNNLinearHead", "MTDNNSANHead", "MTDNNTokenHead",
           "build_head", "premise_hypothesis_masks", "single_task", "task_loss"]
