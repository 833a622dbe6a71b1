"""Launched by tests/universal_transformer/test_universal_transformer_training.py under `torchrun --nproc_per_node 2`:
trains a tiny Universal Transformer seq2seq model with ACT on the reverse task for a few steps with
`train_algorithmic` (the Trainer hf-ext's commands use), on CPU over gloo, sharded by FSDP2 as `accelerate launch
--config_file docs/launch/accelerate_fsdp2_gpu.yaml` shards it (MODE fsdp2) or replicated by DDP (MODE ddp); writes
what each rank saw and the trained weights as tests/fsdp2_training.py describes.

usage: universal_transformer_fsdp2_train.py MODE OUT
"""

import sys
from pathlib import Path

import torch

from hf_ext import UniversalTransformerForSeq2SeqLM
from hf_ext.models.universal_transformer.training import algorithmic_config, algorithmic_dataset, train_algorithmic
from hf_ext.trainer import training_arguments

MAX_STEPS = 6


def main(mode, out):
    from fsdp2_training import trainer_settings, write_run

    settings = trainer_settings(mode)
    args = training_arguments(Path(out) / f"trainer-{mode}", max_steps=MAX_STEPS, per_device_train_batch_size=4,
                              learning_rate=3e-3, warmup_steps=0, logging_steps=1, seed=0, **settings)
    config = algorithmic_config(hidden_size=16, num_attention_heads=2, intermediate_size=32, act_max_steps=4,
                                dropout=0.0)
    torch.manual_seed(0)
    model = UniversalTransformerForSeq2SeqLM(config)
    dataset = algorithmic_dataset("reverse", 64, 1, 8, seed=0)
    trainer = train_algorithmic(model, dataset, args=args)  # FSDP2 shards `model` in place; DDP wraps it
    write_run(out, model, trainer.state.log_history, tied=model.lm_head.weight is model.embed_tokens.weight)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for the shared helpers and ending
    from distributed_script import run_then_leave

    run_then_leave(main, sys.argv[1], sys.argv[2])
