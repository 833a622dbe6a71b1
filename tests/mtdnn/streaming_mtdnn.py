"""Streamed MT-DNN training data for the streaming tests and their `torchrun` script: JSON-lines shards (the
original's preprocessed rows) of three tasks of different shapes, a classification, a regression and a ranking task,
whose every row is told apart by its own token and whose labels follow from another token (so that a tiny model
learns them); the tiny model's config, and a collator that records every batch it pads."""

import json
from pathlib import Path

from transformers import BertConfig

from hf_ext.models.mtdnn.data import MTDNNCollator
from hf_ext.models.mtdnn.task_defs import config_from_task_def_yaml

TASK_DEF = """\
cls:
  data_format: PremiseOnly
  enable_san: false
  n_class: 2
  task_type: Classification
sts:
  data_format: PremiseAndOneHypothesis
  enable_san: false
  n_class: 1
  task_type: Regression
rank:
  data_format: PremiseAndMultiHypothesis
  enable_san: false
  labels: [not_entailment, entailment]
  n_class: 1
  task_type: Ranking
"""
TASKS = ("cls", "sts", "rank")
FIRST_ROW_TOKEN = 20  # row n of a task holds token FIRST_ROW_TOKEN + n
VOCAB_SIZE = 160


def row(task: str, n: int) -> dict:
    """Row `n` of `task`: [CLS] label-marker row-token [SEP] (classification), a pair whose hypothesis marks the
    score (regression), or two candidates of which the labelled one holds token 11 (ranking)."""
    mark = FIRST_ROW_TOKEN + n
    if task == "cls":
        return {"uid": f"cls-{n}", "label": n % 2, "token_id": [2, 5 + n % 2, mark, 3], "type_id": [0] * 4}
    if task == "sts":
        return {"uid": f"sts-{n}", "label": float(n % 3), "token_id": [2, mark, 3, 7 + n % 3, 3],
                "type_id": [0, 0, 0, 1, 1]}
    label = n % 2
    return {"uid": f"rank-{n}", "label": label,
            "token_id": [[2, mark, 3, 11 if label == i else 12, 3] for i in range(2)],
            "type_id": [[0, 0, 0, 1, 1]] * 2}


def write_shards(folder: Path, shards: int = 4, rows_per_shard: int = 6) -> dict[str, Path]:
    """`{task: folder of its shards}`: `shards` files `shard-<i>.jsonl` of `rows_per_shard` rows for every task."""
    sources = {}
    for task in TASKS:
        sources[task] = folder / task
        sources[task].mkdir(parents=True, exist_ok=True)
        for shard in range(shards):
            rows = [row(task, shard * rows_per_shard + i) for i in range(rows_per_shard)]
            (sources[task] / f"shard-{shard}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return sources


def tiny_config():
    encoder = BertConfig(vocab_size=VOCAB_SIZE, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=24, max_position_embeddings=32)
    return config_from_task_def_yaml(TASK_DEF, encoder)


class RecordingCollator(MTDNNCollator):
    """Keeps every batch it pads, as its rows' `[task, input ids as JSON]` (`batches`; a data loader reads a batch
    ahead of the step it trains)."""

    def __init__(self):
        super().__init__()
        self.batches = []

    def __call__(self, features):
        self.batches.append([[int(feature["task"]), json.dumps(feature["input_ids"])] for feature in features])
        return super().__call__(features)


def batch_tasks(batches):
    """The tasks of each batch recorded by `RecordingCollator`."""
    return [sorted({task for task, _ in batch}) for batch in batches]
