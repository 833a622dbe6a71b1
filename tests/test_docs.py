"""The documentation site builds in strict mode, and docs/cli.md documents every command and option of the real
`hf-ext` parser, so the reference cannot silently fall behind the code. The user pages (docs/*.md, README.md) name
only files, tests and modules that exist, and speak to users: no working-log prose."""

import argparse
import ast
import glob
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import PROCESS_TIMEOUT, require_extra

from hf_ext.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
CLI_PAGE = ROOT / "docs" / "cli.md"
COMMAND_HEADING = re.compile(r"^#+ `(hf-ext(?: [\w-]+)*)`\s*$", re.MULTILINE)
FENCED_BLOCK = re.compile(r"^```text\n(.*?)^```", re.MULTILINE | re.DOTALL)
LONG_OPTION = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
# how `--help` lists an option: at the start of an indented line, possibly after its short form
LISTED_OPTION = re.compile(r"^\s+(?:-\w+, )*(--[a-z][a-z0-9-]*)", re.MULTILINE)
USER_PAGES = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
# a path in the repository, anywhere on a page (backticks, links, command lines): a top-level folder and what follows;
# a placeholder such as `<model>` stands for any name, `FILE::NAME` names a test function in FILE
REPOSITORY_PATH = re.compile(
    r"(?<![\w./-])(?:hf_ext|tests|benchmarks|reproductions|conversion|docs|model_cards|\.ci)/[\w./<>*:-]*")
LINK_TARGET = re.compile(r"\]\(([^)\s]+)\)")
# a module of the package, or a name in one: `hf_ext.cli_utils.execute`, `from hf_ext.loading import loading`
DOTTED_NAME = re.compile(r"(?<![\w.])hf_ext(?:\.\w+)+")
IMPORTED_NAMES = re.compile(r"^\s*from (hf_ext(?:\.\w+)*) import (\([^)]*\)|[^\n#]+)", re.MULTILINE)
# prose that belongs in a working log, not on a user's page: when or in which session something was done, internal
# time budgets, what was (not) re-read. Each pattern is one of those; what was measured, on what and with which
# command stays (with its date where it has one).
WORKING_LOG = re.compile("|".join([
    r"\bthis session\b", r"\bsession's\b", r"\bthe day's\b", r"\bthe same day\b", r"\btoday\b",
    r"\btime budget\b", r"\b\d+-minute budget\b", r"\bnot re-?read\b", r"\bre-?read for\b",
    r"\bthe final code\b", r"\bproject's notes\b", r"\breference (?:notes|doc|table)\b",
]), re.IGNORECASE)


def commands(parser, path="hf-ext"):
    """`{command path: parser}` for the program and every subcommand, however deeply nested."""
    found = {path: parser}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, subparser in action.choices.items():
                found.update(commands(subparser, f"{path} {name}"))
    return found


def options(parser):
    return {s for a in parser._actions for s in a.option_strings if s.startswith("--") and s != "--help"}


def sections(page):
    """`{command path: text}` of the page's sections headed `` `hf-ext ...` ``, each up to the next such heading."""
    matches = list(COMMAND_HEADING.finditer(page))
    ends = [m.start() for m in matches[1:]] + [len(page)]
    return {m.group(1): page[m.end():end] for m, end in zip(matches, ends, strict=True)}


def test_every_command_has_a_section():
    documented = sections(CLI_PAGE.read_text(encoding="utf-8"))
    missing = [path for path in commands(build_parser()) if path not in documented]
    assert not missing, ("docs/cli.md lacks a section headed `hf-ext ...` for: " + ", ".join(missing)
                         + " (paste `COLUMNS=100 <command> --help` into a ```text block under the heading)")


def test_no_section_for_a_command_that_does_not_exist():
    stale = set(sections(CLI_PAGE.read_text(encoding="utf-8"))) - set(commands(build_parser()))
    assert not stale, f"docs/cli.md documents commands the parser does not have: {sorted(stale)}"


def test_each_section_documents_exactly_the_parser_options():
    documented = sections(CLI_PAGE.read_text(encoding="utf-8"))
    for path, parser in commands(build_parser()).items():
        text = documented.get(path, "")
        undocumented = options(parser) - set(LONG_OPTION.findall(text))
        # the help block is pasted `--help` output: an option it lists that the parser lacks is stale
        help_text = "".join(FENCED_BLOCK.findall(text))
        stale = set(LISTED_OPTION.findall(help_text)) - options(parser) - {"--help"}
        assert not undocumented, f"docs/cli.md, `{path}`: options missing from its section: {sorted(undocumented)}"
        assert not stale, f"docs/cli.md, `{path}`: its help block names options the parser lacks: {sorted(stale)}"


def test_section_parsing_finds_nested_commands_and_their_options():
    page = ("# `hf-ext`\nintro\n## `hf-ext tool sub`\n```text\nusage: --alpha --beta\n```\nsee --gamma\n"
            "### `hf-ext other`\nnothing\n")
    found = sections(page)
    assert list(found) == ["hf-ext", "hf-ext tool sub", "hf-ext other"]
    assert set(LONG_OPTION.findall(found["hf-ext tool sub"])) == {"--alpha", "--beta", "--gamma"}
    assert FENCED_BLOCK.findall(found["hf-ext tool sub"]) == ["usage: --alpha --beta\n"]
    listing = "Pass it to `x run --gamma`.\n\noptions:\n  -h, --help  show\n  --alpha A   like --beta\n"
    assert LISTED_OPTION.findall(listing) == ["--help", "--alpha"]
    parser = argparse.ArgumentParser(prog="x")
    tools = parser.add_subparsers().add_parser("a").add_subparsers()
    tools.add_parser("b").add_argument("--flag")
    assert {path: sorted(options(p)) for path, p in commands(parser, "x").items()} == {
        "x": [], "x a": [], "x a b": ["--flag"]}


@pytest.mark.slow
def test_site_builds_strictly(tmp_path):
    require_extra("docs", "mkdocs")
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-d",
                             str(tmp_path / "site")], cwd=ROOT, capture_output=True, text=True, timeout=PROCESS_TIMEOUT)
    assert result.returncode == 0, result.stderr
    built = {p.relative_to(tmp_path / "site").as_posix() for p in (tmp_path / "site").rglob("index.html")}
    for page in ("index.html", "install/index.html", "concepts/index.html", "cli/index.html", "optimus/index.html",
                 "benchmarks/index.html"):
        assert page in built


def missing_paths(text: str, page: Path) -> list[str]:
    """The repository paths and relative link targets on `page` (whose text is `text`) that name nothing in the
    repository: a file or folder that does not exist, or a test function its file does not define."""
    missing = []
    for match in REPOSITORY_PATH.finditer(text):
        path, _, function = match.group(0).rstrip(".,:;").partition("::")
        found = glob.glob(re.sub(r"<[^>]*>", "*", path).rstrip("/"), root_dir=ROOT)
        if not found or function and not any(
                re.search(rf"^\s*def {re.escape(function)}\(", (ROOT / name).read_text(encoding="utf-8"),
                          re.MULTILINE) for name in found if (ROOT / name).is_file()):
            missing.append(match.group(0))
    for match in LINK_TARGET.finditer(text):
        target = match.group(1).partition("#")[0]
        if target and not re.match(r"[a-z]+:", target) and not (page.parent / target).exists():
            missing.append(match.group(1))
    return missing


def defined_names(module: Path) -> set[str]:
    """What `module` defines at its top level (functions, classes, assignments, imports); for the package itself
    also what it re-exports from each model's entry (`top_level`)."""
    names = set()
    for node in ast.parse(module.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {name.id for target in targets for name in ast.walk(target) if isinstance(name, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
    if module == ROOT / "hf_ext" / "__init__.py":
        for entry in sorted((ROOT / "hf_ext" / "models").glob("*/__init__.py")):
            names |= {constant.value for keyword in ast.walk(ast.parse(entry.read_text(encoding="utf-8")))
                      if isinstance(keyword, ast.keyword) and keyword.arg == "top_level"
                      for constant in ast.walk(keyword.value) if isinstance(constant, ast.Constant)}
    return names


def names_module_or_defined_name(dotted: str) -> bool:
    """Whether `dotted` (`hf_ext.a.b`, `hf_ext.a.b.name`) is a module of the package or a name one defines, read
    from the source without importing it."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        path = ROOT.joinpath(*parts[:end])
        module = next((m for m in (path.with_suffix(".py"), path / "__init__.py") if m.is_file()), None)
        if module is not None:
            return end == len(parts) or parts[end] in defined_names(module)
    return False


def missing_names(text: str) -> list[str]:
    """The modules and names of the package that `text` mentions (dotted, or imported in an example) that do not
    exist."""
    mentioned = [match.group(0).rstrip(".") for match in DOTTED_NAME.finditer(text)]
    mentioned += [f"{match.group(1)}.{name}" for match in IMPORTED_NAMES.finditer(text)
                  for name in re.findall(r"\w+", match.group(2))]
    return [dotted for dotted in mentioned if not names_module_or_defined_name(dotted)]


def working_log_lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if WORKING_LOG.search(line)]


@pytest.mark.parametrize("page", USER_PAGES, ids=lambda page: page.name)
def test_every_repository_path_on_a_user_page_exists(page):
    missing = missing_paths(page.read_text(encoding="utf-8"), page)
    assert not missing, f"{page.relative_to(ROOT)} names what the repository does not hold: {missing}"


@pytest.mark.parametrize("page", USER_PAGES, ids=lambda page: page.name)
def test_every_module_and_name_on_a_user_page_exists(page):
    missing = missing_names(page.read_text(encoding="utf-8"))
    assert not missing, f"{page.relative_to(ROOT)} names modules or names hf_ext does not have: {missing}"


@pytest.mark.parametrize("page", USER_PAGES, ids=lambda page: page.name)
def test_user_pages_hold_no_working_log_prose(page):
    found = working_log_lines(page.read_text(encoding="utf-8"))
    assert not found, (f"{page.relative_to(ROOT)} speaks of the work rather than to users (say what was measured, "
                       f"on what, with which command): {found}")


def test_the_page_checks_find_what_they_are_for():
    page = ROOT / "docs" / "index.md"
    text = ("`hf_ext/cli_utils.py`, `tests/<model>/`, `python benchmarks/bench_onnx.py --quick`, [a](cli.md#errors),\n"
            "`tests/test_docs.py::test_the_page_checks_find_what_they_are_for`, https://example.org/tests/gone.py\n"
            "`hf_ext/cli_helpers.py`, [b](gone.md), [c](../tests/gone/), `tests/test_docs.py::test_gone`\n")
    assert missing_paths(text, page) == ["hf_ext/cli_helpers.py", "tests/test_docs.py::test_gone", "gone.md",
                                         "../tests/gone/"]
    text = ("`hf_ext.cli_utils.execute`, `hf_ext.models.mtdnn.task_defs`, `hf_ext.cli_utils.no_such_name`\n"
            "from hf_ext import OptimusModel, NoSuchModel\nfrom hf_ext.loading import (load_config,\n    gone)\n")
    assert missing_names(text) == ["hf_ext.cli_utils.no_such_name", "hf_ext.NoSuchModel", "hf_ext.loading.gone"]
    assert working_log_lines("a second run, after the last changes of this session\nthe paper's text was not "
                             "re-read for this page\nmost of the 20-minute budget\nmeasured on today's machine\n"
                             "each task gets exactly its budget\nthe sentences entered in the session\n") == [
        "a second run, after the last changes of this session", "the paper's text was not re-read for this page",
        "most of the 20-minute budget", "measured on today's machine"]


# a link to the project's own repository, as a page or a card gives it
PROJECT_LINK = re.compile(r"https://github\.com/hf-ext/[\w.-]+")


def project_links(text: str) -> set[str]:
    return set(PROJECT_LINK.findall(text))


def test_every_link_to_the_project_is_the_repository_setup_cfg_names():
    import configparser

    metadata = configparser.ConfigParser()
    metadata.read(ROOT / "setup.cfg")
    url = metadata["metadata"]["url"]
    assert metadata["metadata"]["project_urls"].split("Source = ")[1].split()[0] == url
    pages = [*USER_PAGES, *sorted((ROOT / "model_cards").glob("*.md"))]
    found = {page.relative_to(ROOT).as_posix(): project_links(page.read_text(encoding="utf-8")) for page in pages}
    assert url in found["README.md"]  # the quick start says where to clone from
    wrong = {page: links - {url} for page, links in found.items() if links - {url}}
    assert not wrong, f"links to another repository than setup.cfg's {url}: {wrong}"
    assert project_links("[a](https://github.com/hf-ext/hf-ext) https://github.com/hf-ext/hf-ext-old") == {
        "https://github.com/hf-ext/hf-ext", "https://github.com/hf-ext/hf-ext-old"}
