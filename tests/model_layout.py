"""The layout rules of docs/architecture.md as functions over one model package (its folder and its `ModelEntry`) or
over a tree of Python files, so that `tests/test_layout.py` checks every model of `MODELS` and the toy model of
`tests/test_toy_model.py` passes the same checks. Each returns the problems it finds (empty: none)."""

import ast
import re
import sys
import textwrap
from pathlib import Path

from transformers.dynamic_module_utils import get_imports, get_relative_imports

from hf_ext.registration import ModelEntry

REMOTE_CODE_PREFIXES = ("configuration_", "modeling_", "processing_", "pipeline_")
# what a remote-code file may import where only transformers (with torch) is installed: transformers' own check
# (`check_imports`) imports every top-level module that `get_imports` finds. Packages that transformers happens to
# require (numpy, PyYAML, huggingface_hub, ...) are left out: the rule is torch, transformers, the standard library.
REMOTE_CODE_IMPORTS = {"torch", "transformers", *sys.stdlib_module_names}


def module_name(path: Path, root: Path) -> str:
    """The dotted name of the module at `path` under the import root `root` (a package is its `__init__`)."""
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, root: Path) -> list[str]:
    """Every module `path` imports anywhere in the file (in functions and `TYPE_CHECKING` blocks too), as absolute
    names: relative imports resolved, `from package import name` as `package.name` (which may be a submodule)."""
    module = module_name(path, root)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module
            names += [source] + [f"{source}.{alias.name}" for alias in node.names]
    return names


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """`{module: the modules of the package it imports}` over every file of `root/package`, imports anywhere in a
    file counted: `from x import name` points at the submodule x.name where there is one, else at x; `import a.b`
    at a.b."""
    modules = {module_name(path, root): path for path in sorted((root / package).rglob("*.py"))}
    graph = {}
    for module, path in modules.items():
        current = module if path.name == "__init__.py" else module.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets |= {alias.name for alias in node.names if alias.name in modules}
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = current.split(".")[: len(current.split(".")) - node.level + 1]
                    source = ".".join(parts + ([node.module] if node.module else []))
                else:
                    source = node.module
                submodules = {f"{source}.{alias.name}" for alias in node.names} & modules.keys()
                targets |= submodules
                if len(submodules) < len(node.names) and source in modules:
                    targets.add(source)
        graph[module] = targets - {module}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import loops of `graph`: each strongly connected group of modules that import each other (Tarjan)."""
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                cycles.append(sorted(group))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(graph)))
    try:
        for node in sorted(graph):
            if node not in index:
                visit(node)
    finally:
        sys.setrecursionlimit(limit)
    return cycles


# ----- one model package -------------------------------------------------------------------------------------------

def remote_code_problems(folder: Path) -> list[str]:
    """A model's remote-code files (`configuration_*`, `modeling_*`, `processing_*`, `pipeline_*`) import, as
    transformers counts imports (`get_imports`: every import line outside try/except, indented ones included),
    only torch, transformers and the standard library, and by single-dot relative import (`from .x import y`, which
    `save_pretrained` follows to copy the file) only the folder's other remote-code files."""
    files = sorted(path for path in folder.glob("*.py") if path.name.startswith(REMOTE_CODE_PREFIXES))
    problems = [] if any(path.name.startswith("modeling_") for path in files) else [f"{folder} has no modeling_ file"]
    own = {path.stem for path in files}
    for path in files:
        for name in get_imports(path):
            if name not in REMOTE_CODE_IMPORTS:
                problems.append(f"{path.name} imports {name}: remote code may import only torch, transformers and "
                                "the standard library (where hf-ext is not installed, transformers' check_imports "
                                "refuses the folder without it)")
        for name in get_relative_imports(path):
            if name not in own:
                problems.append(f"{path.name} imports .{name}, which is not a remote-code file of its folder")
        source = path.read_text(encoding="utf-8")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ImportFrom) and node.level and (node.level > 1 or not node.module):
                problems.append(f"{path.name}:{node.lineno}: only `from .module import name` is copied with the "
                                "remote code")
    return problems


def package_import_problems(folder: Path, root: Path, packages: list[str]) -> list[str]:
    """A model package imports, besides its own modules, only the shared layer (`hf_ext`, not `hf_ext.models.*` of
    another model, nor the entry point `hf_ext.cli`). `packages`: the module names of every model package."""
    own = module_name(folder / "__init__.py", root)
    others = [package for package in packages if package != own]
    problems = []
    for path in sorted(folder.rglob("*.py")):
        for name in imported_modules(path, root):
            if any(name == other or name.startswith(other + ".") for other in others):
                problems.append(f"{path.name} imports {name}, a module of another model")
            if name == "hf_ext.cli" or name.startswith("hf_ext.cli."):
                problems.append(f"{path.name} imports the entry point hf_ext.cli (its helpers are in hf_ext.cli_utils)")
    return problems


def conversion_script(entry: ModelEntry) -> str:
    """The text of the model's script in `conversion/` (`ModelEntry.conversion_script`): its converter as a program,
    `hf-ext convert NAME` under the script's name."""
    conversion = entry.module(entry.conversion)
    summary = textwrap.fill(f'"""`hf-ext convert {conversion.CONVERT_NAME}` as a script: convert '
                            f'{conversion.CONVERT_SUMMARY}; see `--help`."""', width=120)
    return (f"#!/usr/bin/env python\n{summary}\n\nimport sys\n\nfrom hf_ext.cli_utils import convert_main\n"
            f"from {entry.package} import conversion\n\nif __name__ == \"__main__\":\n"
            "    sys.exit(convert_main(conversion))\n")


def package_stub(entries: list[ModelEntry]) -> str:
    """The text of `hf_ext/__init__.pyi`: the names `hf_ext/__init__.py` exports (`MODELS`, `__version__` and each
    entry's `top_level`, which it re-exports in a loop at import time) written out for type checkers, which do not
    run that loop. Without it, `from hf_ext import OptimusModel` does not type-check in a user's code."""
    imports = [f"from {entry.package} import {name} as {name}"
               for entry in sorted(entries, key=lambda entry: entry.package)
               for name in sorted(entry.top_level, key=str.lower)]
    # a line over the limit wrapped as ruff's import sorting wraps it
    imports = [line if len(line) <= 120 else line.replace(" import ", " import (\n    ") + ",\n)"
               for line in imports]
    names = ["MODELS", "__version__", *(name for entry in entries for name in entry.top_level)]
    return ("# What `hf_ext/__init__.py` exports, for type checkers: written from MODELS by `package_stub` in\n"
            "# tests/model_layout.py; tests/test_layout.py prints the text when it no longer matches.\n"
            "from hf_ext.models import MODELS as MODELS\n" + "".join(f"{line}\n" for line in imports) +
            "\n__version__: str\n\n__all__ = [\n" + "".join(f'    "{name}",\n' for name in names) + "]\n")


def entry_problems(entry: ModelEntry, package: object, conversion_dir: Path, card_dir: Path) -> list[str]:
    """The entry a model package declares: its fields name what exists (the package's classes, its modules and
    what each offers, the card template in `card_dir`, the script in `conversion_dir` with the text
    `conversion_script` gives)."""
    problems = []
    if getattr(package, "ENTRY", None) is not entry or entry.package != package.__name__:
        problems.append(f"{package.__name__}.ENTRY is not this package's entry")
    if not entry.config_class.model_type or not entry.auto_classes or not entry.display_name:
        problems.append(f"{entry.name}: the entry needs a model type, Auto classes and a display name")
    problems += [f"{entry.name}: top_level names {name}, which the package lacks"
                 for name in entry.top_level if not hasattr(package, name)]
    conversion = entry.module(entry.conversion)
    if not (conversion.CONVERT_NAME and conversion.CONVERT_SUMMARY and callable(conversion.add_arguments)
            and callable(conversion.run) and callable(getattr(conversion, "looks_original", None))):
        problems.append(f"{entry.name}: its conversion module lacks CONVERT_NAME, CONVERT_SUMMARY, add_arguments, "
                        "run or looks_original")
    if entry.commands is not None and not callable(entry.module(entry.commands).register):
        problems.append(f"{entry.name}: its commands module has no register(commands)")
    if entry.app is not None:
        app = entry.module(entry.app)
        if entry.model_type not in app.MODEL_TYPES or not callable(app.build_app) or not entry.app_summary:
            problems.append(f"{entry.name}: its app needs MODEL_TYPES (with {entry.model_type!r}), build_app and "
                            "the entry's app_summary")
    elif entry.app_summary is not None:
        problems.append(f"{entry.name}: app_summary without an app")
    if entry.export_onnx is not None:
        exporter = entry.module(entry.export_onnx)
        if not (exporter.MODEL_TYPES and callable(exporter.tasks) and callable(exporter.plan)):
            problems.append(f"{entry.name}: its export_onnx module needs MODEL_TYPES, tasks and plan")
    if not (card_dir / f"{entry.card_template}.md").is_file():
        problems.append(f"{entry.name}: no model card template {card_dir.name}/{entry.card_template}.md")
    script = conversion_dir / entry.conversion_script
    expected = conversion_script(entry)
    if not script.is_file() or script.read_text(encoding="utf-8") != expected:
        problems.append(f"{entry.name}: {conversion_dir.name}/{entry.conversion_script} must read:\n{expected}")
    return problems


# ----- the top-level folders made from the entries -----------------------------------------------------------------

def drift_problems(entries: list[ModelEntry], conversion_dir: Path, card_dir: Path,
                   shared_cards: set[str]) -> list[str]:
    """`conversion/` holds one script per model (each entry's) and nothing else; `model_cards/` one template per
    model (each entry's) besides the `shared_cards` that the shared layer renders."""
    scripts = {path.name for path in conversion_dir.glob("*.py")}
    cards = {path.stem for path in card_dir.glob("*.md")}
    problems = [f"{conversion_dir.name}/{name} belongs to no model" for name in
                sorted(scripts - {entry.conversion_script for entry in entries})]
    problems += [f"{conversion_dir.name}/ lacks {entry.conversion_script}" for entry in entries
                 if entry.conversion_script not in scripts]
    problems += [f"{card_dir.name}/{name}.md belongs to no model" for name in
                 sorted(cards - {entry.card_template for entry in entries} - shared_cards)]
    problems += [f"{card_dir.name}/ lacks {entry.card_template}.md" for entry in entries
                 if entry.card_template not in cards]
    return problems


# ----- the shared layer ----------------------------------------------------------------------------------------------

def code_names(path: Path) -> list[tuple[int, str]]:
    """`(line, text)` of what the code of `path` names: identifiers (names, attributes, definitions, imports) and
    string literals that are not docstrings. Comments and docstrings are prose (they may say where a format comes
    from) and are left out."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant) and isinstance(node.body[0].value.value, str)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            found.append((node.lineno, node.value))
        elif isinstance(node, ast.Name):
            found.append((node.lineno, node.id))
        elif isinstance(node, ast.Attribute):
            found.append((node.lineno, node.attr))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.append((node.lineno, node.name))
        elif isinstance(node, ast.alias):
            found.append((node.lineno, node.name))
    return found


def model_words(entry: ModelEntry) -> set[str]:
    """The words that name a model: its folder, model type, display name and converter name, in lower case."""
    conversion = entry.module(entry.conversion)
    return {word.lower() for word in (entry.name, entry.model_type, entry.display_name, conversion.CONVERT_NAME)}


def naming_problems(path: Path, words: set[str]) -> list[str]:
    """Where the code of `path` names one of `words` (whole words, any case; `_` and `-` count as word
    characters)."""
    pattern = re.compile(r"(?<![\w-])(" + "|".join(sorted(map(re.escape, words), key=len, reverse=True))
                         + r")(?![\w-])", re.IGNORECASE)
    return [f"{path.name}:{line} names {match.group(1)!r} in {text!r}"
            for line, text in sorted(code_names(path)) for match in pattern.finditer(text)]
