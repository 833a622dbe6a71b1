"""MT-DNN on ONNX Runtime: the converted fixture exported with every head in one graph reproduces the original
code's logits for every task (SAN, regression and ranking heads included); one head exports alone."""

import json

import numpy as np
import pytest
from conftest import REPO_ROOT, cli_exit_code, require_extra
from safetensors.torch import load_file

require_extra("onnx", "onnx", "onnxruntime", "onnxscript")

from hf_ext.onnx_export import export_onnx, session  # noqa: E402 - after the extra's check

TINY = REPO_ROOT / "tests" / "fixtures" / "mtdnn" / "tiny"
ATOL = 1e-4  # ONNX Runtime against float32 PyTorch

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    out = tmp_path_factory.mktemp("mtdnn") / "converted"
    assert cli_exit_code(["convert", "mtdnn", TINY / "model_0.pt", out]) == 0
    return out


def run(graph, reference, task):
    inputs = {name: reference[f"{task}.{name}"].numpy() for name in ("input_ids", "attention_mask", "token_type_ids")}
    return dict(zip([output.name for output in graph.get_outputs()], graph.run(None, inputs), strict=True))


def test_every_head_in_one_graph_matches_the_original(converted, tmp_path):
    report = export_onnx(converted, tmp_path / "onnx")
    reference = load_file(TINY / "reference.safetensors")
    tasks = [task["name"] for task in json.loads((TINY / "reference.json").read_text())["tasks"]]
    assert report["task"] == "heads" and report["graphs"][0]["outputs"] == [f"logits_{task}" for task in tasks]
    graph = session(tmp_path / "onnx" / "model.onnx")
    for task in tasks:
        logits = run(graph, reference, task)[f"logits_{task}"]
        np.testing.assert_allclose(logits, reference[f"{task}.logits"].numpy(), atol=ATOL, rtol=0)
        if f"{task}.predict_labels" in reference and reference[f"{task}.logits"].shape[-1] > 1:
            assert (logits.argmax(-1) == reference[f"{task}.predict_labels"].numpy()).all()
    # ranking: the rows' scores grouped after the graph rank the candidates as the original does
    groups = run(graph, reference, "qnnli")["logits_qnnli"].reshape(reference["qnnli.group_scores"].shape)
    np.testing.assert_allclose(groups, reference["qnnli.group_scores"].numpy(), atol=ATOL, rtol=0)


def test_one_head_alone(converted, tmp_path):
    report = export_onnx(converted, tmp_path / "onnx", task="mnli", quantize="int8")
    assert report["graphs"][0]["outputs"] == ["logits"]
    reference = load_file(TINY / "reference.safetensors")
    for name in ("model.onnx", "model_int8.onnx"):
        logits = run(session(tmp_path / "onnx" / name), reference, "mnli")["logits"]
        # the SAN head's turn-averaged probabilities; int8 weights move them a little, not the predictions
        tolerance = ATOL if name == "model.onnx" else 0.1
        np.testing.assert_allclose(logits, reference["mnli.logits"].numpy(), atol=tolerance, rtol=0)
        assert (logits.argmax(-1) == reference["mnli.predict_labels"].numpy()).all()
