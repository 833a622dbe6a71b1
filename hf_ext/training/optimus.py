"""Training Optimus with the transformers `Trainer`: the original's cyclical KL-weight schedules, a callback that
applies them, a text collator, a `Trainer` that logs the two loss terms and beta, and LoRA on both halves.

The schedules follow ChunyuanLI/Optimus `code/examples/big_ae/utils.py` (`frange_cycle_linear`,
`frange_cycle_zero_linear`); `run_lm_vae_training.py` reads the schedule at the index of the current update.
"""

from pathlib import Path

import numpy as np
import torch
from accelerate.utils import extract_model_from_parallel
from transformers import PrinterCallback, TrainerCallback
from transformers.trainer_utils import unwrap_peft_model
from transformers.utils import logging

from ..errors import HfExtError
from ..models.optimus import kl_divergence
from .trainer import TermLoggingTrainer, last_complete_checkpoint, quiet_peft, send_logs_to_stderr

logger = logging.get_logger(__name__)

# Original training defaults (`run_lm_vae_training.py` argparse)
DEFAULT_RATIO_INCREASE = 0.25
DEFAULT_RATIO_ZERO = 0.25

# LoRA targets: BERT's self-attention projections (nn.Linear) and GPT-2's attention and MLP projections (Conv1D,
# which store their weight as [in, out] and therefore need fan_in_fan_out=True).
ENCODER_LORA_TARGETS = ("query", "key", "value")
DECODER_LORA_TARGETS = ("c_attn", "c_proj")
# trained in full and saved with the adapter: they define the latent space
LATENT_MODULES = ("to_latent", "latent_to_memory", "latent_to_embedding")


def frange_cycle_zero_linear(n_iter, start=0.0, stop=1.0, n_cycle=4, ratio_increase=0.5, ratio_zero=0.3):
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


def frange_cycle_linear(n_iter, start=0.0, stop=1.0, n_cycle=4, ratio=0.5):
    """The older cyclical schedule (Fu et al., 2019): a ramp over the first `ratio` of each period, no zero phase."""
    return frange_cycle_zero_linear(n_iter, start, stop, n_cycle, ratio_increase=ratio, ratio_zero=0.0)


def optimus_core(model):
    """The `OptimusModel` inside `model`: out of DDP/FSDP/compile wrappers, then out of a PEFT wrapper."""
    return unwrap_peft_model(extract_model_from_parallel(model))


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

    def schedule(self, max_steps, stop):
        """The beta of every step of a run of `max_steps` updates."""
        key = (max_steps, stop)
        if self._schedule is None or self._schedule[0] != key:
            values = frange_cycle_zero_linear(max_steps, 0.0, stop, self.n_cycles, self.ratio_increase,
                                              self.ratio_zero)
            self._schedule = (key, values)
        return self._schedule[1]

    def _stop(self, core):
        return core.config.beta if self.beta is None else self.beta

    def on_step_begin(self, args, state, control, model=None, **kwargs):
        core = optimus_core(model)
        values = self.schedule(state.max_steps, self._stop(core))
        core.beta = float(values[min(state.global_step, len(values) - 1)])

    def on_train_end(self, args, state, control, model=None, **kwargs):
        # evaluation and inference after training use the full weight
        core = optimus_core(model)
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


def load_text_dataset(path, text_column="text"):
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

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        outputs = model(**inputs)
        for name in ("loss_rec", "loss_kl"):
            if outputs.get(name) is not None:  # loss_kl is None when the batch has no encoder side
                self.record_term(model, name, outputs[name])
        if outputs.get("mean") is not None:
            self.record_term(model, "kl", kl_divergence(outputs["mean"], outputs["logvar"]).detach())
        if model.training:
            self.record_term(model, "beta", torch.tensor(float(optimus_core(model).beta)))
        return (outputs.loss, outputs) if return_outputs else outputs.loss


def finetune_optimus(model, processor, dataset, output_dir, max_steps, batch_size=8, learning_rate=5e-5,
                     n_cycles=1, ratio_zero=DEFAULT_RATIO_ZERO, ratio_increase=DEFAULT_RATIO_INCREASE,
                     logging_steps=50, seed=42, max_length=None, text_column="text", callbacks=(), log_to_stderr=False,
                     save_steps=None, save_total_limit=2, print_logs=True, **training_kwargs):
    """Fine-tune `model` on the `text_column` of `dataset` with the original objective (cyclical KL schedule up to
    `config.beta`, free bits, length weighting as configured). `output_dir` is the Trainer's working folder; the
    trained model stays in memory. `log_to_stderr` writes the logs as JSON lines on stderr instead of stdout;
    `print_logs=False` prints none (`callbacks` still receive them).

    With `save_steps`, a checkpoint goes into `output_dir` every `save_steps` steps (the newest `save_total_limit`
    are kept) and a run on the same `output_dir` resumes from the newest complete one: the beta schedule and the
    data order continue where they stopped. Returns the `OptimusTrainer` after training."""
    from transformers import TrainingArguments

    saving = {"save_strategy": "steps", "save_steps": save_steps, "save_total_limit": save_total_limit} \
        if save_steps else {"save_strategy": "no"}
    training_args = TrainingArguments(
        output_dir=str(output_dir), max_steps=max_steps, per_device_train_batch_size=batch_size,
        learning_rate=learning_rate, logging_steps=logging_steps, seed=seed, report_to=[],
        dataloader_pin_memory=torch.cuda.is_available(), **saving, **training_kwargs,
    )
    schedule = BetaScheduleCallback(n_cycles=n_cycles, ratio_zero=ratio_zero, ratio_increase=ratio_increase)
    trainer = OptimusTrainer(model=model, args=training_args, train_dataset=dataset,
                             data_collator=OptimusDataCollator(processor, text_column, max_length),
                             callbacks=[schedule, *callbacks])
    if not print_logs:
        trainer.remove_callback(PrinterCallback)
    elif log_to_stderr:
        send_logs_to_stderr(trainer)
    checkpoint = last_complete_checkpoint(output_dir) if save_steps else None
    if checkpoint is not None:
        logger.warning(f"resuming from {checkpoint}")
    trainer.train(resume_from_checkpoint=checkpoint)
    return trainer


def optimus_lora(model, r=8, lora_alpha=16, lora_dropout=0.0, encoder_targets=ENCODER_LORA_TARGETS,
                 decoder_targets=DECODER_LORA_TARGETS, modules_to_save=LATENT_MODULES):
    """Wrap an `OptimusModel` in LoRA adapters on the encoder's and the decoder's projections; the latent
    projections (`modules_to_save`) are trained in full and saved with the adapter.

    GPT-2's `Conv1D` targets get `fan_in_fan_out=True` and BERT's `nn.Linear` targets `False`: PEFT picks the value
    per layer from the layer type when the targets mix both (the warnings it gives about that are silenced here).
    """
    from peft import LoraConfig, get_peft_model

    targets = [*encoder_targets, *decoder_targets]
    if not targets:
        raise ValueError("give at least one LoRA target module")
    config = LoraConfig(r=r, lora_alpha=lora_alpha, lora_dropout=lora_dropout, target_modules=targets,
                        modules_to_save=list(modules_to_save), fan_in_fan_out=bool(decoder_targets))
    with quiet_peft():
        return get_peft_model(model, config)


def load_optimus_lora(model, adapter, **kwargs):
    """`PeftModel.from_pretrained(model, adapter)` for an adapter saved from `optimus_lora`."""
    from peft import PeftModel

    with quiet_peft():
        return PeftModel.from_pretrained(model, adapter, **kwargs)


__all__ = ["BetaScheduleCallback", "DECODER_LORA_TARGETS", "ENCODER_LORA_TARGETS", "LATENT_MODULES",
           "OptimusDataCollator", "OptimusTrainer", "frange_cycle_linear",
           "finetune_optimus", "frange_cycle_zero_linear", "load_optimus_lora", "load_text_dataset", "optimus_core", "optimus_lora"]
