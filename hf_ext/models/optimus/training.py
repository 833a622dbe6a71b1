"""Training Optimus with the transformers `Trainer`: the original's cyclical KL-weight schedules, a callback that
applies them, a text collator, a `Trainer` that logs the two loss terms and beta, and LoRA on both halves.

The schedules follow ChunyuanLI/Optimus `code/examples/big_ae/utils.py` (`frange_cycle_linear`,
`frange_cycle_zero_linear`); `run_lm_vae_training.py` reads the schedule at the index of the current update.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch
from transformers import PrinterCallback, TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.pytorch_utils import Conv1D
from transformers.utils import ModelOutput, logging

from ...errors import HfExtError
from ...lora import add_lora, unwrap
from ...registration import ENCODER_ATTENTION
from ...streaming import is_stream, split_for_process, train_keeping_progress
from ...trainer import TermLoggingTrainer, last_complete_checkpoint, send_logs_to_stderr, training_arguments
from . import kl_divergence
from .backbones import LATENT_MODULES, added_decoder_token_ids
from .configuration_optimus import DECODER_ATTENTION
from .modeling_optimus import OptimusModel
from .processing_optimus import OptimusProcessor

if TYPE_CHECKING:  # datasets and peft are imported only when used
    from datasets import Dataset, IterableDataset
    from peft import PeftModel

logger = logging.get_logger(__name__)

# Original training defaults (`run_lm_vae_training.py` argparse)
DEFAULT_RATIO_INCREASE = 0.25
DEFAULT_RATIO_ZERO = 0.25
BACKBONES = ("encoder", "decoder")
# the attention projections LoRA adapts in each backbone, by their names in the architectures hf-ext knows
LORA_TARGETS = {"encoder": ENCODER_ATTENTION, "decoder": DECODER_ATTENTION}


def frange_cycle_zero_linear(n_iter: int, start: float = 0.0, stop: float = 1.0, n_cycle: int = 4,
                             ratio_increase: float = 0.5, ratio_zero: float = 0.3) -> np.ndarray:
    """Cyclical schedule of `n_iter` values: each of the `n_cycle` periods holds `start` for its first `ratio_zero`,
    then ramps linearly from `start` towards `stop` over `ratio_increase` of the period, then stays at `stop`."""
    if n_iter < 1 or n_cycle < 1:
        raise ValueError(f"n_iter and n_cycle must be at least 1, got {n_iter} and {n_cycle}")
    if ratio_increase <= 0 or ratio_zero < 0:
        raise ValueError(f"ratio_increase must be > 0 and ratio_zero >= 0, got {ratio_increase} and {ratio_zero}")
    schedule = np.full(n_iter, stop, dtype=np.float64)
    period = n_iter / n_cycle
    increment = (stop - start) / (period * ratio_increase)
    for cycle in range(n_cycle):
        # The value grows by repeated addition and the ramp ends once it passes `stop`, as in the original: the
        # float rounding of that sum decides the last ramp index, so it is kept rather than computed as i * increment.
        value, i = start, 0
        while value <= stop and int(i + cycle * period) < n_iter:
            index = int(i + cycle * period)
            if i < period * ratio_zero:
                schedule[index] = start
            else:
                schedule[index] = value
                value += increment
            i += 1
    return schedule


def frange_cycle_linear(n_iter: int, start: float = 0.0, stop: float = 1.0, n_cycle: int = 4,
                        ratio: float = 0.5) -> np.ndarray:
    """The older cyclical schedule (Fu et al., 2019): a ramp over the first `ratio` of each period, no zero phase."""
    return frange_cycle_zero_linear(n_iter, start, stop, n_cycle, ratio_increase=ratio, ratio_zero=0.0)


def _optimus_model(model: torch.nn.Module | None) -> OptimusModel:
    """The `OptimusModel` inside the model Trainer trains (out of DDP, compile and PEFT wrappers). A cast, not an
    isinstance check: a model loaded as remote code is an `OptimusModel` of another module."""
    if model is None:
        raise ValueError("the beta schedule needs the model, which Trainer passes to its callbacks")
    return cast(OptimusModel, unwrap(model))


@dataclass(frozen=True)
class TrainableParameters:
    """How much of a model a run trains: `trainable` parameters (LoRA's included) against the `total` of the model
    itself (without adapters), and what trains, in words (`what`)."""

    trainable: int
    total: int
    what: str

    @property
    def fraction(self) -> float:
        return self.trainable / self.total

    def as_dict(self) -> dict[str, Any]:
        return {"trainable_parameters": self.trainable, "parameters": self.total,
                "trainable_fraction": round(self.fraction, 6), "trained": self.what}


def lora_targets(model: OptimusModel, backbone: str) -> list[str]:
    """The full names of the attention projections of `backbone` ("encoder" or "decoder") that LoRA adapts (its
    modules named as `LORA_TARGETS` lists them); one `HfExtError` line when its architecture has none."""
    known = LORA_TARGETS[backbone]
    names = [name for name, module in model.named_modules() if name.startswith(f"{backbone}.")
             and name.rsplit(".", 1)[-1] in known and isinstance(module, torch.nn.Linear | Conv1D)]
    if not names:
        raise HfExtError(f"LoRA on the {backbone}: the {getattr(model.config, backbone).model_type} architecture has "
                         f"none of the attention projections hf-ext adapts ({', '.join(known)})")
    return names


def freeze_or_adapt(model: OptimusModel, processor: OptimusProcessor, freeze: Sequence[str] = (),
                    lora_on: Sequence[str] = (), lora_r: int = 8, lora_alpha: float | None = None,
                    lora_dropout: float = 0.0) -> tuple["OptimusModel | PeftModel", TrainableParameters]:
    """What of `model` trains. Without LoRA, everything but the backbones in `freeze` ("encoder", "decoder"; the
    decoder with its LM head): the latent projections always train. With LoRA on the backbones `lora_on` (rank
    `lora_r`, scaling `lora_alpha`, 2 x the rank by default), only PEFT's adapters on their attention projections
    (`lora_targets`), the latent projections (trained in full) and the embeddings of the decoder's added tokens
    (`<PAD>`, `<BOS>`, `<EOS>`, which no pretraining has learnt: PEFT's trainable tokens) train: both backbones' own
    weights are frozen. Returns the model to train (a `PeftModel` with LoRA: `merge_and_unload()` gives the
    `OptimusModel` back) and what it trains."""
    unknown = sorted((set(freeze) | set(lora_on)) - set(BACKBONES))
    if unknown:
        raise ValueError(f"backbones are {BACKBONES}, got {unknown}")
    total = model.num_parameters()
    trained: OptimusModel | PeftModel
    if lora_on:
        token_ids = added_decoder_token_ids(processor.decoder_tokenizer)
        embeddings = next(name for name, module in model.named_modules() if module is model.get_input_embeddings())
        # PEFT trains a tied LM head's rows with the embeddings' (a list names the input embeddings); an untied head
        # is named beside them
        tokens = None if not token_ids else token_ids if model.config.tie_word_embeddings else \
            {embeddings: token_ids, "lm_head": token_ids}
        targets = [name for backbone in BACKBONES if backbone in lora_on for name in lora_targets(model, backbone)]
        trained = add_lora(model, r=lora_r, lora_alpha=lora_alpha or 2 * lora_r, lora_dropout=lora_dropout,
                           target_modules=tuple(targets), modules_to_save=list(LATENT_MODULES),
                           trainable_token_indices=tokens)
        token_names = processor.decoder_tokenizer.convert_ids_to_tokens(token_ids)
        tokens_text = f" and the embeddings of {', '.join(f'`{name}`' for name in token_names)}" if token_ids else ""
        what = (f"LoRA adapters (rank {lora_r}) on the attention of the {' and the '.join(lora_on)}, the latent "
                f"projections{tokens_text}; the backbones' own weights frozen (the adapters merged into the saved "
                "weights)")
    else:
        for backbone in freeze:
            modules = [model.encoder] if backbone == "encoder" else [model.decoder, model.lm_head]
            for module in modules:
                module.requires_grad_(False)
        trained = model
        kept = [f"the {backbone}" for backbone in BACKBONES if backbone not in freeze]
        what = ", ".join([*kept, "the latent projections"]) + \
            (f"; the {' and the '.join(freeze)} frozen" if freeze else "")
    count = sum(parameter.numel() for parameter in trained.parameters() if parameter.requires_grad)
    return trained, TrainableParameters(count, total, what)


class BetaScheduleCallback(TrainerCallback):
    """Sets the model's KL weight `beta` before every optimizer step from `frange_cycle_zero_linear` over the run's
    `max_steps`. The value depends on `state.global_step` only, so a resumed run continues the same schedule.

    Args:
        beta (`float`, *optional*): the schedule's maximum; the model's `config.beta` when unset.
        n_cycles (`int`, defaults to 1): number of cycles over the run (the original fine-tuning uses 1).
        ratio_increase (`float`, defaults to 0.25): share of each cycle spent ramping up.
        ratio_zero (`float`, defaults to 0.25): share of each cycle held at 0 first.
    """

    def __init__(self, beta=None, n_cycles=1, ratio_increase=DEFAULT_RATIO_INCREASE, ratio_zero=DEFAULT_RATIO_ZERO):
        if beta is not None and beta < 0:
            raise ValueError(f"beta must be >= 0, got {beta}")
        if n_cycles < 1:
            raise ValueError(f"n_cycles must be at least 1, got {n_cycles}")
        if not 0 < ratio_increase <= 1 or not 0 <= ratio_zero < 1:
            raise ValueError(f"ratio_increase must be in (0, 1] and ratio_zero in [0, 1), got {ratio_increase} "
                             f"and {ratio_zero}")
        self.beta = beta
        self.n_cycles = n_cycles
        self.ratio_increase = ratio_increase
        self.ratio_zero = ratio_zero
        self._schedule = None

    def schedule(self, max_steps: int, stop: float) -> np.ndarray:
        """The beta of every step of a run of `max_steps` updates."""
        key = (max_steps, stop)
        if self._schedule is None or self._schedule[0] != key:
            values = frange_cycle_zero_linear(max_steps, 0.0, stop, self.n_cycles, self.ratio_increase,
                                              self.ratio_zero)
            self._schedule = (key, values)
        return self._schedule[1]

    def _stop(self, core):
        return core.config.beta if self.beta is None else self.beta

    def on_step_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                      model: torch.nn.Module | None = None, **kwargs: Any) -> None:
        core = _optimus_model(model)
        values = self.schedule(state.max_steps, self._stop(core))
        core.beta = float(values[min(state.global_step, len(values) - 1)])

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                     model: torch.nn.Module | None = None, **kwargs: Any) -> None:
        # evaluation and inference after training use the full weight
        core = _optimus_model(model)
        core.beta = float(self._stop(core))


class OptimusDataCollator:
    """Builds both sides of an Optimus batch (`input_ids`, `attention_mask`, `labels`) from the `text_column` of
    `datasets` rows with an `OptimusProcessor` (`max_length` truncates each side)."""

    def __init__(self, processor, text_column="text", max_length=None):
        self.processor = processor
        self.text_column = text_column
        self.max_length = max_length

    def __call__(self, features):
        texts = [feature[self.text_column] for feature in features]
        return dict(self.processor(texts, max_length=self.max_length))


def load_text_dataset(path: str | Path, text_column: str = "text") -> "Dataset":
    """A `datasets.Dataset` with one stripped, non-empty line of the text file `path` per row."""
    from datasets import Dataset

    path = Path(path)
    if not path.is_file():
        raise HfExtError(f"text file {path} does not exist")
    try:
        lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    except UnicodeDecodeError as error:
        raise HfExtError(f"text file {path} is not UTF-8 text ({error.reason} at byte {error.start})") from None
    lines = [line for line in lines if line]
    if not lines:
        raise HfExtError(f"text file {path} has no non-empty lines")
    return Dataset.from_dict({text_column: lines})


def read_text_lines(source: str | Path, streaming: bool = False, text_column: str = "text",
                    ) -> "Dataset | IterableDataset":
    """`load_text_dataset` through `datasets`' `text` builder, for a file, a folder of `.txt` shards, a glob or a Hub
    dataset id with a `text` column: memory-mapped, or with `streaming` a `datasets.IterableDataset` read while
    training (give `max_steps`: a stream has no length)."""
    from ...streaming import load_json_source

    lines = load_json_source(source, "text", streaming, builder="text")
    return lines.map(lambda rows: {text_column: [line.strip() for line in rows["text"] if line and line.strip()]},
                     batched=True, remove_columns=lines.column_names)


class OptimusTrainer(TermLoggingTrainer):
    """`Trainer` for `OptimusModel` (or a PEFT wrapper of it) that also logs `loss_rec`, `loss_kl` (the KL term of
    the loss, after free bits), `kl` (the plain KL, which free bits do not change) and `beta`: the means over each
    logging window, averaged across processes. Evaluation reports `eval_loss` (the labels are named `labels`) plus
    `eval_loss_rec`, `eval_loss_kl` and `eval_kl`, averaged over the examples. With `OptimusDataCollator` the
    dataset's text column is kept for the collator even though the model's `forward` does not take it."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, logged_terms=("loss_rec", "loss_kl", "kl", "beta"), **kwargs)
        if self.args.label_names is None:
            self.label_names = ["labels"]

    def _set_signature_columns_if_needed(self):
        super()._set_signature_columns_if_needed()
        text_column = getattr(self.data_collator, "text_column", None)
        if text_column is not None and text_column not in self._signature_columns:
            self._signature_columns.append(text_column)

    def compute_loss(self, model: torch.nn.Module, inputs: dict[str, torch.Tensor], return_outputs: bool = False,
                     num_items_in_batch: torch.Tensor | int | None = None,
                     ) -> torch.Tensor | tuple[torch.Tensor, ModelOutput]:
        outputs = model(**inputs)
        for name in ("loss_rec", "loss_kl"):
            if outputs.get(name) is not None:  # loss_kl is None when the batch has no encoder side
                self.record_term(model, name, outputs[name])
        if outputs.get("mean") is not None:
            self.record_term(model, "kl", kl_divergence(outputs["mean"], outputs["logvar"]).detach())
        if model.training:
            self.record_term(model, "beta", torch.tensor(float(_optimus_model(model).beta)))
        return (outputs.loss, outputs) if return_outputs else outputs.loss


def finetune_optimus(model: "OptimusModel | PeftModel | torch.nn.Module", processor: OptimusProcessor,
                     dataset: "Dataset | IterableDataset",
                     output_dir: str | Path | None = None, max_steps: int | None = None, batch_size: int = 8,
                     learning_rate: float = 5e-5, n_cycles: int = 1, ratio_zero: float = DEFAULT_RATIO_ZERO,
                     ratio_increase: float = DEFAULT_RATIO_INCREASE, logging_steps: int = 50, seed: int = 42,
                     max_length: int | None = None, text_column: str = "text",
                     callbacks: Sequence[TrainerCallback] = (), log_to_stderr: bool = False,
                     save_steps: int | None = None, save_total_limit: int | None = 2, print_logs: bool = True,
                     args: TrainingArguments | None = None, data_collator: Any = None,
                     **training_kwargs: Any) -> "OptimusTrainer":
    """Fine-tune `model` (an `OptimusModel`, a PEFT wrapper of one, or a module around one that exposes its `config`
    and `beta`, as `conditional.LabelConditionalOptimus`) on the `text_column` of `dataset` with the original
    objective (cyclical KL schedule up to `config.beta`, free bits, length weighting as configured); the trained
    model stays in memory. A
    `datasets.IterableDataset` (`read_text_lines(..., streaming=True)`) is read while training, each process its
    own part, and its position is saved with every checkpoint (`hf_ext.streaming`).

    `args` are the `TrainingArguments`; without them they are built (`hf_ext.trainer.training_arguments`) from
    `output_dir` (the Trainer's working folder), `max_steps`, `batch_size`, `learning_rate`, `logging_steps`, `seed`,
    `save_steps`/`save_total_limit` and any other `TrainingArguments` field in `training_kwargs`.
    `log_to_stderr` writes the logs as JSON lines on stderr instead of stdout; `print_logs=False` prints none
    (`callbacks` still receive them). `data_collator` replaces the `OptimusDataCollator` of `text_column` (for a model
    whose forward takes more than the text, as `conditional.LabelConditionalOptimus`).

    When the arguments save checkpoints (`save_steps`), a run on the same output folder resumes from the newest
    complete one: the beta schedule and the data order continue where they stopped. Returns the `OptimusTrainer`
    after training."""
    if args is None:
        if output_dir is None:
            raise TypeError("give output_dir (the Trainer's working folder) or args")
        saving = {"save_strategy": "steps", "save_steps": save_steps, "save_total_limit": save_total_limit} \
            if save_steps else {}
        args = training_arguments(output_dir, max_steps=max_steps, per_device_train_batch_size=batch_size,
                                  learning_rate=learning_rate, logging_steps=logging_steps, seed=seed, **saving,
                                  **training_kwargs)
    schedule = BetaScheduleCallback(n_cycles=n_cycles, ratio_zero=ratio_zero, ratio_increase=ratio_increase)
    if is_stream(dataset):  # each process reads its own part
        dataset = split_for_process(dataset, args)
    trainer = OptimusTrainer(model=model, args=args, train_dataset=dataset,
                             data_collator=data_collator or OptimusDataCollator(processor, text_column, max_length),
                             callbacks=[schedule, *callbacks])
    if not print_logs:
        trainer.remove_callback(PrinterCallback)
    elif log_to_stderr:
        send_logs_to_stderr(trainer)
    assert args.output_dir is not None  # TrainingArguments sets its default ("trainer_output") when given none
    checkpoint = last_complete_checkpoint(args.output_dir) if args.save_strategy != "no" else None
    if checkpoint is not None:
        logger.warning(f"resuming from {checkpoint}")
    train_keeping_progress(trainer, resume_from_checkpoint=checkpoint)
    return trainer


__all__ = ["BetaScheduleCallback", "OptimusDataCollator", "OptimusTrainer", "TrainableParameters", "finetune_optimus",
           "freeze_or_adapt", "frange_cycle_linear", "frange_cycle_zero_linear", "load_text_dataset", "lora_targets",
           "read_text_lines"]
