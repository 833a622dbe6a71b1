"""Launched by tests/optimus/test_optimus_training.py under `torchrun --nproc_per_node 2`: VAE fine-tuning of an
Optimus model folder with `finetune_optimus` (the run of `hf-ext optimus train`: cyclical KL schedule, free bits), on
CPU over gloo, sharded by FSDP2 as `accelerate launch --config_file docs/launch/accelerate_fsdp2_gpu.yaml` shards it
(MODE fsdp2) or replicated by DDP (MODE ddp); writes what each rank saw and the trained weights as
tests/fsdp2_training.py describes.

usage: optimus_fsdp2_train.py MODE MODEL_DIR TRAIN_TXT OUT
"""

import sys
from pathlib import Path

from transformers import AutoModel, AutoProcessor

import hf_ext  # noqa: F401  (registers the Auto classes)
from hf_ext.models.optimus.training import finetune_optimus, load_text_dataset

MAX_STEPS = 6


def main(mode, model_dir, train_file, out):
    from fsdp2_training import trainer_settings, write_run

    settings = trainer_settings(mode)
    model = AutoModel.from_pretrained(model_dir)
    processor = AutoProcessor.from_pretrained(model_dir)
    trainer = finetune_optimus(model, processor, load_text_dataset(train_file), Path(out) / "trainer",
                               max_steps=MAX_STEPS, batch_size=4, learning_rate=3e-3, n_cycles=1, ratio_zero=0.0,
                               ratio_increase=0.5, logging_steps=1, seed=0, max_length=24, print_logs=False,
                               **settings)
    logged = trainer.state.log_history
    write_run(out, model, logged, tied=model.get_output_embeddings().weight is model.get_input_embeddings().weight,
              beta=[entry["beta"] for entry in logged if "beta" in entry],
              loss_rec=[entry["loss_rec"] for entry in logged if "loss_rec" in entry])


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for the shared helpers and ending
    from distributed_script import run_then_leave

    run_then_leave(main, *sys.argv[1:5])
