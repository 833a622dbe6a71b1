"""Hub work through huggingface_hub: model cards from `model_cards/` (a converter's, and the one every training
command writes), pushing a folder as one commit (its regular files only, listed first, a model card required and
published loading the model by its repo id), laying a folder into a local Hub cache so that
`from_pretrained("org/name")` resolves offline, copying model files without following links out of their folder,
and naming a model without local paths."""

import argparse
import hashlib
import json
import re
import shutil
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from huggingface_hub import (
    EvalResult,
    EvalResultEntry,
    HfApi,
    ModelCard,
    ModelCardData,
    constants,
    eval_result_entries_to_yaml,
)
from huggingface_hub.errors import HfHubHTTPError
from transformers.utils import logging

from .errors import HfExtError
from .output import copy_file

logger = logging.get_logger(__name__)
# the model card of a folder, which the Hub shows as the model's page
CARD = "README.md"


def model_card_template(name: str) -> str:
    """The text of the model card template `model_cards/<name>.md`, package data of hf-ext (`hf_ext/model_cards` is
    a link to the repository's top-level `model_cards/`, whose files the wheel ships)."""
    template = resources.files("hf_ext").joinpath("model_cards", f"{name}.md")
    if not template.is_file():
        raise HfExtError(f"hf-ext ships no model card template named {name}.md")
    return template.read_text(encoding="utf-8")


def write_model_card(folder: str | Path, template_name: str, card_data: ModelCardData, **context: Any) -> ModelCard:
    """Render `model_cards/<template_name>.md` with `card_data` (a `ModelCardData`) into `folder/README.md`."""
    card = ModelCard.from_template(card_data, template_str=model_card_template(template_name), **context)
    card.save(Path(folder) / "README.md")
    return card


def card_data(**kwargs: Any) -> ModelCardData:
    """`ModelCardData` with the package's defaults (library transformers, tag hf-ext)."""
    tags = ["hf-ext", *kwargs.pop("tags", [])]
    return ModelCardData(library_name="transformers", tags=tags, **kwargs)


@dataclass(frozen=True)
class Evaluation:
    """Metrics a command measured on one dataset, as a card records them: a table on the page, the card's
    `model-index` (which the Hub shows as the model's evaluation results), and, where the data is a Hub benchmark's
    task (`benchmark`: its dataset id and task id, e.g. `("nyu-mll/glue", "sst2")`), an `.eval_results/` file with
    the first of `metrics`, the Hub's newer format, which its leaderboards read."""

    task_type: str  # the Hub's task of what was measured: text-classification, text-generation, ...
    dataset: str  # what the data was, as the card names it (a local file by its name)
    metrics: dict[str, float]
    benchmark: tuple[str, str] | None = None
    split: str | None = None  # which part of the dataset, where it has several (MNLI's matched and mismatched)


# what `Trainer.evaluate` reports beside the metrics: the loss, and timing
TRAINER_BOOKKEEPING = ("loss", "runtime", "samples_per_second", "steps_per_second", "epoch")


def trainer_metrics(metrics: dict[str, float], prefix: str = "eval_") -> dict[str, float]:
    """The metrics of a `Trainer.evaluate` result under their own names (`accuracy`, `f1`), in its order."""
    return {name.removeprefix(prefix): value for name, value in metrics.items()
            if name.startswith(prefix) and name.removeprefix(prefix) not in TRAINER_BOOKKEEPING}


# the folder of a model repository whose YAML files the Hub reads as evaluation results
EVAL_RESULTS_FOLDER = constants.EVAL_RESULTS_FOLDER
# what a training command's card leaves out of its settings: the command's plumbing, and secrets
NOT_SETTINGS = frozenset({"handler", "command", "verbosity", "token", "overwrite"})


def write_training_card(folder: str | Path, output_dir: str | Path, args: argparse.Namespace, command: str,
                        base_model: str | None, log_history: list[dict[str, Any]],
                        evaluations: Sequence[Evaluation] = (), trainable: dict[str, Any] | None = None,
                        ) -> ModelCard:
    """`folder/README.md` for a model a training command wrote into `folder` (the staging folder of its output
    `output_dir`): what it is, what it started from (`base_model`, None for fresh weights), the command and its settings
    (`args`, but for `NOT_SETTINGS`), the steps and final training loss (from `log_history`), the metrics measured
    (`evaluations`: a table, `model-index` and `.eval_results/` files, see `Evaluation`), what of the model trained
    (`trainable`: `trainable_parameters` of `parameters`, and what they are, `trained`) and how to load it (a PEFT
    adapter on its base)."""
    from . import __version__
    from .models import MODELS

    folder, name = Path(folder), Path(output_dir).name
    config = json.loads((folder / "config.json").read_text()) if (folder / "config.json").is_file() else {}
    entry = next((entry for entry in MODELS if entry.model_type == config.get("model_type")), None)
    settings = [(option, _without_local_path(value)) for option, value in sorted(vars(args).items())
                if option not in NOT_SETTINGS and value is not None and not callable(value)]
    losses = [logged["train_loss"] for logged in log_history if "train_loss" in logged]
    steps = _optimizer_steps(log_history)
    # a folder is no Hub model: the card's metadata names only a base on the Hub
    hub_base = base_model if base_model is not None and not _local_path(base_model) else None
    data = card_data(tags=[config["model_type"]] if "model_type" in config else [], base_model=hub_base,
                     model_name=name, eval_results=[result for evaluation in evaluations
                                                    for result in _model_index_results(evaluation)] or None)
    write_eval_results_files(folder, evaluations, command)
    return write_model_card(folder, "training", data, model_name=name,
                            display_name=entry.display_name if entry else "transformers",
                            base_model=None if base_model is None else _without_local_path(base_model),
                            hf_ext_version=__version__, command=command, settings=settings, steps=steps,
                            train_loss=losses[-1] if losses else None,
                            metrics=[(evaluation.dataset, metric, value) for evaluation in evaluations
                                     for metric, value in evaluation.metrics.items()],
                            adapter=(folder / "adapter_config.json").is_file(), repo_id=name, trainable=trainable)


def _model_index_results(evaluation: Evaluation) -> list[EvalResult]:
    dataset_type, dataset_config = evaluation.benchmark or (evaluation.dataset, None)
    return [EvalResult(task_type=evaluation.task_type, dataset_type=dataset_type, dataset_name=evaluation.dataset,
                       dataset_config=dataset_config, dataset_split=evaluation.split, metric_type=metric,
                       metric_value=value)
            for metric, value in evaluation.metrics.items()]


def write_eval_results_files(folder: Path, evaluations: Sequence[Evaluation], command: str) -> None:
    """`folder/.eval_results/<task id>.yaml` for the evaluations on each Hub benchmark task: the first metric of each,
    with a note naming the metric, the data and the command (the format has one score per entry)."""
    entries: dict[str, list[EvalResultEntry]] = {}
    for evaluation in evaluations:
        if evaluation.benchmark is None or not evaluation.metrics:
            continue
        dataset_id, task_id = evaluation.benchmark
        metric, value = next(iter(evaluation.metrics.items()))
        entries.setdefault(task_id, []).append(EvalResultEntry(
            dataset_id=dataset_id, task_id=task_id, value=value,
            notes=f"{metric} on {evaluation.dataset}, measured by {command}"))
    for task_id, task_entries in entries.items():
        path = folder / EVAL_RESULTS_FOLDER / f"{task_id}.yaml"
        path.parent.mkdir(exist_ok=True)
        path.write_text(yaml.safe_dump(eval_result_entries_to_yaml(task_entries), sort_keys=False), encoding="utf-8")


def _optimizer_steps(log_history: list[dict[str, Any]]) -> int:
    """The steps a log records, where the log of a run in stages starts counting again at each stage."""
    total = stage_steps = previous = 0
    for logged in log_history:
        step = logged.get("step", 0)
        if step < previous:  # a new stage
            total, stage_steps = total + stage_steps, 0
        stage_steps, previous = max(stage_steps, step), step
    return total + stage_steps


def _without_local_path(value: Any) -> str:
    """`value` as a card shows it: a local file or folder by its name only (a published card tells no one where
    the trainer's files were), lists item by item."""
    if isinstance(value, list | tuple):
        return ", ".join(_without_local_path(item) for item in value)
    if isinstance(value, str | Path) and _local_path(str(value)):
        return Path(value).name
    label, equals, path = str(value).partition("=")  # a TASK=FILE value
    if equals and _local_path(path):
        return f"{label}={Path(path).name}"
    return str(value)


def _local_path(text: str) -> bool:
    """Whether `text` names a local file or folder: one that exists, or any absolute path (a Hub id never is one;
    an output folder does not exist yet while its card is written)."""
    return bool(text) and (Path(text).is_absolute() or Path(text).expanduser().exists())


def link_roots(folder: str | Path) -> list[Path]:
    """Where a link in `folder` may lead for its target to be copied or published: into the folder itself, or into a
    Hub cache (a cached snapshot is made of links into the cache's blobs): the configured one, and the one holding
    `folder` when it is itself a snapshot (`models--org--name/snapshots/<commit>`)."""
    root = Path(folder).resolve()
    roots = [root, Path(constants.HF_HUB_CACHE).resolve()]
    if root.parent.name == "snapshots":
        roots.append(root.parent.parent / "blobs")
    return roots


def link_problem(path: Path, roots: list[Path]) -> str | None:
    """Why the link `path` may not be followed, or None (also when `path` is no link): where it leads must be inside
    `roots` (see `link_roots`) and not hidden there."""
    if not path.is_symlink():
        return None
    target = path.resolve()
    root = next((root for root in roots if target.is_relative_to(root)), None)
    if root is None:
        return "a link leading out of the folder"
    if any(part.startswith(".") for part in target.relative_to(root).parts):
        return "a link to a hidden file"
    return None


def checked_link_target(file: Path, roots: list[Path]) -> Path:
    """The file to read for the model file `file`: itself, or where its links lead when `link_problem` allows it. A
    link leading anywhere else is refused: a folder's `vocab.txt -> ~/.ssh/id_rsa` must not become a file of a copy,
    which `push` would then publish."""
    problem = link_problem(file, roots)
    if problem is not None:
        raise HfExtError(f"{file} is {problem} (to {file.resolve()}): refusing to copy it")
    return file.resolve()


def model_name(source: str | Path) -> str:
    """How published files and the served page name a model: a Hub repo id as it is, a local folder by its own name
    (a Hub cache snapshot by its repo id), never by a local path."""
    path = Path(source)
    if not path.exists():
        return str(source)
    path = path.resolve()
    if path.parent.name == "snapshots" and path.parent.parent.name.startswith("models--"):
        return path.parent.parent.name.removeprefix("models--").replace("--", "/")
    return path.name


def publishable_files(folder: str | Path, skip_refused: bool = False) -> list[tuple[str, Path]]:
    """`(path in the repository, file to read)` of what `push` publishes from `folder`: its regular files, and links
    to files inside it or in the Hub cache (read where they lead), and the `.eval_results/` folder of evaluation
    results the Hub reads. Other hidden files and folders (`.env`, `.git/`), links
    that lead anywhere else (`notes.txt -> ~/.ssh/id_rsa`) and what is not a regular file are refused with one
    error naming them, or with `skip_refused` left out with a warning."""
    folder = Path(folder)
    roots = link_roots(folder)
    files, refused = [], []

    def walk(directory: Path, prefix: str, walking: frozenset) -> None:
        for entry in sorted(directory.iterdir()):
            name = f"{prefix}{entry.name}"
            evaluation_results = not prefix and entry.name == EVAL_RESULTS_FOLDER and not entry.is_symlink()
            problem = "hidden" if entry.name.startswith(".") and not evaluation_results \
                else link_problem(entry, roots)
            target = entry.resolve()
            if problem is not None:
                refused.append(f"{name} ({problem})")
            elif target.is_dir() and target in walking:
                refused.append(f"{name} (a link to a folder holding it)")
            elif target.is_dir():
                walk(entry, f"{name}/", walking | {target})
            elif target.is_file():
                files.append((name, target))
            else:
                refused.append(f"{name} ({'a dangling link' if entry.is_symlink() else 'not a regular file'})")

    walk(folder, "", frozenset({folder.resolve()}))
    if refused and not skip_refused:
        raise HfExtError(f"refusing to publish {', '.join(refused)} from {folder}: push publishes regular files "
                         "inside the folder only (move them out, or pass --skip-refused to leave them out)")
    for name in refused:
        logger.warning(f"not publishing {name}")
    return files


def card_for_repo(card: str, local_name: str, repo_id: str) -> str:
    """`card` (a README.md) with the model loaded by `repo_id` where it was loaded by the local folder name
    `local_name`, as a card written without a Hub id says: `from_pretrained("NAME")` and `hf-ext ... NAME`."""
    quoted = card.replace(f'"{local_name}"', f'"{repo_id}"')
    command = re.compile(rf"(\bhf-ext(?: [a-z0-9-]+)+ ){re.escape(local_name)}(?![\w./-])")
    published = command.sub(lambda match: match.group(1) + repo_id, quoted)
    parsed = ModelCard(published, ignore_metadata_errors=True)
    data = parsed.data
    if isinstance(data, ModelCardData) and data.eval_results and data.model_name == local_name:
        data.model_name = repo_id  # the model-index names the model
        return str(parsed)
    return published


def push_folder(folder: str | Path, repo_id: str, token: str | None = None, private: bool = False,
                revision: str | None = None, commit_message: str | None = None, endpoint: str | None = None,
                skip_refused: bool = False, allow_no_card: bool = False) -> str:
    """Create `repo_id` if needed and upload the files of `folder` that `publishable_files` accepts as a single
    commit, listing them (names and sizes) and saying whether the repository is public first; returns the commit
    URL. A folder without a model card (README.md) is refused unless `allow_no_card`; a card that loads the model
    by the folder's own name is published loading it by `repo_id` (`card_for_repo`; the folder is not changed)."""
    from huggingface_hub import CommitOperationAdd

    folder = Path(folder)
    if not folder.is_dir() or not (folder / "config.json").is_file():
        raise HfExtError(f"{folder} is not a model folder (no config.json)")
    files = publishable_files(folder, skip_refused)
    card_path = dict(files).get(CARD)
    if card_path is None and not allow_no_card:
        raise HfExtError(f"{folder} has no model card ({CARD}): write one (the Hub shows it as the model's page), or "
                         "pass --allow-no-card to publish the folder without one")
    card = card_path.read_text(encoding="utf-8") if card_path is not None else None
    published_card = card_for_repo(card, folder.resolve().name, repo_id) if card is not None else None
    sizes = {name: path.stat().st_size for name, path in files}
    api = HfApi(endpoint=endpoint, token=token)
    try:
        logger.info(f"creating {repo_id} (if needed)")
        # not private=False: a repository of an organization whose repositories are private by default stays so
        api.create_repo(repo_id, private=private or None, exist_ok=True, repo_type="model")
        is_private = bool(api.model_info(repo_id).private)
        if private and not is_private:
            logger.warning(f"{repo_id} exists and is public: --private does not change an existing repository")
        files_text = f"{len(files)} file{'' if len(files) == 1 else 's'} ({sum(sizes.values()) / 2**20:.1f} MiB)"
        visibility = "a private repository" if is_private else "a public repository (anyone can read it)"
        logger.info(f"uploading {files_text} from {folder} to {repo_id}, {visibility}:")
        for name, size in sizes.items():
            logger.info(f"  {name} ({_size(size)})")
        if published_card != card:
            logger.info(f"  ({CARD}: the model loaded by {repo_id!r} instead of the folder's name)")
        operations = [CommitOperationAdd(path_in_repo=name, path_or_fileobj=published_card.encode("utf-8")
                                         if name == CARD and published_card is not None and published_card != card
                                         else str(path))
                      for name, path in files]
        info = api.create_commit(repo_id, operations, repo_type="model", revision=revision,
                                 commit_message=commit_message or f"Upload {folder.name} with hf-ext")
    except HfHubHTTPError as error:
        raise HfExtError(f"push to {repo_id} failed: {str(error).splitlines()[0]}") from None
    url = getattr(info, "commit_url", None) or str(info)
    logger.info(f"pushed: {url}")
    return url


def _size(size: float) -> str:
    for unit in ("bytes", "KiB", "MiB"):
        if size < 1024 or unit == "MiB":
            return f"{size} {unit}" if unit == "bytes" else f"{size:.1f} {unit}"
        size /= 1024
    return ""


def install_into_hub_cache(folder: str | Path, repo_id: str, hub_cache: str | Path) -> Path:
    """Lay `folder` out as the cached snapshot of `repo_id` (refs/main -> a 40-hex commit), as a download would."""
    folder = Path(folder)
    commit = hashlib.sha1(repo_id.encode()).hexdigest()
    repo_dir = Path(hub_cache) / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo_dir / "snapshots" / commit
    if snapshot.exists():
        shutil.rmtree(snapshot)
    snapshot.mkdir(parents=True)
    roots = link_roots(folder)
    for file in sorted(folder.rglob("*")):
        if not file.is_dir():
            target = snapshot / file.relative_to(folder)
            target.parent.mkdir(parents=True, exist_ok=True)
            copy_file(checked_link_target(file, roots), target)
    (repo_dir / "refs").mkdir(parents=True, exist_ok=True)
    (repo_dir / "refs" / "main").write_text(commit)
    # Cached "does not exist" entries, as a download records them, so that offline loading neither probes the
    # network nor fails: the adapter config PEFT looks for, and the config.json that AutoTokenizer reads first in a
    # tokenizer subfolder (the processor's decoder_tokenizer/). They override real files, so only absent ones.
    absent = repo_dir / ".no_exist" / commit
    shutil.rmtree(absent, ignore_errors=True)
    probed = ["adapter_config.json"] + [f"{d.relative_to(snapshot).as_posix()}/config.json"
                                        for d in snapshot.rglob("*") if d.is_dir()]
    for name in probed:
        if not (snapshot / name).exists():
            (absent / name).parent.mkdir(parents=True, exist_ok=True)
            (absent / name).touch()
    return snapshot


@contextmanager
def hub_offline() -> Iterator[None]:
    """No request to the Hub inside this block, whatever the environment: what `HF_HUB_OFFLINE=1` does, for work that
    only reads local files. huggingface_hub (and transformers through it) reads `constants.HF_HUB_OFFLINE` at each
    call; `datasets`, when already imported, keeps its own copy. Without it, loading from a local Hub cache still
    asks the Hub for an `adapter_config.json` and huggingface_hub fetches its agent registry for request headers."""
    # each holds its own HF_HUB_OFFLINE flag (None: datasets is not imported)
    modules: list[Any] = [constants, sys.modules.get("datasets.config")]
    previous = [module.HF_HUB_OFFLINE for module in modules if module is not None]
    for module in modules:
        if module is not None:
            module.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        for module, value in zip([m for m in modules if m is not None], previous, strict=True):
            module.HF_HUB_OFFLINE = value
