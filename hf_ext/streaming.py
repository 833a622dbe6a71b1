"""Corpora read through `datasets`: a file, a folder of shards, a glob or a Hub dataset id, as a memory-mapped
`datasets.Dataset` (the default) or, with `streaming=True`, a `datasets.IterableDataset` that never holds the corpus
in memory; and what a `Trainer` needs to train on a stream and resume it exactly: a data loader over the process's
part of the stream that records the stream's position (`IterableDataset.state_dict()`) at every batch, a callback
that writes the position of the last trained batch into each checkpoint, and `restore_stream_position` for the
resumed run.

Processes of a distributed run read disjoint parts of a stream (`datasets.distributed.split_dataset_by_node`: whole
shards when their number divides by the world size, else every world-size-th example)."""

import glob
import gzip
import json
import re
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from accelerate.data_loader import prepare_data_loader
from torch.utils.data import DataLoader
from transformers import Trainer, TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_utils import TrainOutput
from transformers.utils import logging

from .errors import HfExtError, one_line

if TYPE_CHECKING:  # datasets is imported only when data is read
    from datasets import Dataset, Features, IterableDataset

logger = logging.get_logger(__name__)

SHARD_SUFFIXES = (".jsonl", ".json", ".jsonl.gz", ".json.gz")
TEXT_SUFFIXES = (".txt", ".txt.gz")
STREAM_STATE = "stream_state-rank{rank}.json"
# owner/name of a Hub dataset (or a bare canonical name): what a source that is no local path may be
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")


def data_files(source: str | Path, what: str, suffixes: tuple[str, ...] = SHARD_SUFFIXES) -> list[str] | None:
    """The shard files of `source` in order: a file, a folder (its files ending in one of `suffixes`: JSON lines by
    default, also gzipped), or a glob; None when `source` is no local path but may be a Hub dataset id. One error
    line for a path that does not exist, a folder without shards or a glob that matches nothing."""
    text = str(source)
    path = Path(text)
    if path.is_file():
        return [text]
    if path.is_dir():
        shards = sorted(str(file) for file in path.iterdir() if file.is_file() and file.name.endswith(suffixes))
        if not shards:
            raise HfExtError(f"{what} folder {path} holds no shards ({', '.join('*' + s for s in suffixes)})")
        return shards
    if glob.has_magic(text):
        shards = sorted(file for file in glob.glob(text, recursive=True) if Path(file).is_file())
        if not shards:
            raise HfExtError(f"no {what} shard matches {text}")
        return shards
    if HUB_ID.fullmatch(text) and not text.endswith(suffixes):
        return None
    raise HfExtError(f"{what} file {path} does not exist")


def load_json_source(source: str | Path, what: str, streaming: bool = False, features: "Features | None" = None,
                     builder: str = "json") -> "Dataset | IterableDataset":
    """`source` (see `data_files`) as the `train` split `load_dataset` gives: JSON lines through its `json` builder
    with `features` (or text lines through its `text` builder, column `text`), or the Hub dataset of that id;
    `streaming` gives an `IterableDataset` (one shard per file). One error line for a Hub id that cannot be reached
    (offline, or no such dataset)."""
    from datasets import load_dataset

    files = data_files(source, what, SHARD_SUFFIXES if builder == "json" else TEXT_SUFFIXES)
    if files is None:
        try:
            return load_dataset(str(source), split="train", streaming=streaming, features=features)
        except Exception as error:  # offline, unknown repo, gated: every failure of the Hub is one line here
            raise HfExtError(f"{what} {source} is neither a local path nor a reachable Hub dataset "
                             f"({one_line(error)})") from None
    try:
        return load_dataset(builder, data_files=files, split="train", streaming=streaming, features=features)
    except Exception as error:  # a map-style load parses everything now: report the bad line
        raise corpus_error(files, what, error) if builder == "json" else \
            HfExtError(f"cannot read the {what}: {one_line(error)}") from None


def corpus_error(files: list[str], what: str, error: BaseException, layout: str = "json_lines") -> HfExtError:
    """The error line for a failure while reading `files` (`layout`: see `damaged_line`; the readers' parsers name a
    block or a chunk, not the line): the first damaged line (file and line number), JSON-lines files without a row,
    else the reader's own message. Reads the files again: only on this failure path."""
    damaged = damaged_line(files, what, layout)
    if damaged is not None:
        return damaged
    if layout == "json_lines" and not any(line.strip() for file in files for line in _lines(file)):
        return HfExtError(f"{what} {', '.join(files)}: no rows")  # the `json` builder finds no row to learn columns
    return HfExtError(f"cannot read the {what}: {one_line(error)}")


def damaged_line(files: list[str], what: str, layout: str = "json_lines") -> HfExtError | None:
    """The error line naming the first damaged line of `files`, None where none is: `layout` `json_lines`, a line
    that is not JSON; `json_document`, the line where a file stops being one JSON document; `tsv`, a line whose
    number of tab-separated fields differs from the file's first line's (a TSV row with fields missing or extra);
    `text`, a line that is not UTF-8."""
    for file in files:
        if layout == "json_document":
            try:
                json.loads("\n".join(_lines(file)))
            except json.JSONDecodeError as decode_error:
                return HfExtError(f"{what} {file}, line {decode_error.lineno}: not JSON ({decode_error.msg})")
            continue
        width = None
        for number, line in enumerate(_lines(file), 1):
            if "\ufffd" in line and layout == "text":
                return HfExtError(f"{what} {file}, line {number}: not UTF-8 text")
            if not line.strip():
                continue
            if layout == "tsv":
                fields = len(line.split("\t"))
                width = width or fields
                if fields != width:
                    return HfExtError(f"{what} {file}, line {number}: {fields} tab-separated fields where its first "
                                      f"line has {width}")
            elif layout == "json_lines":
                try:
                    json.loads(line)
                except json.JSONDecodeError as decode_error:
                    return HfExtError(f"{what} {file}, line {number}: not JSON ({decode_error.msg})")
    return None


def _lines(file: str) -> Iterator[str]:
    """The lines of a text shard (gzipped where its name ends in .gz), undecodable bytes read as U+FFFD."""
    with (gzip.open if file.endswith(".gz") else open)(file, "rt", encoding="utf-8-sig", errors="replace") as lines:
        for line in lines:
            yield line.rstrip("\r\n")


class MalformedRowError(ValueError):
    """A row that a stream's reader gave although its line is malformed (a TSV line with fields missing, which the
    CSV reader fills with None). Raised while the stream is read, as the reader's own errors are (not an
    `HfExtError`): training keeps the steps trained (`StreamReadError`) and `damaged_line` names the line."""


class StreamReadError(HfExtError):
    """Reading a stream failed while training (`error`, the reader's exception); `kept` says where the steps trained
    until then were saved, if any."""

    def __init__(self, error: BaseException, kept: str = "") -> None:
        super().__init__(f"cannot read the stream: {one_line(error)}{kept}")
        self.error = error
        self.kept = kept


def is_stream(dataset: object) -> bool:
    """Whether `dataset` is a `datasets.IterableDataset` (without importing datasets where nothing uses it)."""
    import sys

    module = sys.modules.get("datasets")
    return module is not None and isinstance(dataset, module.IterableDataset)


def split_for_process(stream: "IterableDataset", args: TrainingArguments) -> "IterableDataset":
    """This process's part of `stream` under `args`' world (the whole stream in a single process)."""
    from datasets.distributed import split_dataset_by_node

    if args.world_size == 1:
        return stream
    return split_dataset_by_node(stream, rank=args.process_index, world_size=args.world_size)


class PositionedStream(torch.utils.data.IterableDataset):
    """A `datasets.IterableDataset` read in batches of `batch_size` examples, keeping the stream's `state_dict()`
    after each of the last `keep` batches read (`positions`: `{batches read: state}`), so that the position after
    the batches a trainer consumed can be saved even though its data loader reads ahead."""

    def __init__(self, stream: "IterableDataset", batch_size: int, keep: int = 8) -> None:
        self.stream = stream
        self.batch_size = batch_size
        self.batches_read = 0
        self.positions: deque[tuple[int, dict[str, Any]]] = deque(maxlen=keep)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        examples = iter(self.stream)
        number = 0
        while True:
            try:
                example = next(examples)
            except StopIteration:
                return
            except HfExtError:
                raise
            except Exception as error:  # the reader's own (a line of a shard that is not JSON, a lost connection)
                raise StreamReadError(error) from error
            number += 1
            if number % self.batch_size == 0:
                self.batches_read += 1
                self.positions.append((self.batches_read, self.stream.state_dict()))
            yield example

    def position_after(self, batches: int) -> dict[str, Any] | None:
        """The stream's state after `batches` batches (counted from where this reader started), if still kept."""
        return next((state for read, state in self.positions if read == batches), None)


def stream_dataloader(stream: PositionedStream, batch_size: int, collate_fn: Any, args: TrainingArguments,
                      ) -> DataLoader:
    """A data loader over this process's part of a stream (`split_for_process` made it): accelerate puts batches on
    the device and must not shard or dispatch them again. Workers would each read the whole part: none here."""
    loader = DataLoader(stream, batch_size=batch_size, collate_fn=collate_fn, pin_memory=args.dataloader_pin_memory)
    return prepare_data_loader(loader, device=args.device, num_processes=1, process_index=0, put_on_device=True,
                               dispatch_batches=False)


class StreamPositionCallback(TrainerCallback):
    """Writes the position of `stream` after the batches trained so far into each checkpoint
    (`stream_state-rank<N>.json`), for `restore_stream_position`. `start_step` is the step the reader started at
    (a resumed run's checkpoint step)."""

    def __init__(self, stream: PositionedStream, start_step: int = 0) -> None:
        self.stream = stream
        self.start_step = start_step

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                **kwargs: Any) -> None:
        batches = (state.global_step - self.start_step) * args.gradient_accumulation_steps
        position = self.stream.position_after(batches)
        if position is None:  # a resumed run without it falls back on Trainer's skipping of the batches trained
            logger.warning(f"the stream position after step {state.global_step} was not kept: a resume from this "
                           "checkpoint re-reads the stream up to it")
            return
        folder = Path(args.output_dir or ".") / f"checkpoint-{state.global_step}"
        (folder / STREAM_STATE.format(rank=args.process_index)).write_text(json.dumps(position))


def train_keeping_progress(trainer: Trainer, resume_from_checkpoint: str | None = None) -> TrainOutput:
    """`trainer.train(...)` for a trainer that may read a stream (its `stream` attribute, a `PositionedStream`, as
    `hf_ext.trainer.TermLoggingTrainer` has for a `datasets.IterableDataset`): a resumed run moves the stream to the
    position saved with the checkpoint, and every checkpoint saves it. When the stream cannot be read
    (`StreamReadError`), the steps trained until then are saved as a checkpoint (with the stream's position) before
    the error is raised again, naming it; under several processes only the last regular checkpoint is kept
    (`kept_by_several_processes`)."""
    stream = getattr(trainer, "stream", None)
    if isinstance(stream, PositionedStream):
        repositioned = restore_stream_position(stream.stream, resume_from_checkpoint, trainer.args.process_index)
        # Trainer would otherwise skip the trained batches by reading them again
        trainer.args.ignore_data_skip = repositioned
        start = int(Path(resume_from_checkpoint).name.rsplit("-", 1)[1]) \
            if repositioned and resume_from_checkpoint else 0
        trainer.add_callback(StreamPositionCallback(stream, start))
        if repositioned and resume_from_checkpoint:
            trainer.add_callback(RestoreRngStates(trainer, resume_from_checkpoint))
    try:
        return trainer.train(resume_from_checkpoint=resume_from_checkpoint)
    except StreamReadError as error:
        if trainer.args.world_size > 1:
            raise StreamReadError(error.error, kept_by_several_processes(trainer.args.output_dir)) from None
        step = trainer.state.global_step
        folder = Path(trainer.args.output_dir or ".") / f"checkpoint-{step}"
        if step and not folder.is_dir():
            # Trainer's own checkpoint, then the callbacks' additions, as at a save step
            assert trainer.model is not None  # a Trainer that trained has its model
            trainer._save_checkpoint(trainer.model, trial=None)
            trainer.control = trainer.callback_handler.on_save(trainer.args, trainer.state, trainer.control)
        kept = (f"; the {step} steps trained are kept in {folder}: correct the data and run the same command to "
                "resume") if step else ""
        raise StreamReadError(error.error, kept) from None


def kept_by_several_processes(output_dir: str | None) -> str:
    """What a distributed run keeps when one process cannot read its stream: the last checkpoint saved (`save_steps`)
    and nothing after it. A checkpoint needs every process (each saves its stream position and RNG state, and Trainer
    gathers counters across them on saving) while the others wait in the step's collective; this process leaves
    instead, and torchrun stops the others."""
    from transformers.trainer_utils import get_last_checkpoint

    last = get_last_checkpoint(output_dir) if output_dir and Path(output_dir).is_dir() else None
    if last is None:
        return "; no checkpoint was saved yet (several processes save only every --save-steps): correct the data " \
            "and run the same command to start again"
    return f"; the steps up to {last} are kept (several processes save only every --save-steps, not on failure): " \
        "correct the data and run the same command to resume"


class RestoreRngStates(TrainerCallback):
    """Loads the RNG states of `checkpoint` as the first step of a resumed run begins, once its first batches are
    read (opening the data loader draws a seed): `Trainer` restores them only when it skips the trained batches
    itself, not with `ignore_data_skip` (a stream moved to its saved position instead)."""

    def __init__(self, trainer: Trainer, checkpoint: str) -> None:
        self.trainer = trainer
        self.checkpoint: str | None = checkpoint

    def on_step_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                      **kwargs: Any) -> None:
        if self.checkpoint is not None:
            self.trainer._load_rng_state(self.checkpoint)
            self.checkpoint = None


def restore_stream_position(stream: "IterableDataset", checkpoint: str | Path | None, rank: int) -> bool:
    """Move `stream` to the position saved in `checkpoint` for process `rank`; False when there is none (no
    checkpoint, or one saved without it), in which case `Trainer` must skip the trained batches itself."""
    if checkpoint is None:
        return False
    path = Path(checkpoint) / STREAM_STATE.format(rank=rank)
    if not path.is_file():
        return False
    stream.load_state_dict(json.loads(path.read_text()))
    return True


__all__ = ["MalformedRowError", "PositionedStream", "RestoreRngStates", "StreamPositionCallback", "StreamReadError",
           "corpus_error", "damaged_line", "data_files", "is_stream", "kept_by_several_processes", "load_json_source",
           "restore_stream_position", "split_for_process", "stream_dataloader", "train_keeping_progress"]
