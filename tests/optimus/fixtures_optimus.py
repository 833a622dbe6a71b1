"""Optimus fixtures for every test (registered by `tests/conftest.py`): the original code's tiny checkpoint and its
conversion, and a tiny converted folder with random weights for the app and the bad-input commands."""

import pytest


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


@pytest.fixture(scope="session")
def optimus_sample_folder(tmp_path_factory):
    """A tiny converted Optimus folder with its two tokenizers (random weights)."""
    from hf_ext.models.optimus.conversion import convert_optimus_checkpoint
    from hf_ext.models.optimus.samples import write_sample_checkpoint

    root = tmp_path_factory.mktemp("optimus_app")
    write_sample_checkpoint(root / "original", seed=7, latent_size=5, hidden_size=32)
    convert_optimus_checkpoint(root / "original", root / "converted")
    return root / "converted"
