"""Launched by tests/mtdnn/test_mtdnn_streaming.py under `torchrun --nproc_per_node 2`: MT-DNN training of a tiny
model on the streamed task shards of DATA_DIR (`streaming_mtdnn.write_shards`) over gloo; writes what each rank read
and logged to OUT/rank<N>.json.

usage: mtdnn_stream_ddp_train.py DATA_DIR OUT
"""

import json
import sys
from pathlib import Path

import torch
from streaming_mtdnn import TASKS, RecordingCollator, tiny_config

from hf_ext.models.mtdnn import MTDNNModel
from hf_ext.models.mtdnn.data import read_task_stream
from hf_ext.models.mtdnn.training import train_mtdnn
from hf_ext.trainer import training_arguments


def main(data_dir, out):
    torch.set_num_threads(1)
    config = tiny_config()
    torch.manual_seed(0)  # the same initial weights on both ranks
    model = MTDNNModel(config)
    collator = RecordingCollator()
    args = training_arguments(Path(out) / "run", max_steps=6, per_device_train_batch_size=2, learning_rate=1e-3,
                              logging_steps=1, use_cpu=True, ddp_backend="gloo", seed=0, disable_tqdm=True)
    streams = {task: read_task_stream(Path(data_dir) / task, config, task) for task in TASKS}
    trainer = train_mtdnn(model, streams, args=args, data_collator=collator)
    checksum = sum(p.detach().double().sum().item() for p in model.parameters())
    Path(out, f"rank{args.process_index}.json").write_text(json.dumps({
        "world_size": args.world_size, "backend": torch.distributed.get_backend(),
        "batches": collator.batches, "log_history": trainer.state.log_history, "weights_checksum": checksum}))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for the shared ending
    from distributed_script import run_then_leave

    run_then_leave(main, *sys.argv[1:3])
