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
modes and checks that FSDP2 trained exactly as DDP did; `fsdp2_and_ddp_command_runs(argv, out=...)` does the same
for an `hf-ext` training command (tests/fsdp2_command.py) and the output folder it writes."""

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


def fsdp2_and_ddp_command_runs(argv: list, out: Path, model_class: Any = None) -> dict[str, dict]:
    """Run `hf-ext --quiet ARGV --output-dir OUT/<mode>/model` (a training command) under torchrun in both modes
    (tests/fsdp2_command.py) and check what it wrote: both processes exit 0, the main one alone prints the summary
    line and writes the folder, once (nothing else beside it), from a model that FSDP2 sharded (DDP not at all); the
    folder loads (`model_class.from_pretrained`, by default `AutoModel`'s) with no weight missing, unexpected or
    mismatched, every saved weight has the loaded model's shape (whole, not a shard), and FSDP2's equal DDP's within
    `TOLERANCE`. Returns each mode's summary line, with the folder's weights under "weights"."""
    from conftest import run_torchrun
    from safetensors.torch import load_file
    from transformers import AutoModel

    summaries = {}
    for mode in MODES:
        results = out / mode
        results.mkdir(parents=True)
        folder = results / "model"
        ranks, run = run_torchrun("fsdp2_command.py", mode, "--quiet", *argv, "--output-dir", folder, results)
        assert [rank["exit_code"] for rank in ranks] == [0, 0], run.stderr[-3000:]
        assert ranks[0] == ranks[1] and ranks[0]["world_size"] == 2
        trainer = ranks[0]
        if mode == "fsdp2":
            # FSDP2 keeps the root unit's parameters whole after a forward pass (the evaluation's, say): those of
            # every other unit are sharded when the command saves
            in_units = [name for name in trainer["parameters"]
                        if any(name.startswith(f"{unit}.") for unit in trainer["units"] if unit)]
            assert trainer["fsdp"] and in_units and set(in_units) <= set(trainer["sharded"])
        else:
            assert not trainer["fsdp"] and trainer["units"] == trainer["sharded"] == []
        [summary] = [json.loads(line) for line in run.stdout.splitlines()]
        assert summary["output_dir"] == str(folder)
        assert sorted(path.name for path in results.iterdir()) == ["model", "rank0.json", "rank1.json"]
        model, info = (model_class or AutoModel).from_pretrained(folder, output_loading_info=True)
        assert not any(info.values()), info  # no weight missing, unexpected or mismatched, no error
        expected = model.state_dict()
        summary["weights"] = load_file(folder / "model.safetensors")
        for name, weight in summary["weights"].items():
            assert weight.shape == expected[name].shape, name
        summaries[mode] = summary
    fsdp2, ddp = summaries["fsdp2"]["weights"], summaries["ddp"]["weights"]
    assert fsdp2.keys() == ddp.keys()
    for name, weight in fsdp2.items():
        torch.testing.assert_close(weight, ddp[name], atol=TOLERANCE, rtol=TOLERANCE, msg=name)
    return summaries
