"""The one exception type the CLI turns into a single clear error line and a non-zero exit (loading failures are
turned into it by `hf_ext.loading`)."""


class HfExtError(Exception):
    """A user-facing failure: bad input, a refused checkpoint, a bad argument. The message is one line."""


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
