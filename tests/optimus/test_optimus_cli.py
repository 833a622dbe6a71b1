"""`hf-ext optimus ...` latent tools on a converted folder, and `--help` on every subcommand."""

import json

import pytest
import torch
from conftest import cli_exit_code

from hf_ext.cli import build_parser, main
from hf_ext.models.optimus.conversion import convert_optimus_checkpoint
from hf_ext.models.optimus.samples import write_sample_checkpoint

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    root = tmp_path_factory.mktemp("optimus_cli")
    source = write_sample_checkpoint(root / "original", seed=7, latent_size=5, hidden_size=32)
    convert_optimus_checkpoint(root / "original", root / "converted")
    return root / "converted", source


def _subcommand_paths(parser, prefix=()):
    for action in parser._actions:
        if action.__class__.__name__ == "_SubParsersAction":
            for name, sub in action.choices.items():
                yield (*prefix, name)
                yield from _subcommand_paths(sub, (*prefix, name))


def test_every_subcommand_has_help(capsys):
    paths = list(_subcommand_paths(build_parser()))
    assert ("convert", "optimus") in paths and ("optimus", "interpolate") in paths and ("push",) in paths
    for path in paths:
        with pytest.raises(SystemExit) as exit_info:
            main([*path, "--help"])
        assert exit_info.value.code == 0
        assert "usage:" in capsys.readouterr().out


def test_encode_prints_the_posterior_mean(converted, capsys):
    folder, source = converted
    assert main(["optimus", "encode", str(folder), "a man is playing a guitar ."]) == 0
    record = json.loads(capsys.readouterr().out.strip())
    from transformers import AutoProcessor

    batch = AutoProcessor.from_pretrained(folder)(["a man is playing a guitar ."])
    with torch.no_grad():
        mean, logvar, _ = source.encode(batch["input_ids"], batch["attention_mask"])
    torch.testing.assert_close(torch.tensor(record["mean"]), mean[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(torch.tensor(record["logvar"]), logvar[0], atol=1e-5, rtol=1e-5)


def test_reconstruct_interpolate_analogy_sample(converted, capsys, no_network):
    folder, _ = converted
    assert main(["optimus", "reconstruct", str(folder), "a dog runs .", "a cat sleeps .", "--max-new-tokens", "4"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split("\t")[0] for line in lines] == ["a dog runs .", "a cat sleeps ."]
    assert main(["optimus", "interpolate", str(folder), "a dog runs .", "a cat sleeps .", "--steps", "3",
                 "--max-new-tokens", "4"]) == 0
    weights = [line.split("\t")[0] for line in capsys.readouterr().out.strip().splitlines()]
    assert weights == ["0.00", "0.50", "1.00"]
    assert main(["optimus", "analogy", str(folder), "a", "b", "c", "--max-new-tokens", "3", "--num-beams", "2"]) == 0
    assert len(capsys.readouterr().out.strip().splitlines()) == 1
    assert main(["optimus", "sample", str(folder), "--num", "3", "--sample", "--top-k", "5",
                 "--max-new-tokens", "3"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 3


@pytest.mark.parametrize("argv, message", [
    (["optimus", "interpolate", "{folder}", "a", "b", "--steps", "1"], "argument --steps: must be at least 2"),
    (["optimus", "sample", "{folder}", "--num", "0"], "argument --num: must be at least 1"),
    (["optimus", "sample", "{folder}", "--top-p", "0.5"], "--top-p applies only with --sample"),
    (["optimus", "interpolate", "{folder}", "a dog runs .", ""], "argument end: an empty sentence"),
    (["optimus", "reconstruct", "{missing}", "a"], "argument model: no folder named"),
])
def test_bad_arguments_give_one_line(converted, tmp_path, capsys, monkeypatch, argv, message):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    folder, _ = converted
    argv = [a.format(folder=folder, missing=tmp_path / "nothing-here") for a in argv]
    assert cli_exit_code(argv) != 0
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hf-ext: error:") and message in lines[0]
