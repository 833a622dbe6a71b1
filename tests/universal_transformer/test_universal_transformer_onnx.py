"""The Universal Transformer on ONNX Runtime: ACT survives export with its exact outputs (logits, states, updates
per position) at other batch sizes and lengths, for the converted fixture (t2t's "transformed" halted state) and
for the default "frozen" one, classifier, encoder and seq2seq."""

import numpy as np
import pytest
import torch
from conftest import REPO_ROOT, cli_exit_code, require_extra

require_extra("onnx", "onnx", "onnxruntime", "onnxscript")

from hf_ext import UniversalTransformerConfig, UniversalTransformerForSeq2SeqLM  # noqa: E402
from hf_ext.onnx_export import export_onnx, session  # noqa: E402 - after the extra's check

TINY = REPO_ROOT / "tests" / "fixtures" / "universal_transformer" / "tiny"
ATOL = 1e-4

pytestmark = pytest.mark.slow


def padded_ids(batch, length, vocab, seed):
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (batch, length), generator=generator)
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[1:, length - 2:] = 0
    return ids.masked_fill(mask == 0, 0), mask


def test_converted_fixture_classifier(tmp_path):
    from transformers import AutoModelForSequenceClassification

    assert cli_exit_code(["convert", "universal-transformer", TINY, tmp_path / "converted"]) == 0
    report = export_onnx(tmp_path / "converted", tmp_path / "onnx")
    assert report["task"] == "sequence-classification"
    assert report["graphs"][0]["outputs"] == ["logits", "n_updates", "remainders"]
    model = AutoModelForSequenceClassification.from_pretrained(tmp_path / "converted").eval()
    ids, mask = padded_ids(4, 10, model.config.vocab_size, seed=5)  # neither shape the export checked
    logits, n_updates, remainders = session(tmp_path / "onnx" / "model.onnx").run(
        None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})
    with torch.no_grad():
        expected = model(input_ids=ids, attention_mask=mask)
    np.testing.assert_allclose(logits, expected.logits.numpy(), atol=ATOL, rtol=0)
    np.testing.assert_array_equal(n_updates, expected.n_updates.numpy())
    np.testing.assert_allclose(remainders, expected.remainders.numpy(), atol=ATOL, rtol=0)


def test_frozen_seq2seq_encoder_and_decoder(tmp_path):
    torch.manual_seed(2)  # a draw whose positions halt at four different steps
    config = UniversalTransformerConfig(vocab_size=30, hidden_size=16, num_attention_heads=2, intermediate_size=24,
                                        act_max_steps=6, pad_token_id=0, decoder_start_token_id=0, eos_token_id=2)
    model = UniversalTransformerForSeq2SeqLM(config).eval()
    with torch.no_grad():  # positions halting at different steps
        for stack in (model.encoder, model.decoder):
            stack.halting.weight.normal_(0, 0.5)
    model.save_pretrained(tmp_path / "seq2seq")
    report = export_onnx(tmp_path / "seq2seq", tmp_path / "onnx")
    assert report["task"] == "seq2seq" and [graph["file"] for graph in report["graphs"]] == ["encoder.onnx",
                                                                                             "decoder.onnx"]
    ids, mask = padded_ids(3, 9, 30, seed=7)
    labels, label_mask = padded_ids(3, 5, 30, seed=8)
    with torch.no_grad():
        expected = model(input_ids=ids, attention_mask=mask, decoder_input_ids=labels,
                         decoder_attention_mask=label_mask)
    states, encoder_updates, _ = session(tmp_path / "onnx" / "encoder.onnx").run(
        None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})
    logits, decoder_updates, _ = session(tmp_path / "onnx" / "decoder.onnx").run(
        None, {"input_ids": labels.numpy(), "attention_mask": label_mask.numpy(), "encoder_hidden_states": states,
               "encoder_attention_mask": mask.numpy()})
    np.testing.assert_allclose(states, expected.encoder_last_hidden_state.numpy(), atol=ATOL, rtol=0)
    np.testing.assert_array_equal(encoder_updates, expected.encoder_n_updates.numpy())
    np.testing.assert_array_equal(decoder_updates, expected.decoder_n_updates.numpy())
    np.testing.assert_allclose(logits, expected.logits.numpy(), atol=ATOL, rtol=0)
    real = mask.bool().numpy()
    assert len(np.unique(encoder_updates[real])) > 2  # positions halted at many steps
