"""What every model's training here shares: `TrainingArguments` with the package's defaults, logging named loss
terms beside the loss, streamed training data (`hf_ext.streaming`), JSON log lines (and at a terminal a progress
bar) on stderr for command-line runs, resuming from the newest complete checkpoint, the output folder of a training
command, and PEFT calls without its expected warnings."""

import contextlib
import copy
import dataclasses
import json
import re
import shutil
import sys
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader
from tqdm.auto import tqdm
from transformers import (
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PrinterCallback,
    ProcessorMixin,
    ProgressCallback,
    Trainer,
    TrainerCallback,
    TrainerControl,
    TrainerState,
    TrainingArguments,
)
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, EvalLoopOutput, TrainOutput
from transformers.utils import logging

from .errors import HfExtError
from .output import atomic_output_dir

if TYPE_CHECKING:
    from peft import PeftModel

logger = logging.get_logger(__name__)
TRAINER_STATE = "trainer_state.json"
LOG_HISTORY = "log_history.json"
EVAL_RESULTS = "eval_results.json"


class StderrLogCallback(TrainerCallback):
    """Writes each log entry as one JSON line on stderr, for command-line runs whose stdout is machine-readable
    (use it instead of the `PrinterCallback`/`ProgressCallback` that `Trainer` installs)."""

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
               logs: dict[str, float] | None = None, **kwargs: Any) -> None:
        if state.is_world_process_zero and logs:
            # above the progress bar where one is drawn; one write per line, so that a Ctrl-C cannot leave a line
            # unfinished for the error to be glued to
            with tqdm.external_write_mode(file=sys.stderr):
                sys.stderr.write(json.dumps({"step": state.global_step, **logs}) + "\n")


class StderrProgressCallback(ProgressCallback):
    """`Trainer`'s progress bars (steps done, rate, time left) on stderr, without `ProgressCallback`'s copy of each
    log entry on stdout: `StderrLogCallback` writes the entries above the bar."""

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
               logs: dict[str, float] | None = None, **kwargs: Any) -> None:
        return None


def send_logs_to_stderr(trainer: Trainer) -> None:
    """Send `trainer`'s logs to stderr as JSON lines instead of printing them on stdout; its progress bar, when its
    arguments draw one (`disable_tqdm=False`), stays, on stderr."""
    trainer.remove_callback(PrinterCallback)
    if trainer.pop_callback(ProgressCallback) is not None:
        trainer.add_callback(StderrProgressCallback())
    trainer.add_callback(StderrLogCallback())


def last_complete_checkpoint(folder: str | Path) -> str | None:
    """The newest `checkpoint-<step>` folder in `folder` that `Trainer` finished writing, for
    `train(resume_from_checkpoint=...)`; None when there is none.

    `Trainer` writes a checkpoint in place and its `trainer_state.json` last, so a checkpoint without a readable one was
    interrupted while being saved (Ctrl-C, SIGTERM, a full disk). Such folders are removed here: resuming from one
    fails, and `save_total_limit` rotation would count it as the newest and delete the complete ones."""
    folder = Path(folder)
    if not folder.is_dir():
        return None
    pattern = re.compile(rf"{PREFIX_CHECKPOINT_DIR}-(\d+)")
    steps = {path: int(match.group(1)) for path in folder.iterdir()
             if path.is_dir() and (match := pattern.fullmatch(path.name))}
    checkpoints = sorted(steps, key=steps.__getitem__)
    complete = None
    for checkpoint in checkpoints:
        if _readable_json(checkpoint / TRAINER_STATE):
            complete = checkpoint
        else:
            logger.warning(f"removing {checkpoint}: its save was interrupted (no complete {TRAINER_STATE})")
            shutil.rmtree(checkpoint, ignore_errors=True)
    return str(complete) if complete is not None else None


def _readable_json(path):
    try:
        json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return True


class TermMeans:
    """Running sums and counts of a fixed list of named terms, kept on the device and reduced across processes only
    when read, so that a logging window costs one collective. The list is fixed so that every process reduces the
    same tensor, whichever terms its own batches produced."""

    def __init__(self, names, device):
        self.names = list(names)
        self.index = {name: i for i, name in enumerate(self.names)}
        dtype = torch.float32 if torch.device(device).type == "mps" else torch.float64  # MPS has no float64
        self.totals = torch.zeros(2, len(self.names), dtype=dtype, device=device)

    def add(self, name: str, value: torch.Tensor, count: int = 1) -> None:
        """Add `value` (a tensor: one term, or the sum of `count` of them) to the running sum of `name`."""
        i = self.index[name]
        self.totals[0, i] += value.detach().to(self.totals.dtype)
        self.totals[1, i] += count

    def reset(self) -> None:
        """Forget what was added (a window a previous run left unlogged)."""
        self.totals.zero_()

    def means(self, accelerator: Accelerator) -> dict[str, float]:
        """`{name: mean}` over every process of the terms added since the last call (names never added are left
        out), then starts again. Every process must call it."""
        sums, counts = accelerator.reduce(self.totals.clone(), reduction="sum").tolist()
        self.reset()
        return {name: total / count for name, total, count in zip(self.names, sums, counts, strict=True) if count}


class TermLoggingTrainer(Trainer):
    """`Trainer` that logs named terms beside the loss (`logged_terms`): training logs the mean of each over the
    logging window and the processes, evaluation `eval_<name>`, the mean over the evaluation and the processes.

    Subclasses report terms from `compute_loss` with `record_term`; a per-example tensor is averaged over the
    examples of the whole evaluation, without the samples a distributed sampler repeats to even out the last batch.
    """

    def __init__(self, *args, logged_terms=(), **kwargs):
        from .streaming import PositionedStream, is_stream

        super().__init__(*args, **kwargs)
        self.train_terms = TermMeans(logged_terms, self.args.device)
        self.eval_terms = TermMeans(logged_terms, self.args.device)
        self.resumed_from_step = 0
        self.add_callback(_ResumeStepCallback(self))
        # a `datasets.IterableDataset` (this process's part of a stream): read with its position kept for
        # checkpoints, for the batches a data loader reads ahead of the step it trains and a few more
        # (`hf_ext.streaming.train_keeping_progress` trains it)
        self.stream = PositionedStream(self.train_dataset, self._train_batch_size,
                                       keep=2 * self.args.gradient_accumulation_steps + 4) \
            if is_stream(self.train_dataset) else None

    def get_train_dataloader(self) -> DataLoader:
        from .streaming import stream_dataloader

        if self.stream is not None:
            return stream_dataloader(self.stream, self._train_batch_size, self.data_collator, self.args)
        return super().get_train_dataloader()

    def record_term(self, model: torch.nn.Module, name: str, value: torch.Tensor) -> None:
        """Add one batch's `name`: a scalar, or (at evaluation) one value per example."""
        if model.training or value.dim() == 0:
            (self.train_terms if model.training else self.eval_terms).add(name, value.mean())
        else:
            # every process holds the same gathered values, so sums and counts scale alike and the mean is exact
            gathered = self.accelerator.gather_for_metrics(value.detach())
            self.eval_terms.add(name, gathered.sum(), gathered.numel())

    def train(self, *args: Any, **kwargs: Any) -> TrainOutput:
        self.train_terms.reset()  # a window a previous run left unlogged
        return super().train(*args, **kwargs)

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        # `log` runs on every process, so the reductions pair up across ranks
        if "loss" in logs:
            logs.update(self.train_terms.means(self.accelerator))
        if "train_loss" in logs and self.resumed_from_step:
            logs["train_loss"] = self._whole_run_train_loss()
        super().log(logs, start_time)

    def _whole_run_train_loss(self):
        """The mean training loss of a resumed run over all its steps, not only those since the resume (what
        `Trainer` reports): the logged windows before the resume point, each weighted by its steps, plus the losses
        of this run. Steps after the last window logged before the checkpoint have no recorded loss and are left
        out of the mean."""
        before, total, previous = 0, 0.0, 0
        for entry in self.state.log_history:
            if "loss" in entry and entry["step"] <= self.resumed_from_step:
                total += entry["loss"] * (entry["step"] - previous)
                before = previous = entry["step"]
        steps_now = self.state.global_step - self.resumed_from_step
        return (total + self._total_loss_scalar) / max(before + steps_now, 1)

    def evaluation_loop(self, dataloader: DataLoader, description: str, prediction_loss_only: bool | None = None,
                        ignore_keys: list[str] | None = None, metric_key_prefix: str = "eval") -> EvalLoopOutput:
        self.eval_terms.reset()
        output = super().evaluation_loop(dataloader, description, prediction_loss_only, ignore_keys,
                                         metric_key_prefix)
        assert output.metrics is not None  # Trainer.evaluation_loop always returns its metrics
        output.metrics.update({f"{metric_key_prefix}_{name}": value
                               for name, value in self.eval_terms.means(self.accelerator).items()})
        return output


class _ResumeStepCallback(TrainerCallback):
    """Records the step a `train()` call starts from (after `Trainer` loaded a resumed checkpoint's state)."""

    def __init__(self, trainer):
        self.trainer = trainer

    def on_train_begin(self, args, state, control, **kwargs):
        self.trainer.resumed_from_step = state.global_step


@contextlib.contextmanager
def quiet_peft() -> Iterator[None]:
    """PEFT without the warnings that need no action here: it reads transformers' deprecated
    `is_gradient_checkpointing`, and it warns for every layer whose type contradicts the config's single
    `fan_in_fan_out` before using the right value for that layer (expected with BERT Linear and GPT-2 Conv1D targets
    together)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing", category=FutureWarning)
        warnings.filterwarnings("ignore", message=re.escape("fan_in_fan_out is set to"))
        yield


def training_arguments(output_dir: str | Path, **settings: Any) -> TrainingArguments:
    """`TrainingArguments` with hf-ext's defaults, which `settings` override: no reporting integrations, memory
    pinned only where CUDA is, and no checkpoints unless a save strategy is given. Each model's training function
    takes `TrainingArguments` (`args=`) or builds them here from its keyword arguments."""
    defaults = {"report_to": [], "dataloader_pin_memory": torch.cuda.is_available(), "save_strategy": "no"}
    return TrainingArguments(output_dir=str(output_dir), **{**defaults, **settings})


def replace_arguments(args: TrainingArguments, **changes: Any) -> TrainingArguments:
    """A copy of `args` with the fields in `changes` (ones read when training starts: `output_dir`, `max_steps`,
    `ddp_find_unused_parameters`), on the devices and distributed state `args` set up. `dataclasses.replace` would set
    them up again, and transformers takes `accelerator_config.use_configured_state` out of the config the first time:
    the copy would drop an accelerate state configured before the Trainer (FSDP2, say) and train with plain DDP."""
    names = {field.name for field in dataclasses.fields(args)}
    unknown = sorted(set(changes) - names)
    if unknown:
        raise TypeError(f"TrainingArguments has no field {', '.join(unknown)}")
    copied = copy.copy(args)  # keeps the set-up devices (`_setup_devices` is cached in the instance)
    for name, value in changes.items():
        setattr(copied, name, value)
    return copied


@contextlib.contextmanager
def shared_temporary_dir() -> Iterator[str]:
    """A temporary folder, one for all the processes of a distributed run, for a Trainer's `output_dir` (checkpoints
    kept only while training): transformers expects every process to use the same one, as only the main process saves
    the weights into a checkpoint and every process loads the best one back (`load_best_model_at_end`). The main
    process makes it and broadcasts its path; once every process is done, it removes it. Call it after making the
    `TrainingArguments`, which set up the distributed state (on several machines, the folder is the main one's: point
    `TMPDIR` at a shared filesystem)."""
    from accelerate import PartialState
    from accelerate.utils import broadcast_object_list

    state = PartialState()
    [path] = broadcast_object_list([tempfile.mkdtemp() if state.is_main_process else None])
    try:
        yield path
        state.wait_for_everyone()  # every process is done with the folder before the main one removes it
    finally:  # after an error, no waiting for processes that may never come (torchrun stops them)
        if state.is_main_process:
            shutil.rmtree(path, ignore_errors=True)


def trained_weights(trainer: Trainer, model: torch.nn.Module | None) -> dict[str, torch.Tensor] | None:
    """The weights of `model` to save after `trainer` trained it, gathered whole: `trainer.model` (a PEFT model
    included) through accelerate's `get_state_dict`, which under FSDP gathers the shards, a collective every process
    must join; None for another model made from it on each process (LoRA merged into the weights), which saves its
    own replicated weights, and which FSDP's shards cannot give."""
    if model is not trainer.model:
        if trainer.is_fsdp_enabled:
            raise HfExtError(f"cannot save a {type(model).__name__} made from the model FSDP trained (LoRA merged "
                             "into sharded weights, say): train it without FSDP, or save the trained model itself")
        return None
    weights = trainer.accelerator.get_state_dict(trainer.model_wrapped)
    if isinstance(model, PreTrainedModel):
        for tied in model.all_tied_weights_keys:  # gathered as copies, which saving cannot tell to be tied
            weights.pop(tied, None)
    return weights


@contextlib.contextmanager
def training_run_output(out: str | Path, trainer: Trainer,
                        processor: ProcessorMixin | PreTrainedTokenizerBase | None = None,
                        metrics: dict | None = None, model: "PreTrainedModel | PeftModel | None" = None,
                        overwrite: bool = False) -> Iterator[Path | None]:
    """The output folder of a training command, under one process or several (`torchrun`, `accelerate launch`):
    every process gathers the trained weights (`trained_weights`), then the main one (`should_save`) writes them with
    `save_training_run` into a staging folder, which it yields for the rest of the output (card, plots) and which
    becomes `out` atomically when the block completes. Other processes get None: they write nothing, and a command
    returns there, as `trainer.evaluate()` and any other collective must have run before."""
    weights = trained_weights(trainer, model or trainer.model)
    if not trainer.args.should_save:
        yield None
        return
    with atomic_output_dir(out, overwrite) as staging:
        save_training_run(staging, trainer, processor, metrics, model, state_dict=weights)
        yield staging


def save_training_run(folder: str | Path, trainer: Trainer,
                      processor: ProcessorMixin | PreTrainedTokenizerBase | None = None, metrics: dict | None = None,
                      model: "PreTrainedModel | PeftModel | None" = None,
                      state_dict: dict[str, torch.Tensor] | None = None) -> None:
    """What a training command leaves in its output folder: the trained model (`trainer.model`, or `model`; a PEFT
    model saves its adapter and the modules it trains in full), with `state_dict` as its weights where given (gathered
    by `trained_weights`), its processor or tokenizer, `log_history.json` and, with `metrics`, `eval_results.json`. A
    model saved with its code (registered for remote code, as hf-ext's models are) also carries the custom pipelines
    hf-ext declares for its model type and class (`custom_pipelines`)."""
    from peft import PeftModel

    from .models import model_entry
    from .registration import add_custom_pipelines

    folder = Path(folder)
    trained = model or trainer.model
    if not isinstance(trained, PreTrainedModel | PeftModel):
        raise TypeError(f"cannot save a {type(trained).__name__}: not a transformers or PEFT model")
    entry = model_entry(trained.config.model_type) if isinstance(trained, PreTrainedModel) else None
    if entry is not None and getattr(trained, "_auto_class", None) is not None:
        folder.mkdir(parents=True, exist_ok=True)
        add_custom_pipelines(folder, trained.config, entry.pipelines, type(trained))
    trained.save_pretrained(str(folder), state_dict=state_dict)
    if processor is not None:
        processor.save_pretrained(folder)
    (folder / LOG_HISTORY).write_text(json.dumps(trainer.state.log_history, indent=1))
    if metrics:
        (folder / EVAL_RESULTS).write_text(json.dumps(metrics, indent=1))


def print_summary(output_dir: str | Path, trainer: Trainer | None = None, **fields: Any) -> None:
    """A training command's result: one JSON line on stdout (its logs go to stderr) with the output folder, the
    `trainer`'s steps and final training loss, and `fields`."""
    if trainer is not None:
        losses = [entry["train_loss"] for entry in trainer.state.log_history if "train_loss" in entry]
        fields = {"steps": trainer.state.global_step, "train_loss": losses[-1] if losses else None, **fields}
    print(json.dumps({"output_dir": str(output_dir), **fields}))
