"""The one exception type the CLI turns into a single clear error line and a non-zero exit."""


class HfExtError(Exception):
    """A user-facing failure: bad input, a refused checkpoint, a bad argument. The message is one line."""
