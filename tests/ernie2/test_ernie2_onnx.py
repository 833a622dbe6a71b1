"""ERNIE on ONNX Runtime: the converted Paddle fixture's encoder, with ERNIE 2.0's task embedding as an input,
reproduces the original's outputs; a fine-tuned classifier folder exports its head by default."""

import numpy as np
import pytest
import torch
from conftest import REPO_ROOT, cli_exit_code, require_extra
from safetensors.torch import load_file

require_extra("onnx", "onnx", "onnxruntime", "onnxscript")

from hf_ext.onnx_export import export_onnx, session  # noqa: E402 - after the extra's check

TINY = REPO_ROOT / "tests" / "fixtures" / "ernie2" / "tiny"
ATOL = 1e-4

pytestmark = pytest.mark.slow


def test_encoder_with_task_ids_matches_the_paddle_original(tmp_path):
    assert cli_exit_code(["convert", "ernie2", TINY / "paddlenlp", tmp_path / "converted"]) == 0
    report = export_onnx(tmp_path / "converted", tmp_path / "onnx")
    assert report["task"] == "feature-extraction" and "task_type_ids" in report["graphs"][0]["inputs"]
    reference = load_file(TINY / "reference.safetensors")
    graph = session(tmp_path / "onnx" / "model.onnx")
    sequence, pooled = graph.run(None, {name: reference[name].numpy() for name in
                                        ("input_ids", "attention_mask", "token_type_ids", "task_type_ids")})
    real = reference["attention_mask"].bool().numpy()  # the original gives padding positions ids of 0
    np.testing.assert_allclose(sequence[real], reference["sequence_output"].numpy()[real], atol=ATOL, rtol=0)
    np.testing.assert_allclose(pooled, reference["pooled_output"].numpy(), atol=ATOL, rtol=0)
    # the task embedding is used: other task ids give other outputs
    other = {name: reference[name].numpy() for name in ("input_ids", "attention_mask", "token_type_ids")}
    other["task_type_ids"] = (reference["task_type_ids"].numpy() + 1) % 3
    assert np.abs(graph.run(None, other)[1] - pooled).max() > 1e-3


def test_classifier_exports_its_head(tmp_path):
    from transformers import ErnieConfig, ErnieForSequenceClassification

    torch.manual_seed(0)
    config = ErnieConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=32, use_task_id=False, num_labels=3)
    model = ErnieForSequenceClassification(config).eval()
    model.save_pretrained(tmp_path / "classifier")
    report = export_onnx(tmp_path / "classifier", tmp_path / "onnx")
    assert report["task"] == "sequence-classification"
    assert report["graphs"][0]["inputs"] == ["input_ids", "attention_mask", "token_type_ids"]
    ids = torch.tensor([[1, 7, 9, 30, 2, 0], [1, 5, 2, 0, 0, 0]])
    mask = (ids != 0).long()
    (logits,) = session(tmp_path / "onnx" / "model.onnx").run(
        None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy(), "token_type_ids": np.zeros_like(ids)})
    with torch.no_grad():
        expected = model(input_ids=ids, attention_mask=mask).logits.numpy()
    np.testing.assert_allclose(logits, expected, atol=ATOL, rtol=0)
