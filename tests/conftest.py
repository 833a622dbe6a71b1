"""Shared test fixtures: where the repository and the shared fixtures are (read in place, never copied into the
project), and the tiny Optimus fixture converted once per session."""

from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
SHARED_FIXTURES = REPO_ROOT / ".." / "shared" / "fixtures"


@pytest.fixture(scope="session")
def repo_root():
    return REPO_ROOT


@pytest.fixture(scope="session")
def fixtures_dir():
    return SHARED_FIXTURES


@pytest.fixture(scope="session")
def optimus_tiny(fixtures_dir):
    """The original Optimus code's output folder (checkpoint-{encoder,decoder,full}-N/) and its reference outputs."""
    return fixtures_dir / "optimus" / "tiny"


@pytest.fixture(scope="session")
def optimus_tiny_converted(optimus_tiny, tmp_path_factory):
    """`hf-ext convert optimus` (in-process) of the tiny fixture's split folders, checked against its reference
    outputs; read it, do not modify it."""
    from hf_ext.cli import main

    out = tmp_path_factory.mktemp("optimus_tiny") / "converted"
    code = main(["convert", "optimus", str(optimus_tiny), str(out),
                 "--reference", str(optimus_tiny / "reference.safetensors")])
    assert code == 0, "converting the tiny Optimus fixture failed"
    return out
