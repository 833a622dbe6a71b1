"""Launched by tests/test_universal_transformer_training.py under `torchrun --nproc_per_node 2`: trains a tiny
Universal Transformer with ACT on the reverse task on CPU over gloo (DDP with `find_unused_parameters=False`, so a
parameter left without a gradient on one rank would fail the run) and writes what each rank saw to OUT/rank<N>.json,
including how many ACT steps the encoder and decoder loops took at every training step.

usage: universal_transformer_ddp_train.py OUT
"""

import json
import sys
from pathlib import Path

import torch

from hf_ext import UniversalTransformerForSeq2SeqLM
from hf_ext.models.universal_transformer.training import algorithmic_config, algorithmic_dataset, train_algorithmic

MAX_STEPS = 8


def main(out):
    config = algorithmic_config(hidden_size=16, num_attention_heads=2, intermediate_size=32, act_max_steps=8,
                                dropout=0.0)
    torch.manual_seed(0)
    model = UniversalTransformerForSeq2SeqLM(config)
    with torch.no_grad():  # a halting unit that reads the state strongly: positions halt at very different steps
        generator = torch.Generator().manual_seed(1)
        for stack in (model.encoder, model.decoder):
            stack.halting.weight.copy_(torch.randn(stack.halting.weight.shape, generator=generator))
            stack.halting.bias.fill_(-1.0)
    loop_steps = {"encoder": [], "decoder": []}
    for side in loop_steps:
        def record(module, inputs, output, side=side):
            if module.training:
                loop_steps[side].append(int(output.n_updates.max()))
        getattr(model, side).register_forward_hook(record)
    dataset = algorithmic_dataset("reverse", 64, 1, 12, seed=0)
    trainer = train_algorithmic(model, dataset, Path(out) / "trainer", MAX_STEPS, batch_size=4, logging_steps=2,
                                use_cpu=True, ddp_backend="gloo", ddp_find_unused_parameters=False,
                                disable_tqdm=True)
    args = trainer.args
    # DDP keeps the replicas identical: every rank must end with the same weights
    checksum = sum(p.detach().double().sum().item() for p in model.parameters())
    Path(out, f"rank{args.process_index}.json").write_text(json.dumps({
        "world_size": args.world_size, "global_step": trainer.state.global_step,
        "log_history": trainer.state.log_history, "weights_checksum": checksum, "loop_steps": loop_steps,
        "backend": torch.distributed.get_backend() if torch.distributed.is_initialized() else None,
    }))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for the shared ending
    from distributed_script import run_then_leave

    run_then_leave(main, sys.argv[1])
