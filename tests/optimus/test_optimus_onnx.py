"""Optimus on ONNX Runtime: the encoder graph gives the original's posterior, the decoder-step graph its logits and
key/value cache, and the generation loop on ONNX Runtime its greedy tokens; text in and out through the exported
folder's processor, as `OptimusLatentSpace` does in PyTorch."""

import numpy as np
import pytest
import torch
from conftest import require_extra
from safetensors.torch import load_file
from transformers import BertTokenizer, GPT2Tokenizer

require_extra("onnx", "onnx", "onnxruntime", "onnxscript")

from hf_ext import OptimusLatentSpace, OptimusProcessor  # noqa: E402
from hf_ext.models.optimus.export_onnx import OptimusOnnx  # noqa: E402
from hf_ext.models.optimus.samples import random_model, tiny_config  # noqa: E402
from hf_ext.onnx_export import export_onnx, session  # noqa: E402 - after the extra's check
from hf_ext.sample_text import bundled_sentences, train_bert_vocab, train_gpt2_bpe  # noqa: E402

ATOL = 1e-4

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def exported(optimus_tiny_converted, tmp_path_factory):
    out = tmp_path_factory.mktemp("optimus_onnx") / "onnx"
    report = export_onnx(optimus_tiny_converted, out, quantize="int8")
    assert [graph["file"] for graph in report["graphs"]] == ["encoder.onnx", "decoder.onnx"]
    return out


def test_graphs_match_the_original(exported, optimus_tiny):
    ref = load_file(optimus_tiny / "reference.safetensors")
    ids = ref["enc_input_ids"].numpy()
    mask = ref["enc_attention_mask"].long().numpy()  # the original's mask is float
    mean, logvar = session(exported / "encoder.onnx").run(
        None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)})
    np.testing.assert_allclose(mean, ref["mean"].numpy(), atol=ATOL, rtol=0)
    np.testing.assert_allclose(logvar, ref["logvar"].numpy(), atol=ATOL, rtol=0)
    # the original's teacher-forced pass (labels as decoder input) from an empty cache, memory and embedding on
    decoder = session(exported / "decoder.onnx")
    layers, _, heads, _, head_dim = ref["dec_present_0"].shape[0], *ref["dec_present_0"].shape[1:]
    empty = np.zeros((ids.shape[0], heads, 0, head_dim), dtype=np.float32)
    past = {name.name: empty for name in decoder.get_inputs() if name.name.startswith("past_")}
    logits, key_0, value_0, *_ = decoder.run(None, {"input_ids": ref["dec_labels"].numpy(),
                                                    "latent_z": ref["z"].numpy(), **past})
    np.testing.assert_allclose(logits, ref["dec_logits"].numpy(), atol=ATOL, rtol=0)
    # the original's cache holds the memory slot first; the graph's holds the tokens only
    np.testing.assert_allclose(key_0, ref["dec_present_0"][0, :, :, 1:].numpy(), atol=ATOL, rtol=0)
    np.testing.assert_allclose(value_0, ref["dec_present_0"][1, :, :, 1:].numpy(), atol=ATOL, rtol=0)
    assert layers == 2


def test_generation_loop_gives_the_original_greedy_tokens(exported, optimus_tiny):
    ref = load_file(optimus_tiny / "reference.safetensors")
    expected = ref["gen_tokens"].numpy()  # BOS, then the greedy tokens; -1 after an early <EOS>
    tokens = OptimusOnnx(exported).generate(ref["gen_z"].numpy(), max_new_tokens=expected.shape[1] - 1)
    valid = expected >= 0
    assert (tokens[:, :expected.shape[1]][valid] == expected[valid]).all()
    # int8 weights: the same loop runs, and sampling follows its seed
    quantized = OptimusOnnx(exported, quantized=True)
    first = quantized.generate(ref["gen_z"].numpy(), max_new_tokens=5, do_sample=True, seed=3)
    assert np.array_equal(first, quantized.generate(ref["gen_z"].numpy(), max_new_tokens=5, do_sample=True, seed=3))


def test_text_round_trip_matches_pytorch_without_the_memory_slot(tmp_path):
    """Embedding-only injection (no memory slot in the cache), text through the exported folder's processor."""
    sentences = bundled_sentences()
    train_bert_vocab(sentences, tmp_path / "enc")
    base = train_gpt2_bpe(sentences, tmp_path / "dec")
    gpt2 = GPT2Tokenizer(vocab=str(tmp_path / "dec" / "vocab.json"), merges=str(tmp_path / "dec" / "merges.txt"))
    OptimusProcessor.add_decoder_special_tokens(gpt2)
    processor = OptimusProcessor(tokenizer=BertTokenizer(vocab=str(tmp_path / "enc" / "vocab.txt")),
                                 decoder_tokenizer=gpt2)
    config = tiny_config(len(processor.tokenizer), base, latent_size=8, hidden_size=32, num_layers=2, num_heads=4)
    config.latent_as_gpt_memory = False
    model = random_model(config, seed=1, scale=1.0).eval()
    model.save_pretrained(tmp_path / "model")
    processor.save_pretrained(tmp_path / "model")
    export_onnx(tmp_path / "model", tmp_path / "onnx")
    texts = sentences[:3]
    expected = OptimusLatentSpace(model, processor, max_new_tokens=8).reconstruct(texts)
    runtime = OptimusOnnx(tmp_path / "onnx")
    np.testing.assert_allclose(runtime.encode(texts)[0], OptimusLatentSpace(model, processor).encode(texts)[0].numpy(),
                               atol=ATOL, rtol=0)
    assert runtime.reconstruct(texts, max_new_tokens=8) == expected
    # far-apart latents decode differently, through both
    latent_z = np.random.default_rng(0).normal(0, 10, (4, 8)).astype(np.float32)
    tokens = runtime.generate(latent_z, max_new_tokens=8)
    assert len({tuple(row) for row in tokens.tolist()}) > 1
    assert runtime.decode(latent_z, max_new_tokens=8) == OptimusLatentSpace(model, processor, max_new_tokens=8).decode(
        torch.from_numpy(latent_z))
    with pytest.raises(Exception, match="exceeds the decoder's positions"):
        runtime.generate(np.zeros((1, 8), dtype=np.float32), max_new_tokens=10_000)
