"""The one exception type the CLI turns into a single clear error line and a non-zero exit, and the translation of
model-loading failures into it."""

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # transformers is imported only when a config is loaded
    from transformers import PretrainedConfig, PreTrainedTokenizerBase


class HfExtError(Exception):
    """A user-facing failure: bad input, a refused checkpoint, a bad argument. The message is one line."""


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


def one_line(error: BaseException) -> str:
    """An exception's message as one line: its first two lines joined (transformers' strict config checks put the
    detail on the second), or its type name when it has no message."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    return " ".join(lines[:2]) if lines else type(error).__name__


def require(condition: object, message: str) -> None:
    """Raise `HfExtError(message)` unless `condition` holds: a check of input that argparse's `type=` validators
    (`hf_ext.arguments`) cannot make alone, such as one option against another or against the model."""
    if not condition:
        raise HfExtError(message)


def load_config(source: str, expected_type: str | None = None, description: str | None = None,
                trust_remote_code: bool | None = None, hint: str = "") -> "PretrainedConfig":
    """The configuration of `source` (a folder or Hub repo id), with one error line when it does not load or, given
    `expected_type`, when it holds another kind of model (`description` names the expected kind, `hint` may say
    what to do instead). Checked before any weights are read."""
    from transformers import AutoConfig

    with loading("a model config", source):
        config = AutoConfig.from_pretrained(source, trust_remote_code=trust_remote_code)
    if expected_type is not None and config.model_type != expected_type:
        raise HfExtError(f"{source} holds a {config.model_type!r} model, not {description or expected_type}{hint}")
    return config


def load_tokenizer(source: str, trust_remote_code: bool | None = None) -> "PreTrainedTokenizerBase":
    """The tokenizer of `source` (a folder or Hub repo id), with one error line when it has none that loads."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as error:
        raise HfExtError(f"{source} has no usable tokenizer: {one_line(error)}") from None
