"""The data of MT-DNN multi-task training: GLUE TSV files, the original's preprocessed JSON lines, and for the
token-level tasks CoNLL / Seqence files and SQuAD data (`token_tasks.py`), as `datasets`, one per task, their
collator, and the original's task-mixing batch sampler.

Facts from namisan/mt-dnn (HEAD 3228e7c): `mt_dnn/batcher.py` (MultiTaskBatchSampler, DistMultiTaskBatchSampler,
Collater), `experiments/glue/glue_utils.py` (the TSV layouts), `prepro_std.py` (the JSON-lines format).
"""

import bisect
import csv
import gzip
import itertools
import json
import random
from collections.abc import Iterable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase
from transformers.utils import logging

from ...errors import HfExtError, one_line, quoted
from ...glue import (
    encode_glue_examples,
    encode_ranking_groups,
    glue_examples,
    glue_header,
    glue_shape,
    ranking_groups,
    read_glue_tsv,
)
from ...text_files import json_lines
from .configuration_mtdnn import PAIR_FORMATS, SPAN_TASK_TYPES, MTDNNConfig, max_input_length
from .modeling_mtdnn import IGNORE_INDEX
from .token_tasks import (
    CONLL_SUFFIXES,
    article_examples,
    conll_sentences,
    encode_squad_examples,
    encode_tagged_sentences,
    read_squad_examples,
    read_tagged_sentences,
    sequence_row,
    squad_row_example,
)

if TYPE_CHECKING:  # datasets is imported only when used
    from datasets import Dataset, IterableDataset

logger = logging.get_logger(__name__)


def _task(config, task):
    try:
        spec = config.task(task)
    except ValueError as error:
        raise HfExtError(str(error)) from None
    return spec, config.task_index(spec["name"])


def load_glue_tsv(path: str | Path, config: MTDNNConfig, task: str | int, tokenizer: PreTrainedTokenizerBase,
                  max_length: int = 512, layout: str | None = None) -> "Dataset":
    """A GLUE-format TSV file as a tokenized `datasets.Dataset` for one task of an MT-DNN model: `read_glue_tsv`
    (`hf_ext.glue`) with the task's description from `config` (`task` is its name or index), plus the `task`
    column (the task's index)."""
    spec, index = _task(config, task)
    dataset = read_glue_tsv(path, spec, tokenizer, max_length, layout)
    return dataset.add_column("task", [index] * len(dataset))


def load_mtdnn_json(path: str | Path, config: MTDNNConfig, task: str | int, max_length: int | None = None,
                    ) -> "Dataset":
    """The original's preprocessed JSON lines (`prepro_std.py`: `uid`, `label`, `token_id`, `type_id`, optional
    `attention_mask` and `softlabel`) as a `datasets.Dataset` for one task of an MT-DNN model.

    Ranking rows hold the task's `group_size` candidates (`token_id` is a list of K token lists) and the index of the
    positive one as `label`; sequence-labeling rows one tag id per token (-1, the original's "no tag", reads as
    -100). With `max_length`, longer rows are dropped, as the original's training does. A `softlabel` field (soft
    targets for distillation) becomes the `soft_labels` column. Span tasks read SQuAD data (`load_squad_file`).
    """
    from datasets import Dataset

    spec, index = _task(config, task)
    if spec["type"] in SPAN_TASK_TYPES:
        raise HfExtError(f"{path}: span task {spec['name']} reads SQuAD data (a SQuAD .json file or .jsonl rows "
                         "with question, context and answers), not preprocessed token ids")
    columns: dict[str, list[Any]] = {"input_ids": [], "token_type_ids": [], "attention_mask": [], "labels": [],
                                     "soft_labels": []}
    dropped = 0
    for where, sample in json_lines(path, "JSON-lines file"):
        row = _json_row(sample, spec, config, where, max_length)
        if row is None:
            dropped += 1
            continue
        for name, value in row.items():
            columns[name].append(value)
    count = len(columns["input_ids"])
    if not count:
        limit = f" of at most {max_length} tokens" if dropped else ""
        raise HfExtError(f"JSON-lines file {path} has no rows{limit}")
    for name in ("labels", "soft_labels"):
        if len(columns[name]) not in (0, count):
            raise HfExtError(f"{path}: some rows have a {'label' if name == 'labels' else 'softlabel'} and some do not")
        if not columns[name]:
            del columns[name]
    if dropped:
        logger.warning(f"{path}: dropped {dropped} row(s) longer than {max_length} tokens")
    return Dataset.from_dict({**columns, "task": [index] * count})


def _json_row(sample: object, spec: dict[str, Any], config: MTDNNConfig, where: str, max_length: int | None = None,
              ) -> dict[str, Any] | None:
    """One row of the original's JSON lines as the model's columns (`labels` and `soft_labels` where the row has a
    `label` and a `softlabel`), checked against the task `spec` of `config`; None for a row longer than
    `max_length`. `where` names the row in errors."""
    if not isinstance(sample, dict) or "token_id" not in sample or "type_id" not in sample:
        raise HfExtError(f"{where}: a row needs token_id and type_id (the original's prepro_std.py format)")
    vocab_size = config.encoder.vocab_size
    pairs = spec["data_format"] in PAIR_FORMATS  # segment 1 holds the hypothesis
    ids, types = sample["token_id"], sample["type_id"]
    mask = sample.get("attention_mask")
    if spec["type"] == "ranking":
        if not (isinstance(ids, list) and len(ids) == spec["group_size"] and all(isinstance(r, list) for r in ids)):
            raise HfExtError(f"{where}: ranking task {spec['name']} needs {spec['group_size']} candidate token "
                             "lists per row")
        groups, type_groups = ids, types
        mask = mask if mask is not None else [[1] * len(row) for row in ids]
        mask_groups = mask
    else:
        groups, type_groups = [ids], [types]
        mask = mask if mask is not None else [1] * len(ids) if isinstance(ids, list) else None
        mask_groups = [mask]
    if not (isinstance(type_groups, list) and isinstance(mask_groups, list)
            and len(groups) == len(type_groups) == len(mask_groups)):
        raise HfExtError(f"{where}: token_id, type_id and attention_mask must have the same layout")
    for row, row_types, row_mask in zip(groups, type_groups, mask_groups, strict=True):
        if not (isinstance(row, list) and row and all(isinstance(t, int) for t in row)
                and isinstance(row_types, list) and isinstance(row_mask, list)
                and len(row) == len(row_types) == len(row_mask)):
            raise HfExtError(f"{where}: token_id, type_id and attention_mask must be equally long lists of ids")
        if max(row) >= vocab_size or min(row) < 0:
            raise HfExtError(f"{where}: token id {max(row)} is outside the model's vocabulary of {vocab_size}")
        if any(row_types) != pairs:
            raise HfExtError(f"{where}: a {'single sentence' if pairs else 'sentence pair'} where task "
                             f"{spec['name']} reads {spec['data_format']} rows (see type_id)")
    longest = max(len(row) for row in groups)
    if max_length is not None and longest > max_length:
        return None
    positions = max_input_length(config.encoder)
    if positions is not None and longest > positions:
        raise HfExtError(f"{where}: {longest} tokens, more than the {positions} the model's positions hold")
    columns = {"input_ids": ids, "token_type_ids": types, "attention_mask": mask}
    if "label" in sample:
        columns["labels"] = _json_label(sample["label"], spec, where, len(ids))
    if "softlabel" in sample:
        columns["soft_labels"] = _soft_label(sample["softlabel"], spec, where)
    return columns


def _json_label(value, spec, where, length):
    if spec["type"] == "sequence_labeling":
        if not (isinstance(value, list) and len(value) == length and all(
                not isinstance(tag, bool) and isinstance(tag, int) and -1 <= tag < spec["num_labels"]
                for tag in value)):
            raise HfExtError(f"{where}: label must be a list of {length} tag ids below {spec['num_labels']} (one per "
                             f"token; -1 for none) for task {spec['name']}")
        return [IGNORE_INDEX if tag == -1 else tag for tag in value]
    if spec["type"] == "regression":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise HfExtError(f"{where}: label {value!r} of regression task {spec['name']} is not a number")
        return float(value)
    classes = spec["group_size"] if spec["type"] == "ranking" else spec["num_labels"]
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < classes:
        what = "candidate index" if spec["type"] == "ranking" else "class id"
        raise HfExtError(f"{where}: label {value!r} is not a {what} below {classes}")
    return value


def _soft_label(value, spec, where):
    width = soft_label_width(spec)
    if not (isinstance(value, list) and len(value) == width and all(isinstance(v, (int, float)) for v in value)):
        raise HfExtError(f"{where}: softlabel must be a list of {width} numbers for task {spec['name']}")
    return [float(v) for v in value]


def soft_label_width(spec: dict[str, Any]) -> int:
    """Numbers per soft target: class probabilities, candidate probabilities (ranking) or one score (regression)."""
    if spec["type"] == "ranking":
        return spec["group_size"]
    return spec["num_labels"]  # 1 for regression


def load_sequence_labeling_file(path: str | Path, config: MTDNNConfig, task: str | int,
                                tokenizer: PreTrainedTokenizerBase, max_length: int = 512) -> "Dataset":
    """A CoNLL file or the original's Seqence TSV (`token_tasks.read_tagged_sentences`) as a tokenized
    `datasets.Dataset` for a sequence-labeling task of an MT-DNN model (`token_tasks.encode_tagged_sentences`)."""
    from datasets import Dataset

    spec, index = _task(config, task)
    if spec["type"] != "sequence_labeling":
        raise HfExtError(f"{path}: tagged words are data of a sequence labeling task, {spec['name']} is a "
                         f"{spec['type']} task")
    columns = encode_tagged_sentences(read_tagged_sentences(path), spec, tokenizer, max_length,
                                      where=lambda number: f"{path}, sentence {number}")
    return Dataset.from_dict({**columns, "task": [index] * len(columns["input_ids"])})


def load_squad_file(path: str | Path, config: MTDNNConfig, task: str | int, tokenizer: PreTrainedTokenizerBase,
                    max_length: int = 384, doc_stride: int | None = None) -> "Dataset":
    """SQuAD data (`token_tasks.read_squad_examples`) as a `datasets.Dataset` of tokenized windows for a span task of
    an MT-DNN model (`token_tasks.encode_squad_examples`: the model's inputs, `labels`, and the `example_id`,
    `offset_mapping`, `context` and `answers` columns that evaluation reads)."""
    from datasets import Dataset

    spec, index = _task(config, task)
    if spec["type"] not in SPAN_TASK_TYPES:
        raise HfExtError(f"{path}: questions with answers are data of a span task, {spec['name']} is a "
                         f"{spec['type']} task")
    columns = encode_squad_examples(read_squad_examples(path, spec), tokenizer, max_length, doc_stride)
    return Dataset.from_dict({**columns, "task": [index] * len(columns["input_ids"])})


def load_task_file(path: str | Path, config: MTDNNConfig, task: str | int,
                   tokenizer: PreTrainedTokenizerBase | None = None, max_length: int = 512,
                   layout: str | None = None, doc_stride: int | None = None) -> "Dataset":
    """The data of one task: for span tasks SQuAD data (`load_squad_file`); for sequence labeling CoNLL files and
    Seqence `.tsv` rows (`load_sequence_labeling_file`); otherwise `load_glue_tsv` for `.tsv` files; and
    `load_mtdnn_json` (already tokenized) for `.json`/`.jsonl` files."""
    suffix = Path(path).suffix.lower()
    spec, _ = _task(config, task)
    span = spec["type"] in SPAN_TASK_TYPES
    if span or (spec["type"] == "sequence_labeling" and suffix not in (".json", ".jsonl")):
        if tokenizer is None:
            raise HfExtError(f"{path}: {'SQuAD' if span else 'tagged text'} data needs a tokenizer")
        if span:
            return load_squad_file(path, config, task, tokenizer, max_length, doc_stride)
        return load_sequence_labeling_file(path, config, task, tokenizer, max_length)
    if suffix == ".tsv":
        if tokenizer is None:
            raise HfExtError(f"{path}: TSV data needs a tokenizer")
        return load_glue_tsv(path, config, task, tokenizer, max_length, layout)
    if suffix in (".json", ".jsonl"):
        return load_mtdnn_json(path, config, task)
    raise HfExtError(f"{path}: data files are GLUE .tsv files or the original's preprocessed .json lines")


class MTDNNCollator:
    """Pads one task's rows into a batch: `input_ids` (with `pad_token_id`), `token_type_ids` and `attention_mask`
    (0 on padding, on the right as the original's collater), `task`, and `labels`/`soft_labels` when present.
    Ranking rows (groups of K candidates) become K consecutive rows each, candidate-major, with one label per group.
    """

    def __init__(self, pad_token_id=0, pad_to_multiple_of=None):
        self.pad_token_id = pad_token_id
        self.pad_to_multiple_of = pad_to_multiple_of

    def __call__(self, features):
        tasks = {int(feature["task"]) for feature in features}
        if len(tasks) != 1:
            raise ValueError(f"a batch holds one task, this one mixes tasks {sorted(tasks)}")
        grouped = isinstance(features[0]["input_ids"][0], list)
        if grouped and len({len(feature["input_ids"]) for feature in features}) != 1:
            raise ValueError("the ranking groups of a batch must have the same number of candidates")
        keys = ("input_ids", "token_type_ids", "attention_mask")
        rows = [row for feature in features
                for row in (zip(*(feature[key] for key in keys), strict=True) if grouped
                            else [tuple(feature[key] for key in keys)])]
        width = max(len(ids) for ids, _, _ in rows)
        if self.pad_to_multiple_of:
            width = -(-width // self.pad_to_multiple_of) * self.pad_to_multiple_of
        input_ids = torch.full((len(rows), width), self.pad_token_id, dtype=torch.long)
        token_type_ids = torch.zeros((len(rows), width), dtype=torch.long)
        attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, (ids, types, mask) in enumerate(rows):
            input_ids[i, :len(ids)] = torch.tensor(ids)
            token_type_ids[i, :len(ids)] = torch.tensor(types)
            attention_mask[i, :len(ids)] = torch.tensor(mask)
        batch = {"input_ids": input_ids, "token_type_ids": token_type_ids, "attention_mask": attention_mask,
                 "task": torch.full((len(features),), tasks.pop(), dtype=torch.long)}
        if features[0].get("labels") is not None:
            labels = [feature["labels"] for feature in features]
            if isinstance(labels[0], list) and len(labels[0]) == len(features[0]["input_ids"]):  # a tag per token
                batch["labels"] = torch.full((len(rows), width), IGNORE_INDEX, dtype=torch.long)
                for i, tags in enumerate(labels):
                    batch["labels"][i, :len(tags)] = torch.tensor(tags)
            else:
                batch["labels"] = torch.tensor(labels)
        if features[0].get("soft_labels") is not None:
            batch["soft_labels"] = torch.tensor([feature["soft_labels"] for feature in features], dtype=torch.float32)
        return batch


class MultiTaskDataset(torch.utils.data.Dataset):
    """Task datasets side by side, addressed by one flat index (all rows of the first dataset, then the second's...).

    Args:
        datasets (`dict[str, datasets.Dataset]` or a list): one dataset per task, each with a `task` column holding
            one task. Their order is the sampler's task order: the first is the main task of `mix_opt=1` and
            `ratio > 0`, as the first of the original's `--train_datasets`.
    """

    def __init__(self, datasets):
        named = datasets if isinstance(datasets, dict) else {str(i): d for i, d in enumerate(datasets)}
        if not named:
            raise ValueError("give at least one task dataset")
        self.datasets = list(named.values())
        for name, dataset in named.items():
            if len(dataset) == 0:
                raise ValueError(f"task dataset {name} is empty")
            tasks = dataset.unique("task") if hasattr(dataset, "unique") else {row["task"] for row in dataset}
            if len(tasks) != 1:
                raise ValueError(f"task dataset {name} must hold one task (its task column has {sorted(tasks)})")
        self.task_sizes = [len(dataset) for dataset in self.datasets]
        self.offsets = [0, *itertools.accumulate(self.task_sizes)]

    def __len__(self):
        return self.offsets[-1]

    def locate(self, index: int) -> tuple[int, int]:
        """(dataset position, row) of a flat index."""
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} is out of range for {len(self)} rows")
        position = bisect.bisect_right(self.offsets, index) - 1
        return position, index - self.offsets[position]

    def __getitem__(self, index):
        position, row = self.locate(index)
        return self.datasets[position][row]

    def __getitems__(self, indices):
        located = [self.locate(index) for index in indices]
        positions = {position for position, _ in located}
        if len(positions) == 1 and hasattr(self.datasets[located[0][0]], "__getitems__"):
            return self.datasets[located[0][0]].__getitems__([row for _, row in located])
        return [self.datasets[position][row] for position, row in located]


def load_task_files(config: MTDNNConfig, train_files: Iterable[tuple[str, str | Path]],
                    eval_files: Iterable[tuple[str, str, str | Path]] = (),
                    tokenizer: PreTrainedTokenizerBase | None = None, max_length: int = 512,
                    layouts: Mapping[str, str] | None = None, doc_stride: int | None = None,
                   ) -> tuple[dict[str, "Dataset"], dict[str, "Dataset"]]:
    """The training and evaluation data of a multi-task run: `train_files` as `(task, path)` pairs and `eval_files`
    as `(task, name, path)` triples (a task may be evaluated on several files, e.g. MNLI matched and mismatched),
    read with `load_task_file` (`layouts` maps a task to the GLUE layout of its .tsv files). Returns the dicts
    `{task: dataset}` and `{name: dataset}` that `MTDNNTrainer` takes; every file must have labels."""
    layouts = layouts or {}

    def load(task, path):
        return load_task_file(path, config, task, tokenizer, max_length, layouts.get(task), doc_stride)

    train = {task: load(task, path) for task, path in train_files}
    evaluation = {name: load(task, path) for task, name, path in eval_files}
    unlabelled = [name for name, dataset in {**train, **evaluation}.items() if "labels" not in dataset.column_names]
    if unlabelled:
        raise HfExtError(f"the data of {', '.join(unlabelled)} has no labels")
    return train, evaluation


# ----- the original's task mixing ---------------------------------------------------------------------------------

def mixed_task_order(batches_per_task: Sequence[int], mix_opt: int, ratio: float, py_random: random.Random,
                     np_random: np.random.RandomState) -> list[int]:
    """The task of every batch of one epoch, as the original's `MultiTaskBatchSampler._gen_task_indices` with
    `random`/`numpy.random` replaced by the given generators (same calls, same order, so the same result):

    - `ratio == 0`: all batches of all tasks; `mix_opt=0` shuffles them all, `mix_opt=1` shuffles the auxiliary
      tasks' batches and puts all of task 0's last;
    - `ratio > 0`: all of task 0's batches plus `int(min(n0 * ratio, n_extra))` auxiliary batches drawn without
      replacement; `mix_opt=1` puts the shuffled extras first and task 0 last, `mix_opt=0` shuffles everything.
    """
    if len(batches_per_task) > 1 and ratio > 0:
        main = [0] * batches_per_task[0]
        extra = [task for task in range(1, len(batches_per_task)) for _ in range(batches_per_task[task])]
        picks = int(min(batches_per_task[0] * ratio, len(extra)))
        extra = np_random.choice(extra, picks, replace=False).tolist()
        if mix_opt > 0:
            py_random.shuffle(extra)
            order = extra + main
        else:
            order = main + extra
    else:
        order = [task for task in range(1, len(batches_per_task)) for _ in range(batches_per_task[task])]
        if mix_opt > 0:
            py_random.shuffle(order)
        order += [0] * batches_per_task[0]
    if mix_opt < 1:
        py_random.shuffle(order)
    return [int(task) for task in order]


class MultiTaskBatchSampler(torch.utils.data.Sampler):
    """The original's `MultiTaskBatchSampler`: every batch holds rows of one task; tasks are mixed by
    `mixed_task_order`.

    Each task's rows are cut into contiguous chunks of `batch_size`, whose order is shuffled once (as the original
    does when the sampler is built) and reused every epoch. Random draws come from `random.Random(seed)` and
    `numpy.random.RandomState(seed)` in the original's sequence (the chunk shuffles, then each epoch's task order),
    so the order of epoch `e` depends on the seed and `e` only: `set_epoch(e)` replays the draws of the epochs
    before it, and a run resumed from a checkpoint continues the same order. With `seed` the original's `--seed`, the
    order is the original's (nothing else in its training loop draws from `random` or `numpy.random`).

    Under distributed training each batch is split over the processes (the original's `DistMultiTaskBatchSampler`):
    `batch_size` is the global batch, every process trains the same task at every step, and a batch that does not
    divide evenly is completed with copies of its first row.

    Args:
        task_sizes (`list[int]`): rows of each task, in `MultiTaskDataset` order; indices are flat (task after task).
        batch_size (`int`): rows per batch over all processes.
        mix_opt (`int`), ratio (`float`): the original's `--mix_opt` (0 or 1) and `--ratio`.
        seed (`int`): the seed of the draws.
        rank (`int`), world_size (`int`): this process and the number of processes.
    """

    def __init__(self, task_sizes, batch_size, mix_opt=0, ratio=0.0, seed=0, rank=0, world_size=1):
        if not task_sizes or any(size < 1 for size in task_sizes):
            raise ValueError(f"every task needs at least one row, got sizes {list(task_sizes)}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        if mix_opt not in (0, 1):
            raise ValueError(f"mix_opt must be 0 or 1, got {mix_opt!r}")
        if not ratio >= 0:
            raise ValueError(f"ratio must be >= 0, got {ratio!r}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not below world_size {world_size}")
        self.task_sizes = list(task_sizes)
        self.batch_size = batch_size
        self.mix_opt = mix_opt
        self.ratio = ratio
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.epoch = 0
        py_random, np_random = random.Random(seed), np.random.RandomState(seed)
        offsets = [0, *itertools.accumulate(self.task_sizes)]
        self.chunks = []
        for offset, size in zip(offsets, self.task_sizes, strict=False):  # the offsets end with the total
            chunks = [list(range(offset + start, offset + min(start + batch_size, size)))
                      for start in range(0, size, batch_size)]
            py_random.shuffle(chunks)
            self.chunks.append(chunks)
        self._generators = [(py_random, np_random)]  # before epoch e's draws: index e
        self._orders = []

    @property
    def batches_per_task(self) -> list[int]:
        return [len(chunks) for chunks in self.chunks]

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def task_order(self, epoch: int) -> list[int]:
        """The task position of every batch of `epoch`."""
        while len(self._orders) <= epoch:
            py_random, np_random = self._generators[-1]
            py_random = _copy_generator(py_random)
            np_state = np.random.RandomState()
            np_state.set_state(np_random.get_state())
            self._orders.append(mixed_task_order(self.batches_per_task, self.mix_opt, self.ratio, py_random,
                                                 np_state))
            self._generators.append((py_random, np_state))
        return self._orders[epoch]

    def __len__(self):
        counts = self.batches_per_task
        if len(counts) > 1 and self.ratio > 0:
            return counts[0] + int(min(counts[0] * self.ratio, sum(counts[1:])))
        return sum(counts)

    def __iter__(self):
        chunks = [iter(task_chunks) for task_chunks in self.chunks]
        for task in self.task_order(self.epoch):
            batch = next(chunks[task])
            batch = batch + batch[:1] * (-len(batch) % self.world_size)
            share = len(batch) // self.world_size
            yield batch[self.rank * share:(self.rank + 1) * share]


def _copy_generator(generator):
    copy = random.Random()
    copy.setstate(generator.getstate())
    return copy


# ----- streamed training data ------------------------------------------------------------------------------------

STREAM_SUFFIXES = (".json", ".jsonl", ".json.gz", ".jsonl.gz")  # the original's preprocessed rows, SQuAD data
TSV_SUFFIX = ".tsv"
# the columns of a streamed task's rows (`read_task_stream`), which `mixed_task_batches` batches
STREAM_COLUMNS = ("input_ids", "token_type_ids", "attention_mask", "labels", "task")
SOFT_LABELS = "soft_labels"  # a streamed row's optional column
# how `datasets`' `csv` builder reads GLUE and Seqence TSV rows as `read_lines` does: fields as written (no quoting,
# no "NA" read as missing), a byte-order mark dropped; its python engine gives the fields a short line lacks as None
# (the C engine as empty text), which `_complete_rows` refuses
TSV_OPTIONS = {"sep": "\t", "quoting": csv.QUOTE_NONE, "keep_default_na": False, "engine": "python",
               "encoding": "utf-8-sig"}
SEQENCE_COLUMNS = ("uid", "tags", "words")  # the original's Seqence TSV rows
SQUAD_ROW_COLUMNS = ("id", "question", "context", "answers")  # the Hub's `squad` layout
ENCODE_BATCH_SIZE = 64  # rows (SQuAD: articles) tokenized at once while streaming


def stream_layout(source: str | Path, config: MTDNNConfig, task: str | int) -> tuple[str, list[str] | None]:
    """How `read_task_stream` reads the training data of `task` at `source` (a file, a folder of shards or a glob, in
    one format; else a Hub dataset id), and its files (None for a Hub dataset): `json`, the original's preprocessed
    JSON lines; `glue`, GLUE TSV rows; `glue_ranking`, GLUE TSV rows of a ranking task, paired file by file (the
    original's QNLI ranking); `seqence`, the original's Seqence TSV rows; `conll`, CoNLL sentences; `squad_document`,
    SQuAD JSON files (`{"data": [...]}`); `squad_rows`, SQuAD rows in the layout of the Hub's `squad` datasets (JSON
    lines or a Hub dataset). The formats are `load_task_file`'s, by the same suffixes."""
    from ...streaming import data_files

    spec, _ = _task(config, task)
    span = spec["type"] in SPAN_TASK_TYPES
    labeling = spec["type"] == "sequence_labeling"
    suffixes = STREAM_SUFFIXES + ((TSV_SUFFIX,) if not span else ()) + (CONLL_SUFFIXES if labeling else ())
    files = data_files(source, f"{spec['name']} training data", suffixes)
    if files is None:
        return ("squad_rows" if span else "json"), None
    unknown = [file for file in files if not file.lower().endswith(suffixes)]
    if unknown:
        file = unknown[0]
        if span:
            raise HfExtError(f"{file}: span task {spec['name']} reads SQuAD data (.json or .jsonl, also gzipped)")
        if labeling:
            raise HfExtError(f"{file}: sequence labeling data are CoNLL files ({', '.join(CONLL_SUFFIXES)}), the "
                             "original's Seqence .tsv rows or its preprocessed .json lines")
        raise HfExtError(f"{file}: data files are GLUE .tsv files or the original's preprocessed .json lines")
    formats = {next(suffix for suffix in suffixes if file.lower().endswith(suffix)) for file in files}
    kinds = {"tsv" if suffix == TSV_SUFFIX else "json" if suffix in STREAM_SUFFIXES else "conll"
             for suffix in formats}
    if len(kinds) > 1:
        raise HfExtError(f"the {spec['name']} training data {source} mixes formats ({', '.join(sorted(formats))}): "
                         "give one task's shards in one format")
    (kind,) = kinds
    if span:
        return ("squad_document" if _squad_document(files[0]) else "squad_rows"), files
    if kind == "tsv":
        if labeling:
            return "seqence", files
        return ("glue_ranking" if spec["type"] == "ranking" else "glue"), files
    return kind, files


def _squad_document(file: str) -> bool:
    """Whether the SQuAD file `file` is one JSON document (`{"data": [...]}`, often on one line or pretty-printed)
    rather than JSON lines of questions: its first line (the first MiB of it) is no JSON object without `data`."""
    with (gzip.open if file.endswith(".gz") else open)(file, "rt", encoding="utf-8-sig", errors="replace") as text:
        first = text.readline(1 << 20)
    try:
        row = json.loads(first)
    except json.JSONDecodeError:
        return True
    return not isinstance(row, dict) or "data" in row


def read_task_stream(source: str | Path, config: MTDNNConfig, task: str | int,
                     tokenizer: PreTrainedTokenizerBase | None = None, max_length: int = 512,
                     layout: str | None = None, doc_stride: int | None = None) -> "IterableDataset":
    """The training data of one task as a `datasets.IterableDataset` read while training, from a file, a folder of
    shards, a glob or a Hub dataset id, in any format `load_task_file` reads (`stream_layout`):

    - the original's preprocessed JSON lines (`load_mtdnn_json`'s rows, each with a `label`; a Hub dataset with those
      columns), checked as they are read as `load_mtdnn_json` checks them and named by their `uid` in errors; a row's
      `softlabel` (soft targets for distillation, e.g. written by teachers beforehand) becomes its `soft_labels`;
    - text, tokenized with `tokenizer` while it is read by `datasets`' streaming builders and a batched `map` with the
      map-style readers' own row functions: GLUE TSV rows (`csv` builder; `hf_ext.glue.glue_examples`,
      `encode_glue_examples`; every shard starts with the header, or none does in CoLA's headerless layout; `layout`
      as `load_glue_tsv`'s), the original's Seqence TSV rows (`csv`) and CoNLL sentences (`text` builder, a paragraph
      per sentence; `token_tasks.encode_tagged_sentences`), SQuAD JSON files or rows (`json` builder, a Hub `squad`
      dataset; `token_tasks.encode_squad_examples`: a question gives one row per window of `max_length` tokens, its
      evaluation columns left out). Rows are truncated to `max_length` tokens, as the map-style readers do.

    A malformed TSV line (fields missing or extra) fails as the reader's own errors do (`hf_ext.streaming`'s
    `StreamReadError` while training; `stream_corpus_error` names the line). A ranking task's GLUE TSV rows are
    paired file by file as `load_glue_tsv` pairs them (`hf_ext.glue.ranking_groups`: the original's QNLI ranking,
    rows 2i and 2i+1 of a file, the order of each pair shuffled by a generator seeded per file), a row per group:
    processes split the stream by groups, never inside one."""
    spec, index = _task(config, task)
    name = spec["name"]
    what = f"{name} training data"
    kind, files = stream_layout(source, config, task)
    if kind == "json":
        return _json_task_stream(source, config, spec, index)
    if tokenizer is None:
        text = {"glue": "TSV", "glue_ranking": "TSV", "seqence": "tagged text", "conll": "tagged text"}.get(
            kind, "SQuAD")
        raise HfExtError(f"{source}: {text} data needs a tokenizer")
    if kind == "glue":
        assert files is not None  # a Hub id reads as preprocessed rows
        rows, columns, encode = _glue_stream(files, spec, tokenizer, max_length, layout, what)
    elif kind == "glue_ranking":
        assert files is not None
        rows, columns, encode = _ranking_stream(files, spec, tokenizer, max_length, layout, what)
    elif kind in ("seqence", "conll"):
        assert files is not None
        rows, columns, encode = _tagged_stream(kind, files, spec, tokenizer, max_length, what)
    else:
        rows, columns, encode = _squad_stream(kind, source, files, spec, tokenizer, max_length, doc_stride, what)

    def encode_task(batch: dict[str, list[Any]]) -> dict[str, list[Any]]:
        encoded = encode(batch)
        if encoded is None:  # no example in these rows (NLI rows without a gold label, -DOCSTART- paragraphs)
            return {column: [] for column in STREAM_COLUMNS}
        return {**{column: encoded[column] for column in STREAM_COLUMNS[:-1]},
                "task": [index] * len(encoded["input_ids"])}

    # batched: a SQuAD question gives several windows, and text tokenizes faster in batches
    return rows.map(encode_task, batched=True, batch_size=ENCODE_BATCH_SIZE, remove_columns=list(columns))


def _json_task_stream(source: str | Path, config: MTDNNConfig, spec: dict[str, Any], index: int) -> "IterableDataset":
    from ...streaming import load_json_source

    name = spec["name"]
    rows = load_json_source(source, f"{name} training data", streaming=True)

    def encode(sample: dict[str, Any]) -> dict[str, Any]:
        where = f"{name} training data, row uid {sample['uid']!r}" if "uid" in sample else f"{name} training data"
        if sample.get("label") is None:
            raise HfExtError(f"{where}: a training row needs a label")
        if sample.get("softlabel") is None:  # the JSON reader gives rows without one the block's column, as null
            sample.pop("softlabel", None)
        row = _json_row(sample, spec, config, where)
        assert row is not None  # only a max_length drops rows
        return {**row, "task": index}

    # row by row: a batched map would read rows ahead of the batches trained (past a shard that fails)
    return rows.map(encode, remove_columns=rows.column_names)


def _tsv_rows(files: list[str], columns: Sequence[str], has_header: bool) -> "IterableDataset":
    from datasets import Features, Value, load_dataset

    return load_dataset("csv", data_files=files, split="train", streaming=True, header=0 if has_header else None,
                        column_names=None if has_header else list(columns),
                        features=Features({column: Value("string") for column in columns}), **TSV_OPTIONS)


def _complete_rows(batch: dict[str, list[Any]], what: str) -> None:
    from ...streaming import MalformedRowError

    if any(value is None for values in batch.values() for value in values):
        raise MalformedRowError(f"{what}: a TSV line with fewer tab-separated fields than the header")


def _glue_header(files, spec, layout):
    """The GLUE layout of a task's TSV shards, their column names and whether each starts with them (the first
    shard's first line tells)."""
    shape = glue_shape(spec, layout)
    with open(files[0], encoding="utf-8-sig", errors="replace") as text:
        first = text.readline().rstrip("\r\n").split("\t")
    header, has_header = glue_header(first, shape, files[0], layout or spec["name"])
    if shape.label not in header:
        raise HfExtError(f"{files[0]}: training data needs labels; this GLUE {layout or spec['name']} file has no "
                         f"{shape.label!r} column (a test file?)")
    return shape, header, has_header


def _glue_examples(batch, spec, shape, what):
    """`glue_examples` of a batch of streamed TSV rows, errors naming a row by its premise."""
    _complete_rows(batch, what)
    return glue_examples(batch, spec, shape, lambda i: f"{what}, the row whose {shape.premise} is "
                         f"{quoted(batch[shape.premise][i])}")


def _glue_stream(files, spec, tokenizer, max_length, layout, what):
    shape, header, has_header = _glue_header(files, spec, layout)

    def encode(batch):
        examples = _glue_examples(batch, spec, shape, what)
        return encode_glue_examples(examples, tokenizer, max_length) if examples["premise"] else None

    return _tsv_rows(files, header, has_header), header, encode


def _ranking_stream(files, spec, tokenizer, max_length, layout, what):
    """A ranking task's GLUE TSV shards as a stream of groups: a generator per shard (`gen_kwargs`' list of files is
    what `datasets` shards) reads the file's rows with the other GLUE streams' `csv` reading and pairs them with
    `ranking_groups`, as `load_glue_tsv` pairs a file's rows. A resumed stream reads its shard again from the start
    up to the group it stopped at: the pairing and its seeded shuffle are the same every time."""
    from datasets import Features, IterableDataset, Sequence, Value

    shape, header, has_header = _glue_header(files, spec, layout)
    assert shape.labels is not None  # a ranking task's layout has labels (`glue_shape`)
    positive = len(shape.labels) - 1

    def file_rows(file):
        for batch in _tsv_rows([file], header, has_header).iter(batch_size=ENCODE_BATCH_SIZE):
            examples = _glue_examples(batch, spec, shape, what)
            yield from zip(examples["premise"], examples["hypothesis"], examples["labels"], strict=True)

    def groups(files):
        for file in files:
            yield from ranking_groups(file_rows(file), positive, True, f"{what} {file}")

    columns = ("premise", "hypothesis", "labels")
    rows = IterableDataset.from_generator(groups, gen_kwargs={"files": files}, features=Features(
        {"premise": Sequence(Value("string")), "hypothesis": Sequence(Value("string")), "labels": Value("int64")}))

    return rows, columns, partial(encode_ranking_groups, tokenizer=tokenizer, max_length=max_length)


def _tagged_stream(kind, files, spec, tokenizer, max_length, what):
    from datasets import load_dataset

    if spec["type"] != "sequence_labeling":
        raise HfExtError(f"tagged words are data of a sequence labeling task, {spec['name']} is a {spec['type']} task")
    if kind == "seqence":
        columns = SEQENCE_COLUMNS
        rows = _tsv_rows(files, columns, has_header=False)

        def sentences_of(batch):
            _complete_rows(batch, what)
            return [sequence_row(tags, words, f"{what}, row uid {quoted(uid)}")
                    for uid, tags, words in zip(batch["uid"], batch["tags"], batch["words"], strict=True)]
    else:  # a paragraph (lines between blank ones) per sentence
        columns = ("text",)
        rows = load_dataset("text", data_files=files, split="train", streaming=True, sample_by="paragraph",
                            encoding="utf-8-sig")

        def sentences_of(batch):
            return [sentence for paragraph in batch["text"]
                    for sentence in conll_sentences(paragraph.split("\n"), lambda _: what)]

    def encode(batch):
        sentences = sentences_of(batch)
        if not sentences:
            return None
        return encode_tagged_sentences(sentences, spec, tokenizer, max_length, where=lambda number: (
            f"{what}, the sentence {quoted(' '.join(sentences[number - 1][0]))}"))

    return rows, columns, encode


def _squad_stream(kind, source, files, spec, tokenizer, max_length, doc_stride, what):
    from datasets import load_dataset

    from ...streaming import load_json_source

    if kind == "squad_document":  # a row per article
        columns: tuple[str, ...] = ("paragraphs",)
        rows = load_dataset("json", data_files=files, field="data", split="train", streaming=True)

        def examples_of(batch):
            return [example for paragraphs in batch["paragraphs"]
                    for example in article_examples({"paragraphs": paragraphs or []}, what, spec)]
    else:
        columns = SQUAD_ROW_COLUMNS
        rows = load_json_source(source, what, streaming=True)

        def examples_of(batch):
            # the JSON reader gives a row without a key the block's column, as null
            samples = [{key: value for key, value in zip(batch, values, strict=True) if value is not None}
                       for values in zip(*batch.values(), strict=True)]
            return [squad_row_example(sample, f"{what}, question {quoted(sample.get('id'))}", spec)
                    for sample in samples]

    def encode(batch):
        examples = examples_of(batch)
        return encode_squad_examples(examples, tokenizer, max_length, doc_stride) if examples else None

    return rows.select_columns(list(columns)), columns, encode


def stream_corpus_error(train_files: Iterable[tuple[str, str | Path]], config: MTDNNConfig,
                        error: BaseException) -> BaseException:
    """The error line for a stream of `train_files` (`(task, source)` pairs) that failed while training with the
    reader's `error`: the first damaged line of the tasks' local shards (`hf_ext.streaming.damaged_line`, in each
    task's format), else the reader's own message; `error` itself where no task reads local files."""
    from ...streaming import damaged_line

    layouts = {"json": "json_lines", "squad_rows": "json_lines", "squad_document": "json_document", "glue": "tsv",
               "glue_ranking": "tsv", "seqence": "tsv", "conll": "text"}
    sources = [(layouts[kind], files) for kind, files in
               (stream_layout(path, config, task) for task, path in train_files) if files]
    for layout, files in sources:
        damaged = damaged_line(files, "training data", layout)
        if damaged is not None:
            return damaged
    return HfExtError(f"cannot read the training data: {one_line(error)}") if sources else error


def stream_task_probabilities(streams: Mapping[str, "IterableDataset"], given: Mapping[str, float] | None = None,
                              ratio: float = 0.0) -> dict[str, float]:
    """The probability of each task's batches in a mixed stream (`mixed_task_batches`), in the order of `streams`:

    - `given` (`{task: weight}`, every task once): the weights, normalised to sum to 1;
    - else proportional to the tasks' sizes where every stream knows its number of rows (a Hub dataset whose card
      records its split sizes), as the paper's scheme draws tasks in proportion to their batches; equal shares where
      a stream does not (local JSON-lines shards);
    - `ratio > 0`, the original's `--ratio` (per epoch, the main task's batches plus `ratio` times as many of the
      others): the first (main) task gets `1 / (1 + ratio)`, the others share the rest in the proportions above."""
    tasks = list(streams)
    if given is not None:
        if sorted(given) != sorted(tasks):
            raise ValueError(f"task probabilities must name each task once ({', '.join(tasks)}), got "
                             f"{', '.join(given)}")
        if not all(weight > 0 for weight in given.values()):
            raise ValueError("task probabilities must be positive")
        if ratio > 0:
            raise ValueError("give task probabilities or a ratio, not both")
        weights = [float(given[task]) for task in tasks]
    else:
        sizes = [size for size in map(_known_rows, streams.values()) if size]
        weights = [float(size) for size in sizes] if len(sizes) == len(tasks) else [1.0] * len(tasks)
    if ratio > 0 and len(tasks) > 1:
        others = sum(weights[1:])
        weights = [1.0, *(ratio * weight / others for weight in weights[1:])]
    total = sum(weights)
    return {task: weight / total for task, weight in zip(tasks, weights, strict=True)}


def _known_rows(stream: "IterableDataset") -> int | None:
    splits = stream.info.splits
    split = splits.get(str(stream.split)) if splits and stream.split is not None else None
    return split.num_examples if split is not None and split.num_examples else None


def mixed_task_batches(streams: Mapping[str, "IterableDataset"], batch_size: int, probabilities: Mapping[str, float],
                       seed: int = 0) -> "IterableDataset":
    """One stream of batches of one task each: every task's stream (`read_task_stream`'s columns) cut into batches
    of `batch_size` rows (a batched `map` that emits one row per batch; the stream is read again from its start when
    used up), the task of each batch drawn with its probability (`datasets.interleave_datasets`, seeded by `seed`:
    processes with the same seed draw the same tasks). A row of the result holds the batch's `task` and its rows'
    columns as JSON text, `batch`: tasks of different shapes (a class id, a score, a tag per token, ranking groups)
    share one schema, which `interleave_datasets` needs. `StreamedBatchCollator` pads it. Rows with soft labels
    keep them (a batch needs them on all its rows or on none: `HfExtError` otherwise)."""
    from datasets import Features, Value, interleave_datasets

    tasks = list(streams)
    # with the features given, `interleave_datasets` reads nothing to learn them
    features = Features({"task": Value("int64"), "batch": Value("string")})
    batches = [streams[task].map(partial(_batch_row, task), batched=True, batch_size=batch_size,
                                 remove_columns=[*STREAM_COLUMNS, SOFT_LABELS], features=features) for task in tasks]
    return interleave_datasets([stream.repeat(None) for stream in batches],
                               probabilities=[probabilities[task] for task in tasks], seed=seed,
                               stopping_strategy="all_exhausted")


def _batch_row(task: str, rows: dict[str, list[Any]]) -> dict[str, list[Any]]:
    columns = {column: rows[column] for column in STREAM_COLUMNS}
    soft_labels = rows.get(SOFT_LABELS)  # absent where no row of the batch has one
    if soft_labels is not None:
        if any(value is None for value in soft_labels):
            raise HfExtError(f"{task} training data: some rows have a softlabel and some do not (a batch of "
                             f"{len(soft_labels)} rows mixes them; give every row of a task a softlabel or none)")
        columns[SOFT_LABELS] = soft_labels
    return {"task": rows["task"][:1], "batch": [json.dumps(columns)]}


class StreamedBatchCollator:
    """Collates what a data loader takes, one row at a time, from `mixed_task_batches`: the batch of one task that
    the row holds, as `collator` (an `MTDNNCollator`) pads a list of rows."""

    def __init__(self, collator: Any) -> None:
        self.collator = collator

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        (row,) = rows
        columns = json.loads(row["batch"])
        return self.collator([dict(zip(columns, values, strict=True))
                              for values in zip(*columns.values(), strict=True)])


__all__ = ["MTDNNCollator", "MultiTaskBatchSampler", "MultiTaskDataset", "StreamedBatchCollator", "load_glue_tsv",
           "load_mtdnn_json", "load_sequence_labeling_file", "load_squad_file", "load_task_file", "load_task_files",
           "mixed_task_batches", "mixed_task_order", "read_task_stream", "soft_label_width",
           "stream_corpus_error", "stream_layout", "stream_task_probabilities"]
