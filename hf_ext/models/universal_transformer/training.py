"""Training and evaluating the Universal Transformer on the paper's algorithmic tasks (Dehghani et al., ICLR 2019,
section 3.3): copy, reverse and addition over decimal digits as `datasets` generators, a `Trainer` that logs the
ponder cost, a same-size vanilla Transformer baseline, char- and sequence-accuracy of greedy `generate()` at lengths
longer than training (length generalisation) and LoRA. The halting map is drawn by `halting_map.py`.

The tasks follow tensor2tensor's `algorithmic_{identity,reverse,addition}_decimal40` (`data_generators/algorithmic.py`):
symbols shifted by two reserved ids (0 padding, 1 end of sequence), an end-of-sequence id appended to inputs and
targets, addition over lower-endian numbers (least significant digit first) separated by a `+` symbol.
"""

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from transformers import (
    DataCollatorForSeq2Seq,
    GenerationMixin,
    M2M100ForConditionalGeneration,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    TrainerCallback,
    TrainingArguments,
)
from transformers.utils import ModelOutput

from ...trainer import TermLoggingTrainer, send_logs_to_stderr, training_arguments
from . import UniversalTransformerConfig

if TYPE_CHECKING:  # datasets and peft are imported only when used
    from datasets import Dataset
    from peft import PeftModel

TASKS = ("copy", "reverse", "addition")
PAD_TOKEN = "<pad>"
EOS_TOKEN = "</s>"
PLUS = "+"
DIGITS = "0123456789"
# tensor2tensor's reserved ids first (0 padding, 1 end of sequence), then the digits, then addition's separator
SYMBOLS = (PAD_TOKEN, EOS_TOKEN, *DIGITS, PLUS)
SYMBOL_IDS = {symbol: index for index, symbol in enumerate(SYMBOLS)}
PAD_ID = SYMBOL_IDS[PAD_TOKEN]
EOS_ID = SYMBOL_IDS[EOS_TOKEN]

# ----- data ---------------------------------------------------------------------------------------------------------

def algorithmic_tokenizer() -> PreTrainedTokenizerFast:
    """A character-level `PreTrainedTokenizerFast` over `SYMBOLS` that appends the end-of-sequence id, as
    tensor2tensor's algorithmic problems do; it saves and loads with the model folder."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.WordLevel(SYMBOL_IDS, unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tokenizer.post_processor = processors.TemplateProcessing(single=f"$A {EOS_TOKEN}",
                                                             special_tokens=[(EOS_TOKEN, EOS_ID)])
    tokenizer.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token=PAD_TOKEN, eos_token=EOS_TOKEN)


def _random_number(rng, length):
    """A random number as `length` lower-endian digits; only a one-digit number may be 0 (tensor2tensor)."""
    digits = rng.integers(0, 10, size=length)
    if length > 1:
        digits[-1] = rng.integers(1, 10)
    return "".join(DIGITS[d] for d in digits)


def _lower_endian(number):
    return str(number)[::-1]


def algorithmic_examples(task: str, num_examples: int, min_length: int, max_length: int, seed: int,
                         ) -> Iterator[dict[str, Any]]:
    """Yield `num_examples` rows of `task` with input lengths drawn uniformly from [min_length, max_length] by a
    numpy generator seeded with `seed`. Each row holds the `inputs` and `targets` strings, their ids `input_ids` and
    `labels` (end-of-sequence id appended) and the input's `length` in characters."""
    rng = np.random.default_rng(seed)
    for _ in range(num_examples):
        length = int(rng.integers(min_length, max_length + 1))
        if task == "addition":
            first = int(rng.integers(1, length - 1))  # both numbers get at least one digit around the `+`
            a, b = _random_number(rng, first), _random_number(rng, length - 1 - first)
            inputs = f"{a}{PLUS}{b}"
            targets = _lower_endian(int(a[::-1]) + int(b[::-1]))
        else:
            inputs = "".join(DIGITS[d] for d in rng.integers(0, 10, size=length))
            targets = inputs if task == "copy" else inputs[::-1]
        yield {"inputs": inputs, "targets": targets, "input_ids": [SYMBOL_IDS[c] for c in inputs] + [EOS_ID],
               "labels": [SYMBOL_IDS[c] for c in targets] + [EOS_ID], "length": length}


def algorithmic_dataset(task: str, num_examples: int, min_length: int = 1, max_length: int = 40, seed: int = 0,
                        ) -> "Dataset":
    """A `datasets.Dataset` of `algorithmic_examples` (`Dataset.from_generator`, kept in memory).

    Lengths are input lengths: the number of digits for copy and reverse, of digits plus the `+` for addition (which
    needs at least 3). tensor2tensor draws lengths in [1, 40] for training and [1, 400] for its dev set; the paper's
    length generalisation trains on lengths up to 40 and tests on 400. Addition splits the length at a uniform point
    (tensor2tensor draws the first number's length up to half the maximum first)."""
    from datasets import Dataset, Features, Sequence, Value

    if task not in TASKS:
        raise ValueError(f"task must be one of {', '.join(TASKS)}, got {task!r}")
    smallest = 3 if task == "addition" else 1
    for name, value in (("num_examples", num_examples), ("min_length", min_length), ("max_length", max_length)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if min_length < smallest or max_length < min_length:
        raise ValueError(f"{task} needs {smallest} <= min_length <= max_length, got {min_length} and {max_length}")
    features = Features({"inputs": Value("string"), "targets": Value("string"),
                         "input_ids": Sequence(Value("int32")), "labels": Sequence(Value("int32")),
                         "length": Value("int32")})
    return Dataset.from_generator(algorithmic_examples, features=features, keep_in_memory=True,
                                  gen_kwargs={"task": task, "num_examples": num_examples, "min_length": min_length,
                                              "max_length": max_length, "seed": seed})


# ----- models -------------------------------------------------------------------------------------------------------

def algorithmic_config(hidden_size: int = 64, num_attention_heads: int = 4, intermediate_size: int = 256,
                       act_max_steps: int = 6, dropout: float = 0.1, **overrides: Any) -> UniversalTransformerConfig:
    """A small `UniversalTransformerConfig` over the algorithmic vocabulary, with ACT (the paper's setting) and one
    dropout rate for the inputs, sublayers, attention weights and transition. Label smoothing is off, as in the
    baseline's loss."""
    values = dict(vocab_size=len(SYMBOLS), hidden_size=hidden_size, num_attention_heads=num_attention_heads,
                  intermediate_size=intermediate_size, num_steps=act_max_steps, act_max_steps=act_max_steps,
                  hidden_dropout_prob=dropout, input_dropout=dropout, attention_dropout=dropout, relu_dropout=dropout,
                  label_smoothing=0.0, pad_token_id=PAD_ID, eos_token_id=EOS_ID, decoder_start_token_id=PAD_ID)
    values.update(overrides)
    return UniversalTransformerConfig(**values)


def vanilla_transformer(config: UniversalTransformerConfig, num_layers: int | None = None,
                        ) -> M2M100ForConditionalGeneration:
    """The same-size vanilla Transformer baseline of a Universal Transformer `config`: transformers' M2M100 (the
    fairseq Transformer: pre-norm layers with a final norm, sinusoidal positions added once to embeddings scaled by
    sqrt(width), embeddings shared by encoder, decoder and softmax, as tensor2tensor's `transformer_base`) with the
    same width, heads, inner size, activation and dropouts, and `num_layers` separate layers per side (default: the
    Universal Transformer's most steps, `act_max_steps` with ACT, else `num_steps`). The Universal Transformer applies
    one shared layer per side that many times at most; the baseline has that many layers' weights.

    Differences that stay: biases in the attention projections, no halting, the decoder starts from the
    end-of-sequence id (fairseq's convention) and positions count from 2 (fairseq's padding offset)."""
    from transformers import M2M100Config, M2M100ForConditionalGeneration

    if config.attention_key_depth != config.hidden_size or config.attention_value_depth != config.hidden_size:
        raise ValueError("the vanilla Transformer baseline needs attention key and value depths equal to hidden_size")
    layers = num_layers or config.num_step_signals
    baseline = M2M100Config(
        vocab_size=config.vocab_size, d_model=config.hidden_size, encoder_layers=layers, decoder_layers=layers,
        encoder_attention_heads=config.num_attention_heads, decoder_attention_heads=config.num_attention_heads,
        encoder_ffn_dim=config.intermediate_size, decoder_ffn_dim=config.intermediate_size,
        activation_function="relu", dropout=config.hidden_dropout_prob, attention_dropout=config.attention_dropout,
        activation_dropout=config.relu_dropout, encoder_layerdrop=0.0, decoder_layerdrop=0.0, scale_embedding=True,
        pad_token_id=config.pad_token_id, eos_token_id=config.eos_token_id, bos_token_id=config.eos_token_id,
        decoder_start_token_id=config.eos_token_id, tie_word_embeddings=True, max_position_embeddings=64)
    return M2M100ForConditionalGeneration(baseline)


def count_parameters(model: torch.nn.Module) -> int:
    """Distinct trainable parameters (tied weights counted once)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


# ----- training -----------------------------------------------------------------------------------------------------

class UniversalTransformerTrainer(TermLoggingTrainer):
    """`Trainer` that also logs the ACT ponder cost: `ponder_cost` (the sum of both sides' for a seq2seq model),
    `encoder_ponder_cost` and `decoder_ponder_cost`, each the mean over the logging window and the processes
    (`eval_*`: the mean over evaluation batches). Models without ACT (the baseline) log nothing extra."""

    LOGGED_TERMS = ("ponder_cost", "encoder_ponder_cost", "decoder_ponder_cost")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, logged_terms=self.LOGGED_TERMS, **kwargs)

    def compute_loss(self, model: torch.nn.Module, inputs: dict[str, torch.Tensor], return_outputs: bool = False,
                     num_items_in_batch: torch.Tensor | int | None = None,
                     ) -> torch.Tensor | tuple[torch.Tensor, ModelOutput]:
        outputs = model(**inputs)
        for name in self.LOGGED_TERMS:
            if outputs.get(name) is not None:
                self.record_term(model, name, outputs[name])
        return (outputs.loss, outputs) if return_outputs else outputs.loss


class PositionOffsetCollator:
    """Seq2seq collator that shifts every training example to start at a random position, so that positions beyond
    the training length are seen in training (the paper trains its Universal Transformers for the algorithmic tasks
    with positions starting at randomized offsets, section 3.3; tensor2tensor's `position_start_index="random"`).

    The shift is left padding: the Universal Transformer adds the position signal by slot index and masks padding
    out of attention and ACT, so `k` pads in front put the example at positions `k, k+1, ...`. Encoder and decoder
    each draw an offset per example, uniformly from `[0, max_offset)`. tensor2tensor instead draws one offset per
    batch from `[0, batch length)` anew at every recurrent step, in evaluation too; that needs the model to take a
    position offset, which it does not."""

    def __init__(self, max_offset: int, seed: int = 0, pad_token_id: int = PAD_ID,
                 decoder_start_token_id: int = PAD_ID):
        if max_offset < 1:
            raise ValueError(f"max_offset must be at least 1, got {max_offset}")
        self.max_offset = max_offset
        self.pad_token_id = pad_token_id
        self.decoder_start_token_id = decoder_start_token_id
        self.rng = np.random.default_rng(seed)

    def __call__(self, features: list[dict]) -> dict[str, torch.Tensor]:
        names = ("input_ids", "attention_mask", "decoder_input_ids", "decoder_attention_mask", "labels")
        rows: dict[str, list[list[int]]] = {name: [] for name in names}
        for feature in features:
            inputs, labels = list(feature["input_ids"]), list(feature["labels"])
            encoder_offset, decoder_offset = (int(k) for k in self.rng.integers(0, self.max_offset, size=2))
            rows["input_ids"].append([self.pad_token_id] * encoder_offset + inputs)
            rows["attention_mask"].append([0] * encoder_offset + [1] * len(inputs))
            rows["decoder_input_ids"].append([self.pad_token_id] * decoder_offset + [self.decoder_start_token_id]
                                             + labels[:-1])
            rows["decoder_attention_mask"].append([0] * decoder_offset + [1] * len(labels))
            rows["labels"].append([-100] * decoder_offset + labels)
        padding = {"input_ids": self.pad_token_id, "decoder_input_ids": self.pad_token_id, "labels": -100}
        return {name: torch.nn.utils.rnn.pad_sequence([torch.as_tensor(row) for row in values], batch_first=True,
                                                      padding_value=padding.get(name, 0))
                for name, values in rows.items()}


def train_algorithmic(model: "PreTrainedModel | PeftModel", train_dataset: "Dataset",
                      output_dir: str | Path | None = None, max_steps: int | None = None, batch_size: int = 32,
                      learning_rate: float = 1e-3, warmup_steps: int | None = None, logging_steps: int = 50,
                      seed: int = 0,
                      callbacks: Iterable[TrainerCallback] = (), log_to_stderr: bool = False,
                      position_offsets: int = 0, args: TrainingArguments | None = None,
                      **training_kwargs: Any) -> UniversalTransformerTrainer:
    """Train a seq2seq model (`UniversalTransformerForSeq2SeqLM`, the baseline, or a PEFT wrapper) on an
    `algorithmic_dataset` with `UniversalTransformerTrainer` (AdamW, linear warm-up over `warmup_steps`, default a
    tenth of the run, then linear decay). `output_dir` is the Trainer's working folder; the trained model stays in
    memory. `args` are the `TrainingArguments`; without them they are built (`hf_ext.trainer.training_arguments`)
    from `output_dir`, `max_steps`, the other settings here and any `TrainingArguments` field in `training_kwargs`.
    `log_to_stderr` writes the logs as JSON lines on stderr instead of stdout. `position_offsets` > 0 starts every
    training example at a random position below it (`PositionOffsetCollator`; Universal Transformers only). Returns
    the trainer."""
    if args is None:
        if output_dir is None:
            raise TypeError("give output_dir (the Trainer's working folder) or args")
        if warmup_steps is None:
            if max_steps is None:
                raise TypeError("give max_steps (the warm-up defaults to a tenth of it) or warmup_steps")
            warmup_steps = max_steps // 10
        args = training_arguments(
            output_dir, max_steps=max_steps, per_device_train_batch_size=batch_size, learning_rate=learning_rate,
            warmup_steps=warmup_steps, logging_steps=logging_steps, seed=seed, **training_kwargs)
    if position_offsets:
        if getattr(model.config, "model_type", None) != UniversalTransformerConfig.model_type:
            raise ValueError("position_offsets shifts positions by left padding, which only the Universal "
                             f"Transformer counts as positions, not a {model.config.model_type!r} model")
        collator: PositionOffsetCollator | DataCollatorForSeq2Seq = PositionOffsetCollator(
            position_offsets, seed=args.seed, pad_token_id=model.config.pad_token_id,
            decoder_start_token_id=model.config.decoder_start_token_id)
    else:
        collator = DataCollatorForSeq2Seq(algorithmic_tokenizer())
    trainer = UniversalTransformerTrainer(model=model, args=args, train_dataset=train_dataset,
                                          data_collator=collator, callbacks=list(callbacks))
    if log_to_stderr:
        send_logs_to_stderr(trainer)
    trainer.train()
    return trainer


# ----- evaluation ---------------------------------------------------------------------------------------------------

def _strip(ids, eos_token_id):
    """Token ids up to (not including) the first end-of-sequence id."""
    ids = list(ids)
    return ids[:ids.index(eos_token_id)] if eos_token_id in ids else ids


@torch.no_grad()
def greedy_predictions(model: torch.nn.Module, input_ids: Sequence[Sequence[int]], batch_size: int = 64,
                       pad_token_id: int = PAD_ID, eos_token_id: int = EOS_ID) -> list[list[int]]:
    """Greedy `generate()` output for each input id list, cut at the end-of-sequence id (which is left out). Inputs
    are batched by length; each batch may generate as many tokens as its longest input plus one, so a prediction can
    run past a target of its input's length."""
    from peft import PeftModel

    if not isinstance(model, GenerationMixin | PeftModel):
        raise TypeError(f"greedy decoding needs a model that generates, not a {type(model).__name__}")
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    predictions: list[list[int]] = [[] for _ in input_ids]
    order = sorted(range(len(input_ids)), key=lambda i: len(input_ids[i]))
    try:
        for start in range(0, len(order), batch_size):
            rows = order[start:start + batch_size]
            batch = torch.nn.utils.rnn.pad_sequence([torch.as_tensor(input_ids[i]) for i in rows], batch_first=True,
                                                    padding_value=pad_token_id).to(device)
            output = model.generate(input_ids=batch, attention_mask=(batch != pad_token_id).long(),
                                    max_new_tokens=batch.shape[1] + 1, do_sample=False, num_beams=1,
                                    eos_token_id=eos_token_id, pad_token_id=pad_token_id)
            for row, ids in zip(rows, output[:, 1:].tolist(), strict=True):  # the first id is the decoder's start
                predictions[row] = _strip(ids, eos_token_id)
    finally:
        model.train(was_training)
    return predictions


def evaluate_algorithmic(model: torch.nn.Module, dataset: "Dataset", batch_size: int = 64) -> dict[str, float]:
    """Char- and sequence-accuracy (the offline `algorithmic_accuracy` metric) of greedy `generate()` on an
    `algorithmic_dataset`: `{"char_accuracy", "sequence_accuracy", "num_examples"}`."""
    from ...metrics import load_metric

    predictions = greedy_predictions(model, dataset["input_ids"], batch_size)
    references = [_strip(labels, EOS_ID) for labels in dataset["labels"]]
    return load_metric("algorithmic_accuracy").compute(predictions=predictions, references=references)


@torch.no_grad()
def teacher_forced_accuracy(model: torch.nn.Module, dataset: "Dataset", batch_size: int = 64) -> dict[str, float]:
    """Char- and sequence-accuracy of the model's next-symbol predictions with the true targets fed to the decoder
    (teacher forcing), as tensor2tensor evaluates (`utils/t2t_model.py` runs the model on the targets in EVAL mode
    unless `eval_run_autoregressive`; `utils/metrics.py`'s `padded_accuracy` and `padded_sequence_accuracy` take the
    argmax of those logits). As there, every target position counts, the end-of-sequence id included. Returns
    `{"char_accuracy", "sequence_accuracy", "num_examples"}`."""
    if len(dataset) == 0:
        raise ValueError("teacher_forced_accuracy needs at least one example")
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    collator = DataCollatorForSeq2Seq(algorithmic_tokenizer())
    input_ids, labels = dataset["input_ids"], dataset["labels"]
    order = sorted(range(len(labels)), key=lambda i: len(labels[i]))  # batches of similar lengths pad little
    correct = total = exact = 0
    try:
        for start in range(0, len(order), batch_size):
            rows = order[start:start + batch_size]
            batch = collator([{"input_ids": input_ids[i], "labels": labels[i]} for i in rows])
            batch = {name: values.to(device) for name, values in batch.items()}
            predictions = model(**batch).logits.argmax(dim=-1)
            targets = batch["labels"] != -100
            matches = (predictions == batch["labels"]) & targets
            correct += int(matches.sum())
            total += int(targets.sum())
            exact += int((matches.sum(dim=1) == targets.sum(dim=1)).sum())
    finally:
        model.train(was_training)
    return {"char_accuracy": correct / total, "sequence_accuracy": exact / len(dataset), "num_examples": len(dataset)}


@dataclass
class AlgorithmicRun:
    """One model trained on a task and its accuracy at the training lengths and at longer ones: greedy decoding
    (`train_lengths`, `longer_lengths`) and teacher forcing (`teacher_forced_train_lengths`,
    `teacher_forced_longer_lengths`)."""

    name: str
    model: torch.nn.Module
    parameters: int
    train_loss: float | None
    train_seconds: float
    train_lengths: dict
    longer_lengths: dict
    teacher_forced_train_lengths: dict
    teacher_forced_longer_lengths: dict
    log_history: list
    trainer: "UniversalTransformerTrainer"  # what trained it: a command saves through it (`training_run_output`)


def run_algorithmic(task: str, model: "PreTrainedModel | PeftModel", name: str, train_length: int = 20,
                    test_length: int = 40, num_train: int = 20000, num_test: int = 200, max_steps: int = 1500,
                    batch_size: int = 32, learning_rate: float = 1e-3, seed: int = 0,
                    output_dir: str | Path | None = None, eval_batch_size: int = 64, log_to_stderr: bool = False,
                    position_offsets: int = 0,
                    **training_kwargs: Any) -> AlgorithmicRun:
    """Train `model` on `task` with input lengths in [1, train_length] (addition: [3, train_length]) and evaluate it
    with greedy decoding and with teacher forcing on `num_test` new examples at the training lengths and `num_test`
    at the longer lengths (train_length, test_length]. `position_offsets` goes to `train_algorithmic`. Returns an
    `AlgorithmicRun`."""
    import tempfile
    import time

    if test_length <= train_length:
        raise ValueError(f"test_length ({test_length}) must exceed train_length ({train_length})")
    shortest = 3 if task == "addition" else 1
    # separate seeds: the test sets never share the training set's random stream
    train = algorithmic_dataset(task, num_train, shortest, train_length, seed=seed)
    same = algorithmic_dataset(task, num_test, shortest, train_length, seed=seed + 1)
    longer = algorithmic_dataset(task, num_test, train_length + 1, test_length, seed=seed + 2)
    torch.manual_seed(seed)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        trainer = train_algorithmic(model, train, output_dir or scratch, max_steps, batch_size=batch_size,
                                    learning_rate=learning_rate, seed=seed, log_to_stderr=log_to_stderr,
                                    position_offsets=position_offsets, **training_kwargs)
    train_seconds = time.perf_counter() - started
    return AlgorithmicRun(
        name=name, model=model, parameters=count_parameters(model),
        train_loss=trainer.state.log_history[-1].get("train_loss"), train_seconds=train_seconds,
        train_lengths=evaluate_algorithmic(model, same, eval_batch_size),
        longer_lengths=evaluate_algorithmic(model, longer, eval_batch_size),
        teacher_forced_train_lengths=teacher_forced_accuracy(model, same, eval_batch_size),
        teacher_forced_longer_lengths=teacher_forced_accuracy(model, longer, eval_batch_size),
        log_history=trainer.state.log_history, trainer=trainer)


__all__ = ["AlgorithmicRun", "PositionOffsetCollator", "SYMBOLS", "TASKS", "UniversalTransformerTrainer",
           "algorithmic_config", "algorithmic_dataset", "algorithmic_examples", "algorithmic_tokenizer",
           "count_parameters", "evaluate_algorithmic", "greedy_predictions", "run_algorithmic",
           "teacher_forced_accuracy", "train_algorithmic", "vanilla_transformer"]
