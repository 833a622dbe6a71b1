"""The program's switches for what it prints: `hf-ext --version`, `-v/--verbose`, `-q/--quiet`, and transformers' own
TRANSFORMERS_VERBOSITY, which a command no longer overrides."""

import logging as pylogging

import pytest
from conftest import cli_exit_code
from transformers.utils import logging

import hf_ext
from hf_ext.cli_utils import configure_logging


@pytest.fixture(autouse=True)
def restored_levels():
    verbosity, hf_ext_level = logging.get_verbosity(), logging.get_logger("hf_ext").level
    yield
    logging.set_verbosity(verbosity)
    logging.get_logger("hf_ext").setLevel(hf_ext_level)


def test_version_is_the_package_version(capsys):
    assert cli_exit_code(["--version"]) == 0
    assert capsys.readouterr().out == f"hf-ext {hf_ext.__version__}\n"


@pytest.mark.parametrize("verbosity, transformers_level, hf_ext_level", [
    (0, pylogging.ERROR, pylogging.INFO),
    (1, pylogging.WARNING, pylogging.INFO),
    (-1, pylogging.ERROR, pylogging.WARNING),
], ids=["default", "verbose", "quiet"])
def test_each_switch_sets_both_levels(verbosity, transformers_level, hf_ext_level, monkeypatch):
    monkeypatch.delenv("TRANSFORMERS_VERBOSITY", raising=False)
    configure_logging(verbosity)
    assert logging.get_verbosity() == transformers_level
    assert logging.get_logger("hf_ext").level == hf_ext_level


def test_transformers_verbosity_is_kept(monkeypatch):
    monkeypatch.setenv("TRANSFORMERS_VERBOSITY", "info")
    logging.set_verbosity_info()  # what transformers took from the variable when it was imported
    configure_logging(0)
    assert logging.get_verbosity() == pylogging.INFO


def test_quiet_keeps_warnings_and_drops_progress(capsys):
    configure_logging(-1)
    logger = logging.get_logger("hf_ext.tests")
    logger.info("step 10 of 100")
    logger.warning("the reference has no logits")
    assert capsys.readouterr().err == "warning: the reference has no logits\n"


def test_quiet_and_verbose_exclude_each_other(capsys):
    assert cli_exit_code(["-q", "-v", "push", "folder", "org/model"]) == 2
    assert "argument -v/--verbose: not allowed with argument -q/--quiet" in capsys.readouterr().err
