"""Launched by tests/mtdnn/test_mtdnn_training.py under `torchrun --nproc_per_node 2`: multi-task fine-tuning of a
tiny MT-DNN model (linear, regression, SAN and ranking heads) with `train_mtdnn` (the run of `hf-ext mtdnn train`) on
the original's preprocessed JSON lines, on CPU over gloo, sharded by FSDP2 as `accelerate launch --config_file
docs/launch/accelerate_fsdp2_gpu.yaml` shards it (MODE fsdp2) or replicated by DDP (MODE ddp); writes what each rank
saw and the trained weights as tests/fsdp2_training.py describes.

usage: mtdnn_fsdp2_train.py MODE TASK_DEF_YML DATA_DIR OUT
"""

import sys
from pathlib import Path

import torch
from transformers import BertConfig

from hf_ext.models.mtdnn import MTDNNModel
from hf_ext.models.mtdnn.data import load_mtdnn_json
from hf_ext.models.mtdnn.task_defs import config_from_task_def_yaml
from hf_ext.models.mtdnn.training import train_mtdnn
from hf_ext.trainer import training_arguments

TASKS = ["mnli", "cola", "qnnli", "stsb"]
MAX_STEPS = 8


def main(mode, task_def, data_dir, out):
    from fsdp2_training import trainer_settings, write_run

    settings = trainer_settings(mode)
    encoder = BertConfig(vocab_size=99, hidden_size=24, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=40, max_position_embeddings=48, hidden_dropout_prob=0.0,
                         attention_probs_dropout_prob=0.0)
    config = config_from_task_def_yaml(task_def, encoder, task_names=TASKS, san={"num_turns": 2})
    torch.manual_seed(0)  # the same initial weights on both ranks
    model = MTDNNModel(config)
    data = {task: load_mtdnn_json(Path(data_dir) / f"{task}_dev.json", config, task) for task in TASKS}
    args = training_arguments(Path(out) / "trainer", max_steps=MAX_STEPS, per_device_train_batch_size=2,
                              learning_rate=3e-3, logging_steps=1, seed=3, **settings)
    trainer = train_mtdnn(model, data, args=args, mix_opt=0)
    # the task of each step, from its logged loss (`loss_<task>`)
    write_run(out, model, trainer.state.log_history, tasks=[next(key[5:] for key in entry if key.startswith("loss_"))
                                          for entry in trainer.state.log_history if "loss" in entry])


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for the shared helpers and ending
    from distributed_script import run_then_leave

    run_then_leave(main, *sys.argv[1:5])
