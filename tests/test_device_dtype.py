"""`--device` and `--dtype` (docs/gpu.md): which commands take them, how they are checked, what they become
(`from_pretrained` keywords, `TrainingArguments`), and every command run with `--device cpu` and a dtype: float32
gives the default's output exactly, bfloat16 (which torch runs on CPU) one close to it, and training in bfloat16
mixed precision keeps float32 weights. Their refusals are rows of the bad-input tables; the CUDA checks are in
tests/test_gpu.py."""

import argparse
import json
import re

import pytest
import torch
from conftest import cli_output

from hf_ext import arguments
from hf_ext.cli import build_parser, main
from hf_ext.cli_utils import TRAINING_DTYPES, model_loading_settings, training_device_settings
from hf_ext.errors import HfExtError

GLUE = "tests/data/glue_samples"
# the commands that load or train no model, and why (docs/gpu.md says the same)
WITHOUT_DEVICE = {
    ("convert",): "converters reproduce the originals' float32 weights on the CPU and check them against references",
    ("push",): "uploads files",
    ("export", "onnx"): "ONNX export traces on the CPU in float32 by design (its help says so)",
    ("optimus", "init"): "joins two backbones' weights and saves them; nothing runs",
    ("ernie2", "export"): "rewrites a folder's weights; nothing runs",
    ("ernie2", "schedule"): "prints a schedule",
}
TRAINING = {("optimus", "train"), ("optimus", "demo"), ("demo",), ("mtdnn", "train"), ("mtdnn", "distill"),
            ("ernie2", "pretrain"), ("ernie2", "finetune"), ("universal-transformer", "train-algorithmic")}


def commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """`(path, parser)` of every command under `parser`, the whole group of a converter as one."""
    groups = [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
    if not groups or path == ("convert",):
        yield path, parser
    for group in groups:
        if path != ("convert",):
            for name, sub in group.choices.items():
                yield from commands(sub, (*path, name))


def options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {option: action for action in parser._actions for option in action.option_strings}


def test_every_command_that_loads_a_model_takes_device_and_dtype():
    found = dict(commands(build_parser()))
    assert set(WITHOUT_DEVICE) <= set(found) and TRAINING <= set(found)
    for path, parser in found.items():
        taken = options(parser)
        if path in WITHOUT_DEVICE:
            assert "--device" not in taken and "--dtype" not in taken, path
            continue
        assert {"--device", "--dtype"} <= set(taken), f"hf-ext {' '.join(path)} has no --device/--dtype"
        assert taken["--dtype"].default == "float32", path
        # training: mixed precision, which has no "auto"; loading: the checkpoint's own dtype as well
        expected = TRAINING_DTYPES if path in TRAINING else (*TRAINING_DTYPES, "auto")
        assert tuple(taken["--dtype"].choices) == expected, path
    assert "on the CPU in float32 by design" in found[("export", "onnx")].description


def without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def with_gpus(monkeypatch, count):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


def test_device_names_are_checked_against_the_machine(monkeypatch):
    without_cuda(monkeypatch)
    assert [arguments.device(name) for name in ("cpu", "CPU ", "auto")] == ["cpu", "cpu", "cpu"]
    for name in ("cuda", "cuda:0"):
        with pytest.raises(argparse.ArgumentTypeError, match=f"^{name}: CUDA is not available on this machine "
                           rf"\(torch {re.escape(torch.__version__)}, "):
            arguments.device(name)
    for name in ("gpu", "cuda:x", "cpu:1", "meta", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="^expected cpu, cuda, cuda:N, mps or auto, got "):
            arguments.device(name)
    with_gpus(monkeypatch, 1)
    assert [arguments.device(name) for name in ("auto", "cuda", "cuda:0")] == ["cuda", "cuda", "cuda:0"]
    with pytest.raises(argparse.ArgumentTypeError, match=r"^cuda:1: this machine has 1 CUDA device \(cuda:0\)$"):
        arguments.device("cuda:1")
    with_gpus(monkeypatch, 2)
    assert arguments.device("cuda:1") == "cuda:1"
    with pytest.raises(argparse.ArgumentTypeError, match=r"^cuda:7: this machine has 2 CUDA devices \(cuda:0 to "
                       r"cuda:1\)$"):
        arguments.device("cuda:7")
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    with pytest.raises(argparse.ArgumentTypeError, match="^mps: MPS is not available on this machine"):
        arguments.device("mps")


def settings(device, dtype):
    return argparse.Namespace(device=device, dtype=dtype)


def test_loading_settings_are_from_pretrained_keywords():
    assert model_loading_settings(settings("cpu", "float32")) == {"dtype": torch.float32, "device_map": "cpu"}
    assert model_loading_settings(settings("cpu", "bfloat16")) == {"dtype": torch.bfloat16, "device_map": "cpu"}
    assert model_loading_settings(settings("cpu", "auto")) == {"dtype": "auto", "device_map": "cpu"}


def test_training_settings_are_trainer_mixed_precision_and_refuse_what_it_cannot_do(monkeypatch):
    assert training_device_settings(settings("cpu", "float32")) == {"use_cpu": True}
    assert training_device_settings(settings("cpu", "bfloat16")) == {"use_cpu": True, "bf16": True}
    with pytest.raises(HfExtError, match="^--dtype float16 trains only on CUDA .* not on cpu: use --dtype bfloat16"):
        training_device_settings(settings("cpu", "float16"))
    with_gpus(monkeypatch, 2)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    assert training_device_settings(settings("cuda", "float16")) == {"fp16": True}
    assert training_device_settings(settings("cuda", "bfloat16")) == {"bf16": True}
    with pytest.raises(HfExtError, match="^--device cuda:1: Trainer trains on every GPU it sees; choose GPU N with "
                       "CUDA_VISIBLE_DEVICES=N and --device cuda$"):
        training_device_settings(settings("cuda:1", "float32"))
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: "Tesla V100")
    for check in (training_device_settings, model_loading_settings):
        with pytest.raises(HfExtError, match=r"^--dtype bfloat16: this GPU \(Tesla V100\) has no bfloat16 support"):
            check(settings("cuda", "bfloat16"))


# ----- the Python API: dtype and device_map reach from_pretrained; latents follow the model -----------------------

def test_latent_space_from_pretrained_splits_model_and_generation_keywords(optimus_sample_folder):
    from hf_ext.models.optimus import OptimusLatentSpace

    space = OptimusLatentSpace.from_pretrained(str(optimus_sample_folder), dtype=torch.bfloat16, device_map="cpu",
                                               model_kwargs={"beta": 0.25}, max_new_tokens=5, num_beams=2)
    assert space.model.dtype == torch.bfloat16 and space.model.device == torch.device("cpu")
    assert space.model.config.beta == 0.25
    assert space.generation_kwargs == {"max_new_tokens": 5, "do_sample": False, "num_beams": 2}
    mean, logvar = space.encode(["a dog runs ."])
    assert mean.dtype == logvar.dtype == torch.bfloat16
    default = OptimusLatentSpace.from_pretrained(str(optimus_sample_folder))
    assert default.model.dtype == torch.float32 and default.model.config.beta != 0.25
    torch.testing.assert_close(mean.float(), default.encode(["a dog runs ."])[0], atol=0.05, rtol=0.02)


def test_latents_are_drawn_where_the_generator_is_and_made_in_the_models_dtype(optimus_sample_folder):
    from transformers import AutoModel

    model = AutoModel.from_pretrained(optimus_sample_folder)
    half = AutoModel.from_pretrained(optimus_sample_folder, dtype=torch.bfloat16)
    drawn = model.sample_prior(4, torch.Generator().manual_seed(3))
    rounded = half.sample_prior(4, torch.Generator().manual_seed(3))
    assert drawn.dtype == torch.float32 and rounded.dtype == torch.bfloat16
    assert drawn.device == rounded.device == model.device
    assert torch.equal(rounded, drawn.to(torch.bfloat16))  # the same draws, rounded: not a bfloat16 stream
    mean = torch.zeros(2, model.config.latent_size, dtype=torch.bfloat16)
    eps = model.reparameterize(mean, torch.zeros_like(mean), torch.Generator().manual_seed(3))
    assert eps.dtype == torch.bfloat16
    assert torch.equal(eps, model.sample_prior(2, torch.Generator().manual_seed(3)).to(torch.bfloat16))


def test_the_model_decodes_latents_of_another_dtype(optimus_sample_folder):
    """Latents made in float32 (guided sampling's flow, a user's own) decode on a bfloat16 model (`generate`) as
    their rounding does."""
    from hf_ext import OptimusLatentSpace

    space = OptimusLatentSpace.from_pretrained(str(optimus_sample_folder), dtype=torch.bfloat16, max_new_tokens=6)
    latent_z = torch.randn(2, space.model.config.latent_size, generator=torch.Generator().manual_seed(5))
    assert space.decode(latent_z) == space.decode(latent_z.to(torch.bfloat16))


# ----- every command with --device cpu and a dtype --------------------------------------------------------------

OPTIMUS_TOOLS = {
    "encode": ["a dog runs .", "the cat sleeps ."],
    "reconstruct": ["a dog runs ."],
    "sample": ["--num", "3", "--sample", "--seed", "4"],
    "interpolate": ["a dog runs .", "the cat sleeps .", "--steps", "3"],
    "analogy": ["a dog runs .", "a dog sleeps .", "the cat runs ."],
}


@pytest.mark.slow
@pytest.mark.parametrize("tool", OPTIMUS_TOOLS)
def test_optimus_latent_space_tools_on_cpu(tool, optimus_sample_folder, capsys):
    argv = ["optimus", tool, optimus_sample_folder, *OPTIMUS_TOOLS[tool], "--max-new-tokens", "6"]
    default = cli_output(capsys, *argv)
    assert cli_output(capsys, *argv, "--device", "cpu", "--dtype", "float32") == default
    assert cli_output(capsys, *argv, "--dtype", "auto") == default  # the folder is float32
    half = cli_output(capsys, *argv, "--device", "cpu", "--dtype", "bfloat16")
    assert len(half.splitlines()) == len(default.splitlines())
    if tool == "encode":  # float16 runs on the CPU too
        for reduced in (half, cli_output(capsys, *argv, "--device", "cpu", "--dtype", "float16")):
            for row, half_row in zip(map(json.loads, default.splitlines()), map(json.loads, reduced.splitlines()),
                                     strict=True):
                for key in ("mean", "logvar"):
                    torch.testing.assert_close(torch.tensor(half_row[key]), torch.tensor(row[key]), atol=0.05,
                                               rtol=0.02)


@pytest.mark.slow
def test_optimus_evaluate_on_cpu(optimus_sample_folder, tmp_path, capsys):
    (tmp_path / "eval.txt").write_text("a dog runs .\nthe cat sleeps .\na man walks .\n")
    argv = ["optimus", "evaluate", optimus_sample_folder, "--eval-file", tmp_path / "eval.txt", "--num-samples", "4",
            "--samples-per-pass", "2"]
    default = json.loads(cli_output(capsys, *argv))
    assert json.loads(cli_output(capsys, *argv, "--device", "cpu", "--dtype", "float32")) == default
    half = json.loads(cli_output(capsys, *argv, "--device", "cpu", "--dtype", "bfloat16"))
    assert set(half) == set(default)
    for name in ("nll", "neg_elbo", "kl"):
        assert half[name] == pytest.approx(default[name], rel=0.05), name


@pytest.mark.slow
def test_halting_map_on_cpu(algorithmic_seq2seq_folder, tmp_path, capsys):
    argv = ["universal-transformer", "halting-map", algorithmic_seq2seq_folder, "12345"]
    default = json.loads(cli_output(capsys, *argv, tmp_path / "a.png"))
    same = json.loads(cli_output(capsys, *argv, tmp_path / "b.png", "--device", "cpu", "--dtype", "float32"))
    assert same["rows"] == default["rows"]
    half = json.loads(cli_output(capsys, *argv, tmp_path / "c.png", "--device", "cpu", "--dtype", "bfloat16"))
    assert [row["side"] for row in half["rows"]] == [row["side"] for row in default["rows"]]
    encoder, half_encoder = default["rows"][0], half["rows"][0]  # the decoder's greedy output may differ
    assert half_encoder["tokens"] == encoder["tokens"]
    torch.testing.assert_close(torch.tensor(half_encoder["ponder_time"]), torch.tensor(encoder["ponder_time"]),
                               atol=0.05, rtol=0.02)


@pytest.mark.slow
def test_serve_loads_the_app_model_on_the_device_in_the_dtype(optimus_sample_folder, monkeypatch, capsys):
    from hf_ext import serve
    from hf_ext.models.optimus import app

    loaded = []

    def load(source, trust_remote_code=False, **model_kwargs):
        loaded.append(load_optimus(source, trust_remote_code, **model_kwargs)[0])
        raise HfExtError("stop here")  # not launched

    load_optimus = app.load_optimus
    monkeypatch.setattr(app, "load_optimus", load)
    monkeypatch.setattr(serve, "check_port_free", lambda host, port: None)
    assert main(["serve", str(optimus_sample_folder), "--device", "cpu", "--dtype", "bfloat16"]) == 1
    assert capsys.readouterr().err == "hf-ext: error: stop here\n"
    assert loaded[0].dtype == torch.bfloat16 and loaded[0].device == torch.device("cpu")


@pytest.mark.slow
def test_the_optimus_app_draws_its_latent_map_from_a_bfloat16_model(optimus_sample_folder):
    from conftest import require_extra

    from hf_ext.models.optimus import OptimusLatentSpace
    from hf_ext.models.optimus.app import OptimusApp

    require_extra("plots", "matplotlib")
    space = OptimusLatentSpace.from_pretrained(str(optimus_sample_folder), dtype=torch.bfloat16, max_new_tokens=4)
    sentences = ["a dog runs .", "the cat sleeps .", "a man walks ."]
    map_axis = OptimusApp(space).latent_map(sentences, sentences[0], sentences[1], 3).axes[0]
    assert len(map_axis.collections[0].get_offsets()) == 3 and len(map_axis.lines[0].get_xydata()) == 3


def saved_dtype(folder):
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), "pt") as weights:
        return {weights.get_slice(name).get_dtype() for name in weights.keys()}  # noqa: SIM118 - not a dict


@pytest.mark.slow
def test_optimus_train_in_bfloat16_on_cpu(optimus_sample_folder, tmp_path, capsys):
    (tmp_path / "train.txt").write_text("a dog runs .\nthe cat sleeps .\na man walks .\na woman reads .\n")
    losses = {}
    for dtype in ("float32", "bfloat16"):
        out = tmp_path / dtype
        summary = json.loads(cli_output(capsys, "optimus", "train", optimus_sample_folder, "--train-file",
                                 tmp_path / "train.txt", "--output-dir", out, "--max-steps", "2", "--batch-size", "2",
                                 "--logging-steps", "1", "--device", "cpu", "--dtype", dtype))
        assert summary["steps"] == 2 and saved_dtype(out) == {"F32"}
        losses[dtype] = json.loads((out / "log_history.json").read_text())[0]["loss"]
    # the same weights and batch: bfloat16 autocast gives the first loss to bfloat16's precision
    assert losses["bfloat16"] == pytest.approx(losses["float32"], rel=0.02)


@pytest.mark.slow
def test_universal_transformer_train_algorithmic_in_bfloat16_on_cpu(tmp_path, capsys):
    out = tmp_path / "ut"
    summary = json.loads(cli_output(capsys, "universal-transformer", "train-algorithmic", "--task", "copy",
                                    "--output-dir",
                             out, "--train-length", "3", "--test-length", "4", "--num-train", "16", "--num-test", "4",
                             "--max-steps", "2", "--batch-size", "4", "--hidden-size", "16", "--num-heads", "2",
                             "--intermediate-size", "16", "--act-max-steps", "2", "--device", "cpu", "--dtype",
                             "bfloat16"))
    assert summary["max_steps"] == 2 and summary["train_loss"] > 0 and saved_dtype(out) == {"F32"}


@pytest.mark.slow
def test_mtdnn_train_and_distill_in_bfloat16_on_cpu(tmp_path, capsys, fixtures_dir):
    from transformers import BertConfig

    from hf_ext.models.mtdnn import MTDNNModel
    from hf_ext.models.mtdnn.task_defs import config_from_task_def_yaml

    tiny = fixtures_dir / "mtdnn" / "tiny"
    encoder = BertConfig(vocab_size=99, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=24, max_position_embeddings=64)
    torch.manual_seed(0)
    MTDNNModel(config_from_task_def_yaml((tiny / "task_def.yml").read_text(), encoder, task_names=["mnli"])
               ).save_pretrained(tmp_path / "model")
    data = ["--train", f"mnli={tiny / 'data' / 'mnli_dev.json'}", "--max-steps", "2", "--batch-size", "2",
            "--device", "cpu", "--dtype", "bfloat16"]
    summary = json.loads(cli_output(capsys, "mtdnn", "train", tmp_path / "model", *data, "--output-dir",
                             tmp_path / "trained"))
    assert summary["steps"] == 2 and saved_dtype(tmp_path / "trained") == {"F32"}
    summary = json.loads(cli_output(capsys, "mtdnn", "distill", tmp_path / "model", "--teacher", tmp_path / "trained",
                             *data, "--output-dir", tmp_path / "student"))
    assert summary["steps"] == 2 and saved_dtype(tmp_path / "student") == {"F32"}


@pytest.mark.slow
def test_ernie2_pretrain_and_finetune_in_bfloat16_on_cpu(ernie_converted_folder, repo_root, tmp_path, capsys):
    (tmp_path / "docs.txt").write_text("Marie Curie was born in Warsaw.\nShe studied physics in Paris.\n"
                                       "Her work won two prizes.\n\nThe red ball rolled under the table.\n"
                                       "It stopped by the door.\n")
    (tmp_path / "stages.yml").write_text("stages:\n  - steps: {knowledge_masking: 2}\n")
    device = ["--device", "cpu", "--dtype", "bfloat16", "--batch-size", "2"]
    summary = json.loads(cli_output(capsys, "ernie2", "pretrain", ernie_converted_folder, "--documents",
                             tmp_path / "docs.txt", "--stages", tmp_path / "stages.yml", "--output-dir",
                             tmp_path / "run", "--max-length", "32", *device))
    assert summary["step"] == 2 and saved_dtype(tmp_path / "run" / "ernie") == {"F32"}
    glue = repo_root / GLUE / "MRPC"
    summary = json.loads(cli_output(capsys, "ernie2", "finetune", tmp_path / "run" / "ernie", "--task", "MRPC",
                             "--train-file", glue / "train.tsv", "--eval-file", glue / "dev.tsv", "--output-dir",
                             tmp_path / "mrpc", "--max-steps", "2", *device))
    assert 0 <= summary["eval_accuracy"] <= 1 and saved_dtype(tmp_path / "mrpc") == {"F32"}


@pytest.mark.slow
def test_demo_in_bfloat16_on_cpu(tmp_path, capsys):
    out = cli_output(capsys, "demo", "--workdir", tmp_path / "demo", "--max-steps", "2", "--device", "cpu", "--dtype",
              "bfloat16")
    assert "5. reconstructions" in out and saved_dtype(tmp_path / "demo" / "finetuned") == {"F32"}
