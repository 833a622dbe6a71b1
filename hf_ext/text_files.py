"""Reading the text files that converters and training commands take (GLUE TSVs, JSON lines, plain text, JSON
configs, YAML settings), with one clear `HfExtError` line for a file that is missing, not UTF-8 or not JSON where
JSON is expected, and a YAML loader that refuses alias bombs."""

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from .errors import HfExtError

MAX_ALIAS_VALUES = 100_000  # values that aliases may add to a YAML document: far above what a settings file needs


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


class BoundedYamlLoader(yaml.SafeLoader):
    """PyYAML's safe loader refusing a document whose aliases expand it by more than `MAX_ALIAS_VALUES` values or
    refer to a node that holds them, and one nested too deeply to parse. An alias stands for an earlier node, so a
    few lines of nested aliases stand for billions of values (the "billion laughs"), which anything that walks the
    result would expand: an error message quoting it, for one. Measured on the composed nodes, before any Python
    object is built. Use as `yaml.load(text, Loader=BoundedYamlLoader)`."""

    def get_single_node(self) -> yaml.Node | None:
        try:
            node = super().get_single_node()
        except RecursionError:
            raise yaml.YAMLError("the document is nested too deeply") from None
        sizes: dict[int, int] = {}
        if node is not None and expanded_values(node, sizes, set()) - len(sizes) > MAX_ALIAS_VALUES:
            raise yaml.YAMLError(f"its aliases expand it by more than {MAX_ALIAS_VALUES} values (an alias bomb)")
        return node


def expanded_values(node: yaml.Node, sizes: dict[int, int], walking: set[int]) -> int:
    """How many values `node` stands for with its aliases expanded, counting each node once (`sizes` keeps the count
    of the nodes met so far, so an alias costs nothing however often it repeats); a `yaml.YAMLError` for an alias
    inside the node it names (`walking` holds the nodes being counted)."""
    if id(node) in walking:
        raise yaml.composer.ComposerError(None, None, "an alias refers to a node that holds it", node.start_mark)
    if id(node) not in sizes:
        walking.add(id(node))
        children = [child for pair in node.value for child in pair] if isinstance(node, yaml.MappingNode) else \
            node.value if isinstance(node, yaml.SequenceNode) else []
        sizes[id(node)] = 1 + sum(expanded_values(child, sizes, walking) for child in children)
        walking.discard(id(node))
    return sizes[id(node)]


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


def read_json_object(path: str | Path, what: str) -> dict[str, Any]:
    """A JSON document that must be an object (a config), as `read_json` reads it."""
    document = read_json(path, what)
    if not isinstance(document, dict):
        raise HfExtError(f"{what} {path} is not a JSON object")
    return document
