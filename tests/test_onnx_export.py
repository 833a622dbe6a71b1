"""`hf-ext export onnx`, the part shared by every model: what the folder holds (graphs, report, card, config and
tokenizer files), a Hub id read from the local cache, and bad input (one error line, nothing written). Each model's
graphs are tested against the original code's outputs in tests/<model>/test_*_onnx.py."""

import json

import pytest
from conftest import REPO_ROOT, cli_exit_code, require_extra

require_extra("onnx", "onnx", "onnxruntime", "onnxscript")

from hf_ext import onnx_export  # noqa: E402 - after the extra's check
from hf_ext.errors import HfExtError  # noqa: E402
from hf_ext.extras import install_command  # noqa: E402

ERNIE_STATIC = REPO_ROOT / "tests" / "fixtures" / "ernie2" / "tiny" / "paddle_static"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ernie_folder(tmp_path_factory):
    """The ERNIE fixture converted: the smallest model with a tokenizer, and task ids."""
    out = tmp_path_factory.mktemp("ernie") / "converted"
    assert cli_exit_code(["convert", "ernie2", ERNIE_STATIC, out]) == 0
    return out


@pytest.fixture(scope="module")
def exported(ernie_folder, tmp_path_factory):
    out = tmp_path_factory.mktemp("ernie_onnx") / "onnx"
    (ernie_folder / "tokenizer_config.json").chmod(0o600)  # a private file: its copy must stay private
    assert cli_exit_code(["export", "onnx", ernie_folder, out, "--quantize", "int8"]) == 0
    return out


def test_folder_holds_graphs_report_card_and_tokenizer(exported, ernie_folder):
    names = {path.name for path in exported.iterdir()}
    assert {"model.onnx", "model_int8.onnx", "onnx_export.json", "README.md", "config.json",
            "tokenizer_config.json"} <= names
    assert not any(name.endswith(".safetensors") for name in names)
    report = json.loads((exported / "onnx_export.json").read_text())
    assert report["model_type"] == "ernie" and report["task"] == "feature-extraction"
    (graph,) = report["graphs"]
    assert graph["inputs"] == ["input_ids", "attention_mask", "token_type_ids", "task_type_ids"]
    assert [check["dims"] for check in graph["checks"]] == [{"batch": 2, "sequence": 16}, {"batch": 3, "sequence": 9}]
    assert all(0 <= check["max_abs_error"] <= 1e-4 for check in graph["checks"])
    # int8 weights change the outputs measurably, and the report says by how much
    assert all(1e-4 < check["max_abs_error"] < 1.0 for check in graph["int8"]["checks"])
    card = (exported / "README.md").read_text()
    assert "`model.onnx`" in card and "`model_int8.onnx`" in card and "task_type_ids" in card
    # published files name the model by its folder's name, not by a local path
    assert report["source"] == ernie_folder.name and "from `converted`" in card
    assert str(ernie_folder.parent) not in card + (exported / "onnx_export.json").read_text()
    assert (exported / "tokenizer_config.json").stat().st_mode & 0o777 == 0o600
    from transformers import AutoTokenizer

    tokens = AutoTokenizer.from_pretrained(exported)("hello world")["input_ids"]
    assert tokens == AutoTokenizer.from_pretrained(ernie_folder)("hello world")["input_ids"]


@pytest.mark.parametrize(("scheme", "file", "quantized_op", "bits"), [
    ("int8", "model_int8.onnx", "MatMulNBits", 8), ("int4", "model_int4.onnx", "MatMulNBits", 4),
    ("int8-dynamic", "model_int8_dynamic.onnx", "MatMulInteger", None)])
def test_each_quantization_replaces_the_float_products_of_weights(scheme, file, quantized_op, bits, ernie_folder,
                                                                   tmp_path):
    import onnx

    report = onnx_export.export_onnx(str(ernie_folder), tmp_path / "onnx", quantize=scheme)
    (graph,) = report["graphs"]
    assert graph[scheme]["file"] == file and report["quantization"] == scheme
    errors = [check["max_abs_error"] for check in graph[scheme]["checks"]]
    assert all(1e-5 < error < 1.0 for error in errors), errors  # quantized: close, not equal
    quantized_graph = onnx.load(str(tmp_path / "onnx" / file)).graph
    nodes, weights = quantized_graph.node, {tensor.name for tensor in quantized_graph.initializer}
    assert not [node.name for node in nodes if node.op_type in ("MatMul", "Gemm") and node.input[1] in weights]
    quantized = [node for node in nodes if node.op_type == quantized_op]
    assert len(quantized) >= 6  # the tiny ERNIE's attention and MLP projections, at least
    if bits is not None:
        assert {attribute.i for node in quantized for attribute in node.attribute if attribute.name == "bits"} == {bits}
    assert f"`{file}`" in (tmp_path / "onnx" / "README.md").read_text()


def test_hub_id_is_read_from_the_local_cache(ernie_folder, tmp_path, monkeypatch):
    from hf_ext.hub import install_into_hub_cache

    hub_cache = tmp_path / "hub"
    install_into_hub_cache(ernie_folder, "org/ernie-tiny", hub_cache)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(hub_cache))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(hub_cache))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    assert cli_exit_code(["export", "onnx", "org/ernie-tiny", tmp_path / "out"]) == 0
    assert (tmp_path / "out" / "model.onnx").is_file() and (tmp_path / "out" / "tokenizer.json").is_file()


def refused(capsys, argv, fragment, out):
    code = cli_exit_code(["export", "onnx", *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert code not in (0, None)
    assert err[-1].startswith("hf-ext: error:") and fragment in err[-1], err
    assert not any("Traceback" in line for line in err)
    assert not out.exists() or out.name == "existing"
    assert not [path for path in out.parent.iterdir() if ".partial-" in path.name]


@pytest.mark.parametrize("case", ["not a model", "unsupported type", "unknown task", "unknown quantization",
                                  "existing output", "missing folder"])
def test_bad_input_is_refused_with_one_line(case, ernie_folder, tmp_path, capsys):
    out = tmp_path / "out"
    if case == "not a model":
        (tmp_path / "empty").mkdir()
        refused(capsys, [tmp_path / "empty", out], "cannot load a model config", out)
    elif case == "unsupported type":
        from transformers import BertConfig

        BertConfig(vocab_size=10, hidden_size=8, num_hidden_layers=1, num_attention_heads=1,
                   intermediate_size=8).save_pretrained(tmp_path / "bert")
        refused(capsys, [tmp_path / "bert", out], "'bert' model, which hf-ext cannot export to ONNX", out)
    elif case == "unknown task":
        refused(capsys, [ernie_folder, out, "--task", "seq2seq"], "task 'seq2seq' cannot be exported", out)
    elif case == "unknown quantization":
        refused(capsys, [ernie_folder, out, "--quantize", "int3"], "invalid choice", out)
    elif case == "existing output":
        (tmp_path / "existing").mkdir()
        refused(capsys, [ernie_folder, tmp_path / "existing"], "already exists", tmp_path / "existing")
        assert list((tmp_path / "existing").iterdir()) == []
    else:
        refused(capsys, [tmp_path / "missing", out], "argument model: no folder named", out)


def test_a_graph_that_disagrees_with_pytorch_leaves_nothing(ernie_folder, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(onnx_export, "FLOAT_TOLERANCE", 0.0)  # float32 rounding then fails the check
    refused(capsys, [ernie_folder, tmp_path / "out"], "differs from PyTorch by", tmp_path / "out")


def test_missing_extra_is_one_line(monkeypatch, ernie_folder, tmp_path, capsys):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *args: None if name == "onnxscript" else find_spec(name, *args))
    refused(capsys, [ernie_folder, tmp_path / "out"], install_command("onnx"), tmp_path / "out")


def test_text_inputs_are_valid_pairs():
    import torch

    inputs = onnx_export.text_inputs({"batch": 4, "sequence": 10}, torch.Generator().manual_seed(0), 30, 0)
    mask, types = inputs["attention_mask"], inputs["token_type_ids"]
    assert mask[0].all() and (mask.sum(1) >= 5).all()
    assert ((inputs["input_ids"] == 0) == (mask == 0)).all()  # pad ids exactly at the padding
    assert (types.sum(1) > 0).all() and ((types == 1) <= (mask == 1)).all()
    with pytest.raises(HfExtError, match="cannot export"):
        onnx_export.exporter_for("bert", "somewhere")


def test_a_graph_the_exporter_refuses_is_one_line(tmp_path):
    """A module whose control flow depends on the data: torch.onnx's pages of advice become their cause's line."""
    import torch

    class DataDependent(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
            return (x * 2 if x.sum() > 0 else x,)

    graph = onnx_export.OnnxGraph(
        name="bad", module=DataDependent(), input_names=["x"], output_names=["y"], dynamic_axes={"x": {0: "batch"}},
        make_inputs=lambda dims, generator: {"x": torch.randn(dims["batch"], 3, generator=generator)},
        export_dims={"batch": 2}, check_dims=[{"batch": 2}])
    with pytest.raises(HfExtError, match=r"^exporting bad.onnx failed: ") as refusal:
        onnx_export.export_graph(graph, tmp_path / "bad.onnx")
    assert "\n" not in str(refusal.value) and "\x1b" not in str(refusal.value)
    assert not (tmp_path / "bad.onnx").exists()
