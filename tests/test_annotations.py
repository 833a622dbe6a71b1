"""Every public function and method in `hf_ext/` carries complete type annotations (the package ships `py.typed`):
each parameter, `*args` and `**kwargs` included (only the `self`/`cls` of a method is exempt), and the return.

Public means reachable under public names: module-level functions and the methods of module-level classes (nested
classes included) whose own names, and the names of the classes holding them, do not start with `_`. So private
functions, private methods, dunder methods (`__init__`, `__call__`, ...) and everything in a private class are exempt,
as are functions nested inside other functions (closures are not part of the API). Read with `ast`, nothing is
imported.
"""

import ast

from conftest import REPO_ROOT

PACKAGE = REPO_ROOT / "hf_ext"


def _missing_annotations(function: ast.FunctionDef | ast.AsyncFunctionDef, is_method: bool) -> list[str]:
    arguments = function.args
    positional = [*arguments.posonlyargs, *arguments.args]
    # a staticmethod's first parameter is an ordinary one
    static = any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in function.decorator_list)
    if is_method and not static and positional and positional[0].arg in ("self", "cls"):
        positional = positional[1:]
    missing = [a.arg for a in [*positional, *arguments.kwonlyargs] if a.annotation is None]
    missing += [f"{prefix}{a.arg}" for prefix, a in (("*", arguments.vararg), ("**", arguments.kwarg))
                if a is not None and a.annotation is None]
    if function.returns is None:
        missing.append("return")
    return missing


def _public_functions(body: list[ast.stmt], prefix: str = ""):
    """`(qualified name, node, is_method)` of the public functions and methods in a module or class body."""
    for node in body:
        if not isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) or node.name.startswith("_"):
            continue
        if isinstance(node, ast.ClassDef):
            yield from _public_functions(node.body, f"{prefix}{node.name}.")
        else:
            yield f"{prefix}{node.name}", node, bool(prefix)


def _offenders(path):
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return [f"{path.relative_to(REPO_ROOT)}:{node.lineno} {name}: {', '.join(missing)}"
            for name, node, is_method in _public_functions(tree.body)
            if (missing := _missing_annotations(node, is_method))]


def test_every_public_function_is_annotated():
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) > 40  # the walk found the package
    offenders = [line for path in files for line in _offenders(path)]
    assert not offenders, "public functions with missing annotations (parameter names, or 'return'):\n" + \
        "\n".join(offenders)


def test_the_check_finds_what_is_missing(tmp_path):
    source = tmp_path / "sample.py"
    source.write_text(
        "def plain(a, b: int, *args, c=1, **kwargs): pass\n"
        "def full(a: int, *args: str, **kwargs: object) -> None: pass\n"
        "def _private(a): pass\n"
        "def outer() -> None:\n"
        "    def nested(a): pass\n"
        "class Public:\n"
        "    def method(self, a) -> None: pass\n"
        "    @classmethod\n"
        "    def build(cls) -> 'Public': pass\n"
        "    @staticmethod\n"
        "    def helper(self): pass\n"
        "    def __init__(self, a): pass\n"
        "    class Inner:\n"
        "        def deep(self): pass\n"
        "class _Private:\n"
        "    def method(self, a): pass\n"
    )
    tree = ast.parse(source.read_text())
    found = {name: _missing_annotations(node, is_method) for name, node, is_method in _public_functions(tree.body)}
    assert found == {"plain": ["a", "c", "*args", "**kwargs", "return"], "full": [], "outer": [],
                     "Public.method": ["a"], "Public.build": [], "Public.helper": ["self", "return"],
                     "Public.Inner.deep": ["return"]}
