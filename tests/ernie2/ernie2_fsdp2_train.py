"""Launched by tests/ernie2/test_ernie2_pretraining.py under `torchrun --nproc_per_node 2`: ERNIE 2.0 continual
pre-training of a tiny model with `continual_pretraining` (the run of `hf-ext ernie2 pretrain`) over two stages, on
CPU over gloo, sharded by FSDP2 as `accelerate launch --config_file docs/launch/accelerate_fsdp2_gpu.yaml` shards it
(MODE fsdp2) or replicated by DDP (MODE ddp); writes what each rank saw and the weights after the last stage as
tests/fsdp2_training.py describes, with the weights each stage saved (OUT/run/stage-<k>/model).

usage: ernie2_fsdp2_train.py MODE OUT
"""

import sys
from pathlib import Path

import torch
from streaming_corpus import document, tiny_config, tokenizer

from hf_ext.models.ernie2 import Ernie2ForPreTraining
from hf_ext.models.ernie2.data import documents_from_records, pretraining_datasets
from hf_ext.models.ernie2.schedule import ContinualSchedule
from hf_ext.models.ernie2.training import continual_pretraining
from hf_ext.trainer import training_arguments

SCHEDULE = {"stages": [{"steps": {"knowledge_masking": 2, "capitalization": 2}},
                       {"steps": {"knowledge_masking": 2, "sentence_reordering": 2}}]}


def main(mode, out):
    from fsdp2_training import trainer_settings, write_run

    settings = trainer_settings(mode)
    tok = tokenizer()
    config = tiny_config(len(tok))
    config.hidden_dropout_prob = config.attention_probs_dropout_prob = 0.0
    schedule = ContinualSchedule.from_dict(SCHEDULE)
    datasets = pretraining_datasets(tok, config, schedule, documents_from_records([document(i) for i in range(16)]),
                                    max_length=32, seed=0)
    torch.manual_seed(0)  # the same initial weights on both ranks
    model = Ernie2ForPreTraining(config)
    args = training_arguments(Path(out) / "run", per_device_train_batch_size=2, learning_rate=3e-3, logging_steps=1,
                              seed=0, **settings)
    trained, histories = continual_pretraining(model, schedule, datasets, args, processing_class=tok)
    assert trained is model  # trained in place through both stages
    write_run(out, model, [entry for history in histories for entry in history],
              stages=[entry["stage"] for history in histories for entry in history if "loss" in entry])


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for the shared helpers and ending
    from distributed_script import run_then_leave

    run_then_leave(main, *sys.argv[1:3])
