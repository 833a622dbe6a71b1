"""What the FSDP2 training scripts (tests/*/*_fsdp2_train.py) and their tests share: a model's own Trainer run under
`torchrun --nproc-per-node 2` on CPU over gloo, sharded by FSDP2 as `accelerate launch --config_file
docs/launch/accelerate_fsdp2_gpu.yaml` shards it (mode fsdp2) or replicated by DDP (mode ddp), then compared.

accelerate turns FSDP on for accelerator devices only (on CPU, `accelerate launch` with that config trains with DDP),
so in mode fsdp2 a script hands accelerate's state the config's FSDP2 plugin before the Trainer starts
(`trainer_settings`): the Trainer and accelerate then take their FSDP2 path (`fsdp2_prepare_model`, sharded optimizer
state) as on GPUs, in float32 (the config's bf16 is a GPU setting).

In a script: `trainer_settings(mode)` gives the `TrainingArguments` fields of the mode, `write_run(out, model,
log_history)` writes what each rank saw to OUT/rank<N>.json and the trained weights, gathered whole, to
OUT/weights.safetensors (rank 0). In a test: `fsdp2_and_ddp_runs(script, *args, out=...)` runs the script in both
modes and checks that FSDP2 trained exactly as DDP did."""

import json
from pathlib import Path
from typing import Any

import torch
import yaml

MODES = ("fsdp2", "ddp")
CONFIG = Path(__file__).resolve().parents[1] / "docs" / "launch" / "accelerate_fsdp2_gpu.yaml"
# FSDP2 reduces gradients in another order than DDP: the same run agrees within float32 rounding
TOLERANCE = 1e-5


def use_fsdp2_on_cpu() -> None:
    """What `accelerate launch` with the docs' FSDP2 config sets up on GPUs, on this CPU run."""
    from accelerate import Accelerator, PartialState
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    settings = yaml.safe_load(CONFIG.read_text())["fsdp_config"]
    state = Accelerator(cpu=True).state  # shared: the Trainer's Accelerator finds it set up (use_configured_state)
    # as accelerate records it for FSDP on GPUs: in its process state too, which its later states copy
    state.distributed_type = PartialState().distributed_type = DistributedType.FSDP
    state.fsdp_plugin = FullyShardedDataParallelPlugin(
        fsdp_version=settings["fsdp_version"], auto_wrap_policy=settings["fsdp_auto_wrap_policy"],
        reshard_after_forward=settings["fsdp_reshard_after_forward"], state_dict_type=settings["fsdp_state_dict_type"],
        cpu_ram_efficient_loading=settings["fsdp_cpu_ram_efficient_loading"])


def trainer_settings(mode: str) -> dict[str, Any]:
    """The `TrainingArguments` fields of a run in `mode` on CPU over gloo; for fsdp2, after setting up its state."""
    torch.set_num_threads(1)
    settings: dict[str, Any] = {"use_cpu": True, "ddp_backend": "gloo", "disable_tqdm": True}
    if mode == "fsdp2":
        use_fsdp2_on_cpu()
        # transformers' own switch for a Trainer that takes accelerate's state as it was set up before it
        settings["accelerator_config"] = {"use_configured_state": True}
    elif mode != "ddp":
        raise ValueError(f"mode {mode!r} is none of {MODES}")
    return settings


def full_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter of `model`, whole: FSDP2's shards (DTensors) gathered from all ranks (a collective)."""
    from torch.distributed.tensor import DTensor

    return {name: (parameter.full_tensor() if isinstance(parameter, DTensor) else parameter).detach()
            for name, parameter in model.named_parameters()}


def write_run(out: str | Path, model: torch.nn.Module, log_history: list[dict], **extra: Any) -> None:
    """Write what this rank saw of the run of `model` (the module the Trainer trained in place: FSDP2 shards it, DDP
    wraps it), whose Trainer logged `log_history`, to OUT/rank<N>.json, with `extra`; rank 0 also writes the weights,
    whole, to OUT/weights.safetensors."""
    from safetensors.torch import save_file
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    weights = full_weights(model)
    rank = torch.distributed.get_rank()
    Path(out, f"rank{rank}.json").write_text(json.dumps({
        "world_size": torch.distributed.get_world_size(),
        "losses": [entry["loss"] for entry in log_history if "loss" in entry],
        "units": sorted(name for name, module in model.named_modules() if isinstance(module, FSDPModule)),
        "sharded": sorted(name for name, parameter in model.named_parameters() if isinstance(parameter, DTensor)),
        "weights_checksum": sum(weight.double().sum().item() for weight in weights.values()),
        **extra,
    }))
    if rank == 0:
        save_file({name: weight.contiguous() for name, weight in weights.items()}, Path(out) / "weights.safetensors")


def fsdp2_and_ddp_runs(script: str, *args: Any, out: Path) -> tuple[dict[str, dict], dict[str, dict]]:
    """Run `script` (a path under tests/, taking MODE then `args` then OUT) in both modes under torchrun, into
    `out`/<mode>; check that both ranks saw the same, that FSDP2 sharded every parameter (DDP none) and that its
    losses and weights equal DDP's within `TOLERANCE`. Returns each mode's rank-0 result and weights."""
    from conftest import run_torchrun
    from safetensors.torch import load_file

    runs, weights = {}, {}
    for mode in MODES:
        ranks, _ = run_torchrun(script, mode, *args, out / mode)
        assert ranks[0] == ranks[1]  # the same losses, weights, units and extra on both ranks
        assert ranks[0]["world_size"] == 2
        runs[mode] = ranks[0]
        weights[mode] = load_file(out / mode / "weights.safetensors")
    fsdp2, ddp = runs["fsdp2"], runs["ddp"]
    assert fsdp2["units"] and not ddp["units"]
    assert fsdp2["sharded"] == sorted(weights["fsdp2"]) and not ddp["sharded"]
    assert len(fsdp2["losses"]) == len(ddp["losses"]) > 1
    torch.testing.assert_close(torch.tensor(fsdp2["losses"]), torch.tensor(ddp["losses"]), atol=TOLERANCE,
                               rtol=TOLERANCE)
    assert weights["fsdp2"].keys() == weights["ddp"].keys()
    for name, weight in weights["fsdp2"].items():
        torch.testing.assert_close(weight, weights["ddp"][name], atol=TOLERANCE, rtol=TOLERANCE, msg=name)
    return runs, weights
