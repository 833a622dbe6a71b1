"""Launched by tests/test_optimus_training.py under `torchrun --nproc_per_node 2`: fine-tunes an Optimus model folder
with `OptimusTrainer` on CPU over gloo and writes what each rank saw to OUT/rank<N>.json.

usage: optimus_ddp_train.py MODEL_DIR TRAIN_TXT OUT
"""

import json
import sys
from pathlib import Path

import torch
from transformers import AutoModel, AutoProcessor, TrainingArguments

import hf_ext  # noqa: F401  (registers the Auto classes)
from hf_ext.models.optimus.training import (
    BetaScheduleCallback,
    OptimusDataCollator,
    OptimusTrainer,
    load_text_dataset,
)


def main(model_dir, train_file, out):
    model = AutoModel.from_pretrained(model_dir)
    processor = AutoProcessor.from_pretrained(model_dir)
    args = TrainingArguments(output_dir=str(Path(out) / "trainer"), max_steps=6, per_device_train_batch_size=4,
                             learning_rate=1e-3, logging_steps=2, use_cpu=True, ddp_backend="gloo", seed=0,
                             save_strategy="no", report_to=[], disable_tqdm=True)
    trainer = OptimusTrainer(model=model, args=args, train_dataset=load_text_dataset(train_file),
                             data_collator=OptimusDataCollator(processor, max_length=24),
                             callbacks=[BetaScheduleCallback(n_cycles=2, ratio_zero=0.0, ratio_increase=0.5)])
    result = trainer.train()
    # DDP keeps the replicas identical: every rank must end with the same weights
    checksum = sum(p.detach().double().sum().item() for p in model.parameters())
    Path(out, f"rank{args.process_index}.json").write_text(json.dumps({
        "world_size": args.world_size, "global_step": result.global_step, "train_loss": result.training_loss,
        "log_history": trainer.state.log_history, "weights_checksum": checksum,
        "backend": torch.distributed.get_backend() if torch.distributed.is_initialized() else None,
    }))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for the shared ending
    from distributed_script import run_then_leave

    run_then_leave(main, *sys.argv[1:4])
