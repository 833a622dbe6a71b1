"""How a training command reports its run (`hf_ext.cli_utils.add_run_reporting_arguments`): `--report-to` names the
trackers Trainer reports to, and the logs go to stderr as JSON lines, under Trainer's progress bar (steps, rate, time
left) when stderr is a terminal and the run is not `--quiet`; stdout keeps only the command's result."""

import argparse
import json
import sys

import pytest
import torch
from transformers import PrinterCallback, ProgressCallback, Trainer

from hf_ext.arguments import report_targets
from hf_ext.cli_utils import add_run_reporting_arguments, run_reporting_settings
from hf_ext.trainer import StderrLogCallback, StderrProgressCallback, send_logs_to_stderr, training_arguments


class Scale(torch.nn.Module):
    """One weight fitted to y = 2x."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))

    def forward(self, x, labels):
        return {"loss": ((self.weight * x - labels) ** 2).mean()}


def test_report_to_names_trackers_trainer_knows():
    assert report_targets("tensorboard") == ["tensorboard"]
    assert report_targets(" tensorboard , wandb") == ["tensorboard", "wandb"]
    assert report_targets("none") == [] and report_targets("all") == ["all"]
    for text in ("tensorbord", "", ","):
        with pytest.raises(argparse.ArgumentTypeError, match="^unknown tracker .* \\(Trainer knows: all, none, "):
            report_targets(text)


@pytest.mark.parametrize("terminal, verbosity, bar", [(True, 0, True), (True, 1, True), (True, -1, False),
                                                      (False, 0, False)])
def test_a_progress_bar_only_at_a_terminal_and_not_when_quiet(monkeypatch, terminal, verbosity, bar):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: terminal)
    parser = argparse.ArgumentParser()
    add_run_reporting_arguments(parser)
    assert parser.parse_args([]).report_to == []
    args = parser.parse_args(["--report-to", "tensorboard"])
    args.verbosity = verbosity
    assert run_reporting_settings(args) == {"report_to": ["tensorboard"], "disable_tqdm": not bar}


@pytest.mark.parametrize("bar", [True, False], ids=["at a terminal", "in a pipe"])
def test_logs_go_to_stderr_as_json_lines_under_the_bar(tmp_path, capsys, bar):
    rows = [{"x": torch.tensor(1.0), "labels": torch.tensor(2.0)}] * 8
    args = training_arguments(tmp_path, max_steps=4, per_device_train_batch_size=2, logging_steps=2,
                              learning_rate=0.1, disable_tqdm=not bar, use_cpu=True)
    trainer = Trainer(model=Scale(), args=args, train_dataset=rows)
    send_logs_to_stderr(trainer)
    kinds = {type(callback) for callback in trainer.callback_handler.callbacks}
    assert PrinterCallback not in kinds and ProgressCallback not in kinds and StderrLogCallback in kinds
    assert (StderrProgressCallback in kinds) is bar
    trainer.train()
    out, err = capsys.readouterr()
    assert out == ""
    logged = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    assert [entry["step"] for entry in logged if "loss" in entry] == [2, 4]
    assert logged[0]["loss"] > logged[1]["loss"]  # it trains
    assert ("4/4 [" in err) is bar  # tqdm's bar: steps done, then [elapsed<left, rate]
