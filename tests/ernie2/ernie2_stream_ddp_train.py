"""Launched by tests/ernie2/test_ernie2_streaming.py under `torchrun` (two processes on one machine, or two
single-process "nodes" meeting at a c10d rendezvous): ERNIE 2.0 continual pre-training of a tiny model on the
streamed shards of CORPUS_DIR over gloo; writes what each rank read and logged to OUT/rank<N>.json.

usage: ernie2_stream_ddp_train.py CORPUS_DIR OUT
"""

import json
import os
import sys
from pathlib import Path

import torch
from streaming_corpus import RecordingCollator, tiny_config, tokenizer
from transformers import TrainingArguments

from hf_ext.models.ernie2 import Ernie2ForPreTraining
from hf_ext.models.ernie2.data import read_documents, task_streams
from hf_ext.models.ernie2.schedule import ContinualSchedule
from hf_ext.models.ernie2.training import continual_pretraining


def main(corpus, out):
    torch.set_num_threads(1)
    tok = tokenizer()
    config = tiny_config(len(tok))
    schedule = ContinualSchedule.from_dict({"stages": [{"steps": {"capitalization": 2, "knowledge_masking": 2}}]})
    streams = task_streams(tok, config, schedule, read_documents(corpus, streaming=True), max_length=32)
    torch.manual_seed(0)
    collator = RecordingCollator(config)
    args = TrainingArguments(output_dir=str(Path(out) / "run"), per_device_train_batch_size=2, logging_steps=1,
                             learning_rate=1e-3, use_cpu=True, ddp_backend="gloo", seed=0, save_strategy="no",
                             report_to=[], disable_tqdm=True)
    _, histories = continual_pretraining(Ernie2ForPreTraining(config), schedule, streams, args,
                                         data_collator=collator)
    rank = torch.distributed.get_rank()
    Path(out, f"rank{rank}.json").write_text(json.dumps({
        "world_size": torch.distributed.get_world_size(), "backend": torch.distributed.get_backend(),
        "node_rank": int(os.environ.get("GROUP_RANK", -1)), "seen": collator.seen, "log_history": histories[0]}))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for the shared ending
    from distributed_script import run_then_leave

    run_then_leave(main, *sys.argv[1:3])
