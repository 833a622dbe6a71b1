"""Launched by tests/test_universal_transformer_training.py under `torchrun --nproc_per_node 2`: trains a tiny
Universal Transformer seq2seq model with ACT on the reverse task for a few steps with `train_algorithmic` (the Trainer
hf-ext's commands use), on CPU over gloo, sharded by FSDP2 as `accelerate launch --config_file
docs/launch/accelerate_fsdp2_gpu.yaml` shards it (MODE fsdp2) or replicated by DDP (MODE ddp), and writes what each
rank saw to OUT/rank<N>.json and the trained weights, gathered whole, to OUT/weights.safetensors (rank 0).

accelerate turns FSDP on for accelerator devices only (on CPU, `accelerate launch` with that config trains with DDP),
so for MODE fsdp2 the script hands accelerate's state the config's FSDP2 plugin before the Trainer starts: the Trainer
and accelerate then take their FSDP2 path (`fsdp2_prepare_model`, sharded optimizer state) as on GPUs, in float32
(the config's bf16 is a GPU setting).

usage: universal_transformer_fsdp2_train.py MODE OUT
"""

import json
import sys
from pathlib import Path

import torch
import yaml
from safetensors.torch import save_file

from hf_ext import UniversalTransformerForSeq2SeqLM
from hf_ext.models.universal_transformer.training import algorithmic_config, algorithmic_dataset, train_algorithmic
from hf_ext.trainer import training_arguments

MAX_STEPS = 6
CONFIG = Path(__file__).resolve().parents[2] / "docs" / "launch" / "accelerate_fsdp2_gpu.yaml"


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


def main(mode, out):
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    torch.set_num_threads(1)
    settings = {}
    if mode == "fsdp2":
        use_fsdp2_on_cpu()
        # transformers' own switch for a Trainer that takes accelerate's state as it was set up before it
        settings["accelerator_config"] = {"use_configured_state": True}
    args = training_arguments(Path(out) / f"trainer-{mode}", max_steps=MAX_STEPS, per_device_train_batch_size=4,
                              learning_rate=3e-3, warmup_steps=0, logging_steps=1, seed=0, use_cpu=True,
                              ddp_backend="gloo", disable_tqdm=True, **settings)
    config = algorithmic_config(hidden_size=16, num_attention_heads=2, intermediate_size=32, act_max_steps=4,
                                dropout=0.0)
    torch.manual_seed(0)
    model = UniversalTransformerForSeq2SeqLM(config)
    dataset = algorithmic_dataset("reverse", 64, 1, 8, seed=0)
    trainer = train_algorithmic(model, dataset, args=args)  # FSDP2 shards `model` in place; DDP wraps it
    weights = {name: (parameter.full_tensor() if isinstance(parameter, DTensor) else parameter).detach()
               for name, parameter in model.named_parameters()}
    rank = trainer.args.process_index
    Path(out, f"rank{rank}.json").write_text(json.dumps({
        "world_size": trainer.args.world_size, "global_step": trainer.state.global_step,
        "losses": [entry["loss"] for entry in trainer.state.log_history if "loss" in entry],
        "units": sorted(name for name, module in model.named_modules() if isinstance(module, FSDPModule)),
        "sharded": sorted(name for name, parameter in model.named_parameters() if isinstance(parameter, DTensor)),
        "tied": model.lm_head.weight is model.embed_tokens.weight,
        "weights_checksum": sum(weight.double().sum().item() for weight in weights.values()),
    }))
    if rank == 0:
        save_file({name: weight.contiguous() for name, weight in weights.items()}, Path(out) / "weights.safetensors")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for the shared ending
    from distributed_script import run_then_leave

    run_then_leave(main, sys.argv[1], sys.argv[2])
