"""A test whose optional dependency is missing is skipped on a developer's machine and fails under CI (CI=true, set by
`.ci/run`, which installs the `test` extra, all that the tests not marked slow need), so that no test silently stops
running there; pytest's summary (`-ra`) lists the skips that remain with their reasons. Every test goes through
`require_extra` / `missing_dependency` of `tests/conftest.py` for this, never through a skip of its own."""

import configparser
import re
from pathlib import Path

import pytest
from conftest import REPO_ROOT, missing_dependency, require_extra

from hf_ext.extras import install_command

ABSENT_MODULE = "hf_ext_test_module_that_does_not_exist"
# a skip that would hide a missing module from CI: pytest's importorskip, or a skipif on a module lookup
OWN_DEPENDENCY_SKIP = re.compile(r"\bimportorskip\(|\bskipif\([^)]*(?:find_spec|import)")


def own_dependency_skips(text: str) -> list[int]:
    """The line numbers of `text` that skip for a missing module without the rule."""
    return [text.count("\n", 0, match.start()) + 1 for match in OWN_DEPENDENCY_SKIP.finditer(text)]


def test_a_missing_extra_fails_under_ci(monkeypatch):
    monkeypatch.setenv("CI", "true")
    failure = f"CI=true: a missing dependency fails the test: .*missing {ABSENT_MODULE}"
    with pytest.raises(pytest.fail.Exception, match=failure):
        require_extra("test", "pytest", ABSENT_MODULE)


@pytest.mark.parametrize("ci", [None, "", "false"])
def test_a_missing_extra_is_skipped_with_its_install_command_elsewhere(monkeypatch, ci):
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    reason = f"(missing {ABSENT_MODULE}): {install_command('test')}"
    with pytest.raises(pytest.skip.Exception, match=re.escape(reason)):
        require_extra("test", ABSENT_MODULE)


def test_an_installed_extra_neither_skips_nor_fails_under_ci(monkeypatch):
    monkeypatch.setenv("CI", "TRUE")
    assert require_extra("test", "pytest", "json") is None


def test_a_missing_program_follows_the_same_rule(monkeypatch):
    monkeypatch.setenv("CI", "true")
    failure = "CI=true: a missing dependency fails the test: this test needs /usr/bin/x"
    with pytest.raises(pytest.fail.Exception, match=failure):
        missing_dependency("this test needs /usr/bin/x")
    monkeypatch.setenv("CI", "false")
    with pytest.raises(pytest.skip.Exception, match="this test needs /usr/bin/x"):
        missing_dependency("this test needs /usr/bin/x")


def test_ci_run_sets_ci_before_the_suites():
    script = (REPO_ROOT / ".ci" / "run").read_text(encoding="utf-8")
    exported = re.search(r"^export CI=true$", script, re.MULTILINE)
    first_suite = re.search(r"^python -m pytest ", script, re.MULTILINE)
    assert exported and first_suite and exported.start() < first_suite.start()


def test_the_test_report_lists_the_skips_and_their_reasons():
    setup = configparser.ConfigParser()
    setup.read(REPO_ROOT / "setup.cfg")
    assert "-ra" in setup["tool:pytest"]["addopts"].split()


def test_no_test_skips_for_a_missing_module_on_its_own():
    found = {f"{path.relative_to(REPO_ROOT)}:{line}"
             for path in sorted((REPO_ROOT / "tests").rglob("*.py")) if path != Path(__file__)
             for line in own_dependency_skips(path.read_text(encoding="utf-8"))}
    assert not found, f"use conftest's require_extra / missing_dependency instead of a skip of its own: {sorted(found)}"


def test_the_scan_finds_skips_of_their_own():
    text = ('import pytest\n\npeft = pytest.importorskip("peft")\n'
            '@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None, reason="no mkdocs")\n'
            '@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")\n')
    assert own_dependency_skips(text) == [3, 4]
