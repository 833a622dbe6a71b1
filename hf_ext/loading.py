"""Loading a model's configuration and tokenizer from a folder or Hub repo id, and the translation of loading
failures (missing or unreadable files, corrupt weights, invalid configs) into one `HfExtError` line."""

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import HfExtError, one_line

if TYPE_CHECKING:  # transformers is imported only when a config is loaded
    from transformers import PretrainedConfig, PreTrainedTokenizerBase


@contextlib.contextmanager
def loading(what: str, source: object) -> Iterator[None]:
    """Turn a failure to load `what` from `source` (a folder or Hub repo id) inside the block into one `HfExtError`
    line naming both: missing or unreadable files, truncated or corrupt safetensors weights, invalid configs."""
    from huggingface_hub.errors import StrictDataclassError
    from safetensors import SafetensorError

    try:
        yield
    except SafetensorError as error:
        raise HfExtError(f"cannot load {what} from {source}: its safetensors weights are corrupt or truncated "
                         f"({one_line(error)})") from None
    except (OSError, ValueError, StrictDataclassError) as error:
        raise HfExtError(f"cannot load {what} from {source}: {one_line(error)}") from None


def load_config(source: str, expected_type: str | None = None, description: str | None = None,
                trust_remote_code: bool = False, hint: str = "") -> "PretrainedConfig":
    """The configuration of `source` (a folder or Hub repo id), with one error line when it does not load or, given
    `expected_type`, when it holds another kind of model (`description` names the expected kind, `hint` may say
    what to do instead). Checked before any weights are read."""
    from transformers import AutoConfig

    # a name that is no folder was taken for a Hub repo id: say so, lest a typo read as a network failure
    where = source if Path(source).expanduser().is_dir() else f"{source} (no folder of that name; as a Hub repo id)"
    with loading("a model config", where):
        config = AutoConfig.from_pretrained(source, trust_remote_code=trust_remote_code)
    if expected_type is not None and config.model_type != expected_type:
        raise HfExtError(f"{source} holds a {config.model_type!r} model, not {description or expected_type}{hint}")
    return config


# files a saved tokenizer leaves in its folder (transformers 5 writes the first two; older folders hold a vocabulary
# or a sentencepiece model)
TOKENIZER_FILES = ("tokenizer_config.json", "tokenizer.json", "vocab.txt", "vocab.json")


def require_tokenizer_files(source: str) -> None:
    """Raise `HfExtError` for a folder that holds no tokenizer at all, saying how to give it one: transformers would
    build an empty tokenizer from its config alone, or answer with a paragraph about the Hub."""
    folder = Path(source).expanduser()
    if folder.is_dir() and not any((folder / name).is_file() for name in TOKENIZER_FILES) \
            and not any(folder.glob("*.model")):
        raise HfExtError(f"{source} has no tokenizer: save one into the folder "
                         f"(AutoTokenizer.from_pretrained(NAME).save_pretrained({str(folder)!r})), or convert the "
                         "original again with --tokenizer NAME where its converter offers it")


def load_tokenizer(source: str, trust_remote_code: bool = False) -> "PreTrainedTokenizerBase":
    """The tokenizer of `source` (a folder or Hub repo id), with one error line when it has none that loads."""
    from transformers import AutoTokenizer

    require_tokenizer_files(source)
    try:
        return AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as error:
        raise HfExtError(f"{source} has no usable tokenizer: {one_line(error)}") from None
