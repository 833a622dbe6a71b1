"""What every model's training here shares: logging named loss terms beside the loss, JSON log lines on stderr for
command-line runs, and PEFT calls without its expected warnings."""

import contextlib
import json
import re
import warnings

import torch
from transformers import PrinterCallback, Trainer, TrainerCallback

from ..export import log


class StderrLogCallback(TrainerCallback):
    """Writes each log entry as one JSON line on stderr, for command-line runs whose stdout is machine-readable
    (use it instead of the `PrinterCallback`/`ProgressCallback` that `Trainer` installs)."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and logs:
            log(json.dumps({"step": state.global_step, **logs}))


def send_logs_to_stderr(trainer):
    """Send `trainer`'s logs to stderr as JSON lines instead of printing them on stdout."""
    trainer.remove_callback(PrinterCallback)
    trainer.add_callback(StderrLogCallback())


class TermMeans:
    """Running sums and counts of a fixed list of named terms, kept on the device and reduced across processes only
    when read, so that a logging window costs one collective. The list is fixed so that every process reduces the
    same tensor, whichever terms its own batches produced."""

    def __init__(self, names, device):
        self.names = list(names)
        self.index = {name: i for i, name in enumerate(self.names)}
        dtype = torch.float32 if torch.device(device).type == "mps" else torch.float64  # MPS has no float64
        self.totals = torch.zeros(2, len(self.names), dtype=dtype, device=device)

    def add(self, name, value, count=1):
        """Add `value` (a tensor: one term, or the sum of `count` of them) to the running sum of `name`."""
        i = self.index[name]
        self.totals[0, i] += value.detach().to(self.totals.dtype)
        self.totals[1, i] += count

    def reset(self):
        """Forget what was added (a window a previous run left unlogged)."""
        self.totals.zero_()

    def means(self, accelerator):
        """`{name: mean}` over every process of the terms added since the last call (names never added are left
        out), then starts again. Every process must call it."""
        sums, counts = accelerator.reduce(self.totals.clone(), reduction="sum").tolist()
        self.reset()
        return {name: total / count for name, total, count in zip(self.names, sums, counts) if count}


class TermLoggingTrainer(Trainer):
    """`Trainer` that logs named terms beside the loss (`logged_terms`): training logs the mean of each over the
    logging window and the processes, evaluation `eval_<name>`, the mean over the evaluation and the processes.

    Subclasses report terms from `compute_loss` with `record_term`; a per-example tensor is averaged over the
    examples of the whole evaluation, without the samples a distributed sampler repeats to even out the last batch.
    """

    def __init__(self, *args, logged_terms=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.train_terms = TermMeans(logged_terms, self.args.device)
        self.eval_terms = TermMeans(logged_terms, self.args.device)

    def record_term(self, model, name, value):
        """Add one batch's `name`: a scalar, or (at evaluation) one value per example."""
        if model.training or value.dim() == 0:
            (self.train_terms if model.training else self.eval_terms).add(name, value.mean())
        else:
            # every process holds the same gathered values, so sums and counts scale alike and the mean is exact
            gathered = self.accelerator.gather_for_metrics(value.detach())
            self.eval_terms.add(name, gathered.sum(), gathered.numel())

    def train(self, *args, **kwargs):
        self.train_terms.reset()  # a window a previous run left unlogged
        return super().train(*args, **kwargs)

    def log(self, logs, start_time=None):
        # `log` runs on every process, so the reductions pair up across ranks
        if "loss" in logs:
            logs.update(self.train_terms.means(self.accelerator))
        super().log(logs, start_time)

    def evaluation_loop(self, dataloader, description, prediction_loss_only=None, ignore_keys=None,
                        metric_key_prefix="eval"):
        self.eval_terms.reset()
        output = super().evaluation_loop(dataloader, description, prediction_loss_only, ignore_keys,
                                         metric_key_prefix)
        output.metrics.update({f"{metric_key_prefix}_{name}": value
                               for name, value in self.eval_terms.means(self.accelerator).items()})
        return output


@contextlib.contextmanager
def quiet_peft():
    """PEFT without the warnings that need no action here: it reads transformers' deprecated
    `is_gradient_checkpointing`, and it warns for every layer whose type contradicts the config's single
    `fan_in_fan_out` before using the right value for that layer (expected with BERT Linear and GPT-2 Conv1D targets
    together)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing", category=FutureWarning)
        warnings.filterwarnings("ignore", message=re.escape("fan_in_fan_out is set to"))
        yield
