"""Marked copies stay copies (the rule of transformers' utils/check_copies.py). Remote-code files may import only
torch, transformers and their own folder, so code two models share is copied, and the copy is marked on the line
above it (above its decorators):

    # Copied from hf_ext.models.optimus.configuration_optimus._check_sizes
    # Copied from hf_ext.models.optimus.modeling_optimus.OptimusPreTrainedModel._init_weights with decoder->encoder

The marked function, method or class must equal its source, decorators included, once the source's indentation is
that of the copy and each `A->B` rename is applied to the source text in turn. A marker is one line: one longer than
the line limit ends with `  # noqa: E501`."""

import ast
import difflib
import re
import textwrap
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "hf_ext"
MARKER = re.compile(r"^(?P<indent>\s*)# Copied from (?P<source>hf_ext(?:\.\w+)+)(?: with (?P<renames>.+?))?"
                    r"(?:  # noqa: E501)?$")
DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def definition_text(lines: list[str], node: ast.AST) -> str:
    """The text of a definition, its decorators included, dedented."""
    first = min([node.lineno, *(decorator.lineno for decorator in node.decorator_list)])
    return textwrap.dedent("\n".join(lines[first - 1:node.end_lineno])) + "\n"


def find_definition(tree: ast.Module, qualified_name: str) -> ast.AST | None:
    """The function or class `Outer.inner` in a module, or None."""
    scope = tree.body
    node = None
    for name in qualified_name.split("."):
        node = next((item for item in scope if isinstance(item, DEFINITIONS) and item.name == name), None)
        if node is None:
            return None
        scope = node.body
    return node


def source_text(dotted: str) -> str:
    """The text of the definition a marker names (`hf_ext.<module path>.<object path>`)."""
    parts = dotted.split(".")
    for split in range(len(parts) - 1, 0, -1):
        path = PACKAGE.parent.joinpath(*parts[:split]).with_suffix(".py")
        if path.is_file():
            text = path.read_text(encoding="utf-8")
            node = find_definition(ast.parse(text), ".".join(parts[split:]))
            if node is None:
                raise LookupError(f"{path.relative_to(PACKAGE.parent)} defines no {'.'.join(parts[split:])}")
            return definition_text(text.splitlines(), node)
    raise LookupError(f"no module of hf_ext holds {dotted}")


def apply_renames(text: str, renames: str | None) -> str:
    for rename in (renames or "").split(","):
        if rename.strip():
            old, new = (part.strip() for part in rename.split("->"))
            text = text.replace(old, new)
    return text


def copy_problems(path: Path, text: str | None = None) -> list[str]:
    """What is wrong with the marked copies of one file (its text given, or read): a marker over no definition, a
    source that does not exist, or a copy that differs from its source (as a diff)."""
    text = path.read_text(encoding="utf-8") if text is None else text
    lines = text.splitlines()
    definitions = sorted((node for node in ast.walk(ast.parse(text)) if isinstance(node, DEFINITIONS)),
                         key=lambda node: node.lineno)
    problems = []
    for number, line in enumerate(lines, 1):
        marker = MARKER.match(line)
        if marker is None:
            continue
        where = f"{path.relative_to(PACKAGE.parent)}:{number}"
        node = next((node for node in definitions
                     if min([node.lineno, *(d.lineno for d in node.decorator_list)]) == number + 1), None)
        if node is None:
            problems.append(f"{where}: the marker stands over no function, method or class")
            continue
        try:
            expected = apply_renames(source_text(marker["source"]), marker["renames"])
        except LookupError as error:
            problems.append(f"{where}: {error}")
            continue
        copy = definition_text(lines, node)
        if copy != expected:
            diff = difflib.unified_diff(expected.splitlines(), copy.splitlines(), f"{marker['source']} (renamed)",
                                        where, lineterm="")
            problems.append(f"{where}: {node.name} differs from {marker['source']}:\n" + "\n".join(diff))
    return problems


def marked_files() -> list[Path]:
    return sorted(path for path in PACKAGE.rglob("*.py")
                  if any(MARKER.match(line) for line in path.read_text(encoding="utf-8").splitlines()))


def test_every_marked_copy_equals_its_source():
    files = marked_files()
    assert files, "no marked copies found: the marker pattern no longer matches"
    problems = [problem for path in files for problem in copy_problems(path)]
    assert not problems, "\n\n".join(problems)


def test_the_known_copies_are_marked():
    """The copies remote code forces (issue 25): the encoder-size validation of ERNIE 2.0 and MT-DNN (Optimus'),
    and the linear-layer initialisation MT-DNN shares with Optimus."""
    marked = {(path.relative_to(PACKAGE).as_posix(), MARKER.match(line)["source"])
              for path in marked_files() for line in path.read_text(encoding="utf-8").splitlines()
              if MARKER.match(line)}
    assert marked >= {
        ("models/ernie2/configuration_ernie2.py", "hf_ext.models.optimus.configuration_optimus._check_sizes"),
        ("models/mtdnn/configuration_mtdnn.py", "hf_ext.models.optimus.configuration_optimus._check_sizes"),
        ("models/mtdnn/modeling_mtdnn.py",
         "hf_ext.models.optimus.modeling_optimus.OptimusPreTrainedModel._init_weights"),
    }


@pytest.mark.parametrize("change, message", [
    (lambda text: text.replace("value < 1", "value < 0", 1), "differs from"),  # the copy drifts
    (lambda text: text.replace("configuration_optimus._check_sizes", "configuration_optimus._check_size", 1),
     "defines no _check_size"),
    (lambda text: text.replace("def _check_sizes(", "def check_sizes(", 1), "differs from"),
    (lambda text: text.replace("# Copied from hf_ext.models.optimus.configuration_optimus._check_sizes",
                               "# Copied from hf_ext.models.optimus.configuration_optimus._check_sizes\n", 1),
     "stands over no function"),
])
def test_a_drifted_or_misplaced_copy_is_found(change, message):
    path = PACKAGE / "models" / "mtdnn" / "configuration_mtdnn.py"
    assert copy_problems(path) == []
    problems = copy_problems(path, change(path.read_text(encoding="utf-8")))
    assert len(problems) == 1 and message in problems[0], problems


def test_renames_are_applied_to_the_source():
    path = PACKAGE / "models" / "mtdnn" / "modeling_mtdnn.py"
    text = path.read_text(encoding="utf-8")
    assert copy_problems(path) == []
    assert "differs from" in copy_problems(path, text.replace(" with _init_weights->_init_linear_weights, "
                                                              "decoder->encoder", " with decoder->encoder"))[0]
    assert "differs from" in copy_problems(path, text.replace("decoder->encoder", "decoder->decoder"))[0]
