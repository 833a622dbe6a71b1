"""Hub work through huggingface_hub: model cards from `model_cards/`, pushing a folder as one commit, and laying a
folder into a local Hub cache so that `from_pretrained("org/name")` resolves offline."""

import hashlib
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from typing import Any

from huggingface_hub import HfApi, ModelCard, ModelCardData, constants
from huggingface_hub.errors import HfHubHTTPError
from transformers.utils import logging

from .errors import HfExtError

logger = logging.get_logger(__name__)


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


def push_folder(folder: str | Path, repo_id: str, token: str | None = None, private: bool = False,
                revision: str | None = None, commit_message: str | None = None, endpoint: str | None = None) -> str:
    """Create `repo_id` if needed and upload `folder` as a single commit; returns the commit URL."""
    folder = Path(folder)
    if not folder.is_dir() or not (folder / "config.json").is_file():
        raise HfExtError(f"{folder} is not a model folder (no config.json)")
    files = [p for p in folder.rglob("*") if p.is_file()]
    size = sum(p.stat().st_size for p in files)
    api = HfApi(endpoint=endpoint, token=token)
    try:
        logger.info(f"creating {repo_id} (if needed)")
        api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
        logger.info(f"uploading {len(files)} files ({size / 2**20:.1f} MiB) from {folder} to {repo_id}")
        info = api.upload_folder(folder_path=str(folder), repo_id=repo_id, repo_type="model", revision=revision,
                                 commit_message=commit_message or f"Upload {folder.name} with hf-ext")
    except HfHubHTTPError as error:
        raise HfExtError(f"push to {repo_id} failed: {str(error).splitlines()[0]}") from None
    url = getattr(info, "commit_url", None) or str(info)
    logger.info(f"pushed: {url}")
    return url


def install_into_hub_cache(folder: str | Path, repo_id: str, hub_cache: str | Path) -> Path:
    """Lay `folder` out as the cached snapshot of `repo_id` (refs/main -> a 40-hex commit), as a download would."""
    commit = hashlib.sha1(repo_id.encode()).hexdigest()
    repo_dir = Path(hub_cache) / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo_dir / "snapshots" / commit
    if snapshot.exists():
        shutil.rmtree(snapshot)
    shutil.copytree(folder, snapshot)
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
    modules = [constants, sys.modules.get("datasets.config")]
    previous = [module.HF_HUB_OFFLINE for module in modules if module is not None]
    for module in modules:
        if module is not None:
            module.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        for module, value in zip([m for m in modules if m is not None], previous):
            module.HF_HUB_OFFLINE = value
