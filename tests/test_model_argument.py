"""A command's MODEL argument (`hf_ext.cli_utils.model_source`): a folder when one of that name exists, else a Hub
repo id. A name that can only be a path and names no folder is refused at once, without a request; so is an original
checkpoint, with the command that converts it; a name that is no folder is looked up on the Hub, and the error says
that no folder of that name exists."""

import pytest
from conftest import FIXTURES, cli_exit_code

# the fixtures' checkpoints in the originals' layouts (tests/fixtures/README.md), each with the converter that reads it
ORIGINALS = [
    ("optimus/tiny", "Optimus", "optimus"),
    ("optimus/tiny/checkpoint-full-100", "Optimus", "optimus"),
    ("optimus/tiny/checkpoint-full-100/training.bin", "Optimus", "optimus"),
    ("ernie2/tiny/paddle_static", "ERNIE 2.0", "ernie2"),
    ("ernie2/tiny/paddlenlp", "ERNIE 2.0", "ernie2"),
    ("ernie2/tiny/paddlenlp/model_state.pdparams", "ERNIE 2.0", "ernie2"),
    ("mtdnn/tiny/model_0.pt", "MT-DNN", "mtdnn"),
    ("universal_transformer/tiny", "Universal Transformer", "universal-transformer"),
]


@pytest.mark.parametrize("name", ["./nothing-here", "nothing-here/", "a/b/c", "~/nothing-here-either", "/nowhere/at"])
def test_a_path_that_names_no_folder_is_refused_without_a_request(name, tmp_path, monkeypatch, capsys, no_network):
    monkeypatch.chdir(tmp_path)
    assert cli_exit_code(["export", "onnx", name, "out"]) == 2
    assert capsys.readouterr().err == (f"hf-ext: error: argument model: no folder named {name} "
                                       "(see hf-ext export onnx --help)\n")
    assert not (tmp_path / "out").exists()


def test_a_file_is_not_taken_for_a_model_folder(tmp_path, monkeypatch, capsys, no_network):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "model.txt").write_text("not a model")
    assert cli_exit_code(["export", "onnx", "model.txt", "out"]) == 2
    assert "argument model: model.txt is a file, not a model folder" in capsys.readouterr().err


def test_an_existing_folder_is_used_as_a_folder(tmp_path, monkeypatch, capsys, no_network):
    """`org/model` exists here as a folder: it is read from disk (its config is empty, so loading it fails there),
    never looked up on the Hub."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "org" / "model").mkdir(parents=True)
    (tmp_path / "org" / "model" / "config.json").write_text("{}")
    assert cli_exit_code(["serve", "org/model"]) == 1  # a command that needs no extra to get this far
    err = capsys.readouterr().err
    assert err.startswith("hf-ext: error: cannot load a model config from org/model: ") and err.count("\n") == 1


def test_a_name_that_is_no_folder_is_a_hub_repo_id_and_the_error_says_so(tmp_path, monkeypatch, capsys):
    from huggingface_hub import constants

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert cli_exit_code(["serve", "optimuss"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("hf-ext: error: cannot load a model config from optimuss (no folder of that name; as a Hub "
                          "repo id): ") and err.count("\n") == 1


@pytest.mark.parametrize("relative, display_name, convert_name", ORIGINALS, ids=[row[0] for row in ORIGINALS])
def test_an_original_checkpoint_is_refused_with_the_command_that_converts_it(relative, display_name, convert_name,
                                                                             capsys, no_network):
    source = FIXTURES / relative
    assert cli_exit_code(["export", "onnx", source, "out"]) == 2
    assert capsys.readouterr().err == (
        f"hf-ext: error: argument model: {source} looks like an original {display_name} checkpoint, not a model "
        f"folder: convert it first (hf-ext convert {convert_name} {source} OUT) (see hf-ext export onnx --help)\n")


def test_a_converted_folder_is_not_taken_for_an_original(tmp_path):
    """What the converters write (config.json and safetensors weights) is none of the originals' layouts."""
    from hf_ext.cli_utils import original_checkpoint_of

    folder = tmp_path / "converted"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"")
    assert original_checkpoint_of(folder) is None and original_checkpoint_of(tmp_path) is None
