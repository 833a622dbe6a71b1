"""GLUE's TSV files as `datasets`: each task's layout (where its fields are, its label names) and one reader, for
any model that trains on GLUE (MT-DNN's multi-task training, ERNIE 2.0's fine-tuning).

The layouts are those of namisan/mt-dnn's `experiments/glue/glue_utils.py` (HEAD 3228e7c) and GLUE's own files.
"""

import itertools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from transformers.utils import logging

from .errors import HfExtError
from .text_files import read_lines

if TYPE_CHECKING:  # datasets is imported only when a file is read
    from datasets import Dataset
    from transformers import PreTrainedTokenizerBase

logger = logging.get_logger(__name__)


@dataclass(frozen=True)
class GlueLayout:
    """Where a GLUE task's TSV files keep their fields (header names; test files lack the label column).

    `labels` are the text labels in id order (the original's task definitions), `None` for integer class ids;
    `num_labels` is 1 for a score; `headerless` names the columns of files without a header line (CoLA train/dev).
    """

    premise: str
    hypothesis: str | None
    label: str
    labels: tuple[str, ...] | None = None
    num_labels: int = 2
    headerless: tuple[str, ...] | None = None


GLUE_LAYOUTS = {
    "cola": GlueLayout("sentence", None, "label", headerless=("source", "label", "author_label", "sentence")),
    "sst2": GlueLayout("sentence", None, "label"),
    "mrpc": GlueLayout("#1 String", "#2 String", "Quality"),
    "stsb": GlueLayout("sentence1", "sentence2", "score", num_labels=1),
    "qqp": GlueLayout("question1", "question2", "is_duplicate"),
    "mnli": GlueLayout("sentence1", "sentence2", "gold_label", ("contradiction", "neutral", "entailment"), 3),
    "qnli": GlueLayout("question", "sentence", "label", ("not_entailment", "entailment")),
    "rte": GlueLayout("sentence1", "sentence2", "label", ("not_entailment", "entailment")),
    "wnli": GlueLayout("sentence1", "sentence2", "label"),
}
# MT-DNN's task names (qnnli: QNLI as ranking) and GLUE's folder names
# GLUE on the Hub, whose task ids (configurations) are the keys of GLUE_LAYOUTS
GLUE_HUB_DATASET = "nyu-mll/glue"
GLUE_ALIASES = {"sst": "sst2", "sst-2": "sst2", "sts-b": "stsb", "qnnli": "qnli"}
NO_GOLD_LABEL = "-"  # NLI rows whose annotators did not agree; the original skips them


def glue_layout(name: str) -> GlueLayout:
    """The TSV layout of a GLUE task by its name (GLUE's, MT-DNN's or the GLUE folder's, any case)."""
    key = GLUE_ALIASES.get(name.lower(), name.lower())
    if key not in GLUE_LAYOUTS:
        raise HfExtError(f"no GLUE TSV layout named {name!r} (known: {', '.join(GLUE_LAYOUTS)})")
    return GLUE_LAYOUTS[key]


def glue_task(name: str) -> str:
    """The GLUE task key (`sst2`, `mnli`, `stsb`, ...) of a task name in GLUE's, MT-DNN's or the GLUE folder's
    spelling (`SST-2`, `sst`, `STS-B`, ...)."""
    glue_layout(name)  # one clear error for an unknown name
    return GLUE_ALIASES.get(name.lower(), name.lower())


def glue_benchmark(name: str) -> tuple[str, str] | None:
    """`(Hub dataset id, task id)` of GLUE's task `name` (any of `glue_task`'s spellings), None for a name that is
    no GLUE task: where a model card records its evaluation results."""
    key = GLUE_ALIASES.get(name.lower(), name.lower())
    return (GLUE_HUB_DATASET, key) if key in GLUE_LAYOUTS else None


def glue_task_spec(name: str) -> dict:
    """The task description `read_glue_tsv` takes, for a GLUE task read in its own layout."""
    key = glue_task(name)
    layout = GLUE_LAYOUTS[key]
    return {"name": key, "type": "regression" if layout.num_labels == 1 else "classification",
            "num_labels": layout.num_labels,
            "data_format": "PremiseOnly" if layout.hypothesis is None else "PremiseAndOneHypothesis"}


def _label_id(value, names, num_labels, where):
    """A classification label: one of the label `names`, or a class id."""
    if names and value in names:
        return names.index(value)
    try:
        label = int(value)
    except ValueError:
        label = -1
    if not 0 <= label < num_labels:
        known = f"one of {', '.join(names)} or " if names else ""
        raise HfExtError(f"{where}: label {value!r} is not {known}a class id below {num_labels}")
    return label


def glue_shape(spec: dict, layout: str | None = None) -> GlueLayout:
    """The GLUE layout that the TSV rows of task `spec` have (`layout`, or the task's name), checked against the
    task: its type (a score or classes; QNLI-like pairs for a ranking task), number of classes and data format."""
    shape = glue_layout(layout or spec["name"])
    if spec["type"] == "ranking":
        if shape.hypothesis is None or shape.labels is None or spec["group_size"] != 2:
            raise HfExtError(f"ranking task {spec['name']} reads GLUE TSV rows as the original's QNLI ranking does "
                             "(pairs of candidates with entailment labels, group size 2); the layout "
                             f"{layout or spec['name']} does not fit")
    elif (shape.num_labels == 1) != (spec["type"] == "regression"):
        raise HfExtError(f"task {spec['name']} is a {spec['type']} task but the GLUE layout "
                         f"{layout or spec['name']} holds {'scores' if shape.num_labels == 1 else 'classes'}")
    if spec["type"] == "classification" and spec["num_labels"] != shape.num_labels:
        raise HfExtError(f"task {spec['name']} has {spec['num_labels']} classes but the GLUE layout "
                         f"{layout or spec['name']} has {shape.num_labels}")
    if spec["type"] != "ranking" and (shape.hypothesis is None) != (spec["data_format"] == "PremiseOnly"):
        holds = "single sentences" if shape.hypothesis is None else "pairs"
        raise HfExtError(f"task {spec['name']} reads {spec['data_format']} rows but the GLUE layout "
                         f"{layout or spec['name']} holds {holds}")
    return shape


def glue_header(first: list[str], shape: GlueLayout, path: str | Path, layout: str) -> tuple[list[str], bool]:
    """The column names of a GLUE TSV file of layout `shape` whose first line has the fields `first`, and whether
    that line is the header (CoLA's train and dev files have none)."""
    if shape.premise in first:
        return first, True
    if shape.headerless and len(first) == len(shape.headerless):
        return list(shape.headerless), False
    raise HfExtError(f"{path} is not a GLUE {layout} TSV file: its first line has no {shape.premise!r} column")


def glue_examples(rows: dict[str, list[str]], spec: dict, shape: GlueLayout, where: Callable[[int], str],
                  ) -> dict[str, list[Any]]:
    """The `premise`, `hypothesis` (pair layouts) and `labels` (when `rows` hold the layout's label column) of the
    TSV `rows` (`{column: fields}`) of task `spec`: class ids in the order of the task's `labels` (ranking: of the
    layout's), or float scores. NLI rows without a gold label are left out, as the original does; `where(i)` names
    row `i` in errors."""
    names = spec.get("labels") or list(shape.labels or ())
    labelled = shape.label in rows
    examples: dict[str, list[Any]] = {"premise": [], "hypothesis": [], "labels": []}
    for i, premise in enumerate(rows[shape.premise]):
        if labelled:
            value = rows[shape.label][i]
            if value == NO_GOLD_LABEL and shape.labels:
                continue
            if spec["type"] == "ranking":
                assert shape.labels is not None  # a ranking task's layout has labels (`glue_shape`)
                label = _label_id(value, list(shape.labels), len(shape.labels), where(i))
            elif spec["type"] == "regression":
                try:
                    label = float(value)
                except ValueError:
                    raise HfExtError(f"{where(i)}: score {value!r} is not a number") from None
            else:
                label = _label_id(value, names, spec["num_labels"], where(i))
            examples["labels"].append(label)
        examples["premise"].append(premise)
        examples["hypothesis"].append(rows[shape.hypothesis][i] if shape.hypothesis else None)
    if not labelled:
        del examples["labels"]
    if shape.hypothesis is None:
        del examples["hypothesis"]
    return examples


def encode_glue_examples(examples: dict[str, list[Any]], tokenizer: "PreTrainedTokenizerBase", max_length: int = 512,
                         ) -> dict[str, list[Any]]:
    """`glue_examples`' premises (and hypotheses, as one pair) tokenized and truncated to `max_length`: the columns
    `input_ids`, `token_type_ids`, `attention_mask`, and `labels` where the examples have them."""
    encoded = tokenizer(examples["premise"], examples.get("hypothesis"), truncation=True, max_length=max_length,
                        return_token_type_ids=True, return_attention_mask=True)
    columns = {key: encoded[key] for key in ("input_ids", "token_type_ids", "attention_mask")}
    if "labels" in examples:
        columns["labels"] = examples["labels"]
    return columns


def read_glue_tsv(path: str | Path, spec: dict, tokenizer: "PreTrainedTokenizerBase", max_length: int = 512,
                  layout: str | None = None) -> "Dataset":
    """A GLUE-format TSV file as a tokenized `datasets.Dataset` for one task.

    Args:
        path: the TSV file (GLUE's own layout for the task: CoLA train/dev without header, MNLI's matched and
            mismatched files alike, test files without labels).
        spec (`dict`): the task's description, as MT-DNN's configuration holds it: `name`, `type`
            (`classification`, `regression` or `ranking`), `num_labels`, `data_format` (`PremiseOnly` or
            `PremiseAndOneHypothesis`), optional `labels` (label names in id order) and `group_size` (ranking);
            `glue_task_spec` gives the one of a GLUE task.
        tokenizer: a BERT tokenizer; premise and hypothesis are encoded as one pair, truncated to `max_length`.
        layout (`str`, *optional*): the GLUE task whose layout the file has; the task's name when unset.

    Returns:
        columns `input_ids`, `token_type_ids`, `attention_mask` and `labels` (class ids
        in the order of the task's `labels`, or float scores) when the file has labels (`glue_examples`,
        `encode_glue_examples`). A ranking task (group size 2) reads the pair rows of a QNLI-like layout as the
        original's QNLI ranking (see `ranking_groups`): each row then holds the two candidates' token lists and the
        index of the positive one.
    """
    from datasets import Dataset

    shape = glue_shape(spec, layout)
    lines = read_lines(path, "GLUE file")
    if not any(line.strip() for line in lines):
        raise HfExtError(f"GLUE file {path} is empty")
    header, has_header = glue_header(lines[0].split("\t"), shape, path, layout or spec["name"])
    start = 1 if has_header else 0
    columns = {name: header.index(name) for name in (shape.premise, shape.hypothesis, shape.label) if name in header}
    rows: dict[str, list[str]] = {name: [] for name in columns}
    numbers = []
    for number, line in enumerate(lines[start:], start + 1):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != len(header):
            raise HfExtError(f"{path}, line {number}: {len(fields)} tab-separated fields where the header has "
                             f"{len(header)}")
        for name, column in columns.items():
            rows[name].append(fields[column])
        numbers.append(number)
    examples = glue_examples(rows, spec, shape, lambda i: f"{path}, line {numbers[i]}")
    if not examples["premise"]:
        raise HfExtError(f"GLUE file {path} has no rows")
    if spec["type"] == "ranking":
        assert shape.labels is not None  # a ranking task's layout has labels (`glue_shape`)
        labelled = "labels" in examples
        labels = examples["labels"] if labelled else [None] * len(examples["premise"])
        pairs = zip(examples["premise"], examples["hypothesis"], labels, strict=True)
        groups = list(ranking_groups(pairs, len(shape.labels) - 1, labelled, f"GLUE file {path}"))
        return Dataset.from_dict(encode_ranking_groups(
            {key: [group[key] for group in groups] for key in groups[0]}, tokenizer, max_length))
    return Dataset.from_dict(encode_glue_examples(examples, tokenizer, max_length))


def ranking_groups(rows: Iterable[tuple[str, str, int | None]], positive: int, labelled: bool, where: str,
                   seed: int = 0) -> Iterator[dict[str, Any]]:
    """The `(premise, hypothesis, label)` rows of one GLUE file, in file order, as the original's QNLI ranking groups
    (`load_qnnli`): rows 2i and 2i+1 form a group when they share the premise (question); when `labelled`, the pair
    must hold one positive (label id `positive`, the layout's last label) and one negative, its order is shuffled
    (seeded here, one generator per file; the original shuffles training pairs), and the label is the index of the
    positive candidate. Pairs that do not fit are skipped and counted in a warning, as the original does; a file
    without a group fails (`where` names the file in both). Yields `{"premise": [a, b], "hypothesis": [a, b],
    "labels": k}` (`labels` when `labelled`). Rows are read as they come: `read_glue_tsv` and MT-DNN's stream share
    this pairing."""
    rng = np.random.default_rng(seed)
    skipped = found = 0
    pairs = iter(rows)
    for first in pairs:
        second = next(pairs, None)
        if second is None:  # an odd row at the end
            skipped += 1
            break
        pair = [first, second]
        if first[0] != second[0]:
            skipped += 2
            continue
        group: dict[str, Any] = {}
        if labelled:
            if sorted(label == positive for _, _, label in pair) != [False, True]:
                skipped += 2
                continue
            pair = [pair[i] for i in rng.permutation(2)]
            group["labels"] = next(k for k, (_, _, label) in enumerate(pair) if label == positive)
        found += 1
        yield {"premise": [premise for premise, _, _ in pair], "hypothesis": [hypothesis for _, hypothesis, _ in pair],
               **group}
    if not found:
        raise HfExtError(f"{where} has no pair of rows with one question and "
                         + ("one positive and one negative candidate" if labelled else "two candidates"))
    if skipped:
        logger.warning(f"{where}: skipped {skipped} row(s) that do not pair into a ranking group (as the original's "
                       "QNLI ranking does)")


def encode_ranking_groups(groups: dict[str, list[Any]], tokenizer: "PreTrainedTokenizerBase", max_length: int = 512,
                          ) -> dict[str, list[Any]]:
    """`ranking_groups`' groups (as columns: `premise` and `hypothesis`, a list of candidates per group, and
    `labels` where they have them) tokenized as `encode_glue_examples` tokenizes rows, each candidate a
    (premise, hypothesis) pair truncated to `max_length`: `input_ids`, `token_type_ids` and `attention_mask` hold a
    token list per candidate of each group."""
    sizes = [len(premises) for premises in groups["premise"]]
    encoded = encode_glue_examples({"premise": [p for premises in groups["premise"] for p in premises],
                                    "hypothesis": [h for hypotheses in groups["hypothesis"] for h in hypotheses]},
                                   tokenizer, max_length)
    starts = [0, *itertools.accumulate(sizes)]
    columns = {key: [values[start:end] for start, end in itertools.pairwise(starts)]
               for key, values in encoded.items()}
    if "labels" in groups:
        columns["labels"] = groups["labels"]
    return columns


__all__ = ["GLUE_ALIASES", "GLUE_LAYOUTS", "GlueLayout", "encode_glue_examples", "encode_ranking_groups",
           "glue_examples", "glue_header", "glue_layout", "glue_shape", "glue_task", "glue_task_spec",
           "ranking_groups", "read_glue_tsv"]
