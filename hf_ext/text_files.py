"""Reading the text files that converters and training commands take (GLUE TSVs, JSON lines, plain text, JSON
configs), with one clear `HfExtError` line for a file that is missing, not UTF-8 or not JSON where JSON is
expected."""

import json
from collections.abc import Iterator
from pathlib import Path

from .errors import HfExtError


def read_lines(path: str | Path, what: str) -> list[str]:
    """The lines of the UTF-8 text file at `path` (`what` names it in errors). utf-8-sig drops a byte-order mark (the
    GLUE MRPC files start with one); only newlines end a line, since texts hold other characters that
    `str.splitlines` would split on."""
    path = Path(path)
    if not path.is_file():
        raise HfExtError(f"{what} {path} does not exist")
    try:
        return [line.rstrip("\r") for line in path.read_text(encoding="utf-8-sig").split("\n")]
    except UnicodeDecodeError as error:
        raise HfExtError(f"{what} {path} is not UTF-8 text ({error.reason} at byte {error.start})") from None


def json_lines(path: str | Path, what: str) -> Iterator[tuple[str, object]]:
    """`(where, value)` for every non-blank line of the JSON-lines file at `path`; `where` ("PATH, line N") is for
    the caller's own errors about the value."""
    for number, line in enumerate(read_lines(path, what), 1):
        if not line.strip():
            continue
        where = f"{path}, line {number}"
        try:
            yield where, json.loads(line)
        except json.JSONDecodeError as error:
            raise HfExtError(f"{where}: not JSON ({error.msg})") from None


MAX_JSON_BYTES = 64 << 20  # far above any config; a larger "config" is something else


def read_json(path: str | Path, what: str) -> object:
    """A JSON document; one `HfExtError` line for a missing, special (a FIFO would block, /dev/zero never ends),
    oversized or malformed file."""
    path = Path(path)
    if not path.exists():
        raise HfExtError(f"{what} {path} does not exist")
    if not path.is_file():
        raise HfExtError(f"{what} {path} is not a regular file")
    if path.stat().st_size > MAX_JSON_BYTES:
        raise HfExtError(f"{what} {path} is {path.stat().st_size} bytes, too large for a JSON config")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise HfExtError(f"{what} {path} is not valid JSON ({error})") from None
