"""ERNIE 2.0 fixtures for every test (registered by `tests/conftest.py`): the tiny original checkpoint converted, for
the bad-input commands."""

import pytest


@pytest.fixture(scope="session")
def ernie_converted_folder(fixtures_dir, tmp_path_factory):
    """The tiny static-graph fixture converted into a plain transformers `ernie` folder with its tokenizer; read it,
    do not modify it."""
    from hf_ext.models.ernie2.conversion import convert_ernie2_checkpoint

    folder = tmp_path_factory.mktemp("ernie_converted") / "converted"
    convert_ernie2_checkpoint(fixtures_dir / "ernie2" / "tiny" / "paddle_static", folder)
    return folder
