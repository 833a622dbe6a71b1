"""Launched by `fsdp2_and_ddp_command_runs` (tests/fsdp2_training.py) under `torchrun --nproc_per_node 2`: one
`hf-ext` training command, run through `hf_ext.cli.main` on CPU over gloo, sharded by FSDP2 as `accelerate launch
--config_file docs/launch/accelerate_fsdp2_gpu.yaml` shards it (MODE fsdp2) or replicated by DDP (MODE ddp). Writes
what each rank saw to OUT/rank<N>.json: the command's exit code and, from the Trainer whose weights the command
saves (recorded when `hf_ext.trainer.trained_weights` gathers them), whether FSDP was on, its units and which
parameters were sharded.

In mode fsdp2 the accelerate state is set up as in tests/fsdp2_training.py, and every `TrainingArguments` the
command makes takes it (`accelerator_config={"use_configured_state": True}`, which a command never passes: on GPUs,
`accelerate launch` hands the Trainer its FSDP plugin through the environment instead).

usage: fsdp2_command.py MODE HF_EXT_ARGUMENTS... OUT
"""

import json
import os
import sys
from pathlib import Path

import torch
from transformers import TrainingArguments

import hf_ext.trainer
from hf_ext.cli import main as hf_ext_main


def take_the_configured_state() -> None:
    """Make every `TrainingArguments` from now on use the accelerate state set up before it."""
    post_init = TrainingArguments.__post_init__

    def with_configured_state(self):
        assert self.accelerator_config is None, "a command passed accelerator_config: merge, do not replace it"
        self.accelerator_config = {"use_configured_state": True}
        post_init(self)

    TrainingArguments.__post_init__ = with_configured_state


def record_the_saved_trainer(record: dict) -> None:
    """Wrap `hf_ext.trainer.trained_weights` (which `training_run_output` calls) to note, in `record`, how the
    Trainer held the model whose weights the command saves, just before they are gathered."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    trained_weights = hf_ext.trainer.trained_weights

    def recording(trainer, model):
        record.update(
            fsdp=trainer.is_fsdp_enabled,
            units=sorted(name for name, module in trainer.model.named_modules() if isinstance(module, FSDPModule)),
            parameters=sorted(name for name, _ in trainer.model.named_parameters()),
            sharded=sorted(name for name, parameter in trainer.model.named_parameters()
                           if isinstance(parameter, DTensor)))
        return trained_weights(trainer, model)

    hf_ext.trainer.trained_weights = recording


def main(mode, *argv_and_out):
    from fsdp2_training import MODES, use_fsdp2_on_cpu

    *argv, out = argv_and_out
    torch.set_num_threads(1)
    if mode == "fsdp2":
        use_fsdp2_on_cpu()
        take_the_configured_state()
    elif mode != "ddp":
        raise ValueError(f"mode {mode!r} is none of {MODES}")
    record: dict = {}
    record_the_saved_trainer(record)
    code = hf_ext_main(argv)
    # torchrun's RANK: a command that fails early may not have set up the process group
    Path(out, f"rank{os.environ['RANK']}.json").write_text(json.dumps({
        "exit_code": code,
        "world_size": torch.distributed.get_world_size() if torch.distributed.is_initialized() else None,
        **record}))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/, for the shared helpers and ending
    from distributed_script import run_then_leave

    run_then_leave(main, *sys.argv[1:])
