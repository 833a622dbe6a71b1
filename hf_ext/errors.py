"""The one exception type the CLI turns into a single clear error line and a non-zero exit, and the translation of
model-loading failures into it."""

import contextlib
from collections.abc import Iterator


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
                         f"({_one_line(error)})") from None
    except (OSError, ValueError, StrictDataclassError) as error:
        raise HfExtError(f"cannot load {what} from {source}: {_one_line(error)}") from None


def _one_line(error):
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    return " ".join(lines[:2]) if lines else type(error).__name__
