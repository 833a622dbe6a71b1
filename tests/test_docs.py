"""The documentation site builds in strict mode, and docs/cli.md documents every command and option of the real
`hf-ext` parser, so the reference cannot silently fall behind the code."""

import argparse
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hf_ext.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
CLI_PAGE = ROOT / "docs" / "cli.md"
COMMAND_HEADING = re.compile(r"^#+ `(hf-ext(?: [\w-]+)*)`\s*$", re.MULTILINE)
FENCED_BLOCK = re.compile(r"^```text\n(.*?)^```", re.MULTILINE | re.DOTALL)
LONG_OPTION = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
# how `--help` lists an option: at the start of an indented line, possibly after its short form
LISTED_OPTION = re.compile(r"^\s+(?:-\w+, )*(--[a-z][a-z0-9-]*)", re.MULTILINE)


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


@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None, reason="mkdocs is not installed (extra [docs])")
def test_site_builds_strictly(tmp_path):
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-d",
                             str(tmp_path / "site")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    built = {p.relative_to(tmp_path / "site").as_posix() for p in (tmp_path / "site").rglob("index.html")}
    for page in ("index.html", "install/index.html", "concepts/index.html", "cli/index.html", "optimus/index.html",
                 "benchmarks/index.html"):
        assert page in built
