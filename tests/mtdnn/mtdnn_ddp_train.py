"""Launched by tests/test_mtdnn_training.py under `torchrun --nproc_per_node 2`: multi-task fine-tuning of a tiny
MT-DNN model (linear, regression, SAN and ranking heads) with `MTDNNTrainer` on CPU over gloo, on the original's
preprocessed JSON lines; writes what each rank saw to OUT/rank<N>.json.

usage: mtdnn_ddp_train.py TASK_DEF_YML DATA_DIR OUT
"""

import json
import sys
from pathlib import Path

import torch
from transformers import BertConfig, TrainingArguments

from hf_ext.models.mtdnn import MTDNNModel
from hf_ext.models.mtdnn.data import load_mtdnn_json
from hf_ext.models.mtdnn.task_defs import config_from_task_def_yaml
from hf_ext.models.mtdnn.training import MTDNNTrainer

TASKS = ["mnli", "cola", "qnnli", "stsb"]


def main(task_def, data_dir, out):
    encoder = BertConfig(vocab_size=99, hidden_size=24, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=40, max_position_embeddings=48)
    config = config_from_task_def_yaml(task_def, encoder, task_names=TASKS, san={"num_turns": 2})
    torch.manual_seed(0)  # the same initial weights on both ranks
    model = MTDNNModel(config)
    data = {task: load_mtdnn_json(Path(data_dir) / f"{task}_dev.json", config, task) for task in TASKS}
    args = TrainingArguments(output_dir=str(Path(out) / "trainer"), num_train_epochs=2, per_device_train_batch_size=2,
                             learning_rate=1e-3, logging_steps=1, use_cpu=True, ddp_backend="gloo", seed=3,
                             save_strategy="no", report_to=[], disable_tqdm=True)
    trainer = MTDNNTrainer(model=model, args=args, train_dataset=data, mix_opt=0)
    result = trainer.train()
    # DDP keeps the replicas identical: every rank must end with the same weights
    checksum = sum(p.detach().double().sum().item() for p in model.parameters())
    Path(out, f"rank{args.process_index}.json").write_text(json.dumps({
        "world_size": args.world_size, "global_step": result.global_step, "train_loss": result.training_loss,
        "log_history": trainer.state.log_history, "weights_checksum": checksum,
        "find_unused_parameters": trainer.args.ddp_find_unused_parameters,
        "backend": torch.distributed.get_backend() if torch.distributed.is_initialized() else None,
    }))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for the shared ending
    from distributed_script import run_then_leave

    run_then_leave(main, *sys.argv[1:4])
