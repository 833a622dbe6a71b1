"""Optimus on ONNX Runtime: the encoder graph gives the original's posterior, the decoder-step graph its logits and
key/value cache, and the generation loop on ONNX Runtime its greedy tokens; text in and out through the exported
folder's processor, as `OptimusLatentSpace` does in PyTorch. Other backbones: a Llama decoder with grouped-query
attention, and a Mistral decoder with sliding windows behind a ModernBERT encoder (no segment ids), give PyTorch's
logits, caches and greedy tokens."""

import numpy as np
import pytest
import torch
from conftest import require_extra
from safetensors.torch import load_file
from transformers import AutoConfig, BertTokenizer, GPT2Tokenizer

require_extra("onnx", "onnx", "onnxruntime", "onnxscript")

from hf_ext import OptimusConfig, OptimusLatentSpace, OptimusProcessor  # noqa: E402
from hf_ext.models.optimus.export_onnx import OptimusOnnx, cache_names  # noqa: E402
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
    quantized = OptimusOnnx(exported, "int8")
    first = quantized.generate(ref["gen_z"].numpy(), max_new_tokens=5, do_sample=True, seed=3)
    assert np.array_equal(first, quantized.generate(ref["gen_z"].numpy(), max_new_tokens=5, do_sample=True, seed=3))


def float_products_of_weights(path):
    """The operator of each MatMul and Gemm node of a graph that multiplies by a float weight (an initializer)."""
    import onnx

    graph = onnx.load(str(path)).graph
    weights = {tensor.name for tensor in graph.initializer}
    return [node.op_type for node in graph.node if node.op_type in ("MatMul", "Gemm") and node.input[1] in weights]


def test_int8_graph_has_int8_weights_in_every_projection(exported):
    """GPT-2's Conv1D projections export as Gemm, which ONNX Runtime's MatMulNBits quantizer does not take: they are
    int8 too (made MatMul first), as are the latent projections and the head."""
    assert "Gemm" in float_products_of_weights(exported / "decoder.onnx")
    assert float_products_of_weights(exported / "decoder_int8.onnx") == []
    import onnx

    nodes = [node for node in onnx.load(str(exported / "decoder_int8.onnx")).graph.node
             if node.op_type == "MatMulNBits"]
    # 2 layers x 4 projections, the latent's memory and embedding projections, the head
    assert len(nodes) == 2 * 4 + 2 + 1
    assert {attribute.i for node in nodes for attribute in node.attribute if attribute.name == "bits"} == {8}


def bundled_processor(folder):
    """A processor whose tokenizers are trained on the bundled sentences, and the decoder's base vocabulary size."""
    sentences = bundled_sentences()
    train_bert_vocab(sentences, folder / "enc")
    base = train_gpt2_bpe(sentences, folder / "dec")
    gpt2 = GPT2Tokenizer(vocab=str(folder / "dec" / "vocab.json"), merges=str(folder / "dec" / "merges.txt"))
    OptimusProcessor.add_decoder_special_tokens(gpt2)
    return OptimusProcessor(tokenizer=BertTokenizer(vocab=str(folder / "enc" / "vocab.txt")),
                            decoder_tokenizer=gpt2), base


def test_text_round_trip_matches_pytorch_without_the_memory_slot(tmp_path):
    """Embedding-only injection (no memory slot in the cache), text through the exported folder's processor."""
    processor, base = bundled_processor(tmp_path)
    config = tiny_config(len(processor.tokenizer), base, latent_size=8, hidden_size=32, num_layers=2, num_heads=4)
    config.latent_as_gpt_memory = False
    model = random_model(config, seed=1, scale=1.0).eval()
    model.save_pretrained(tmp_path / "model")
    processor.save_pretrained(tmp_path / "model")
    export_onnx(tmp_path / "model", tmp_path / "onnx")
    texts = bundled_sentences()[:3]
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


def backbones_model(encoder_type: str, decoder_type: str, encoder_vocab: int, decoder_base_vocab: int,
                    **decoder_options):
    """A random Optimus of tiny `encoder_type` and `decoder_type` backbones (4 attention heads, 2 key/value heads),
    the decoder vocabulary ending in pad, BOS and EOS."""
    encoder_options = dict(global_attn_every_n_layers=1, local_attention=16) if encoder_type == "modernbert" else \
        dict(max_position_embeddings=64)
    encoder = AutoConfig.for_model(encoder_type, vocab_size=encoder_vocab, hidden_size=32, num_hidden_layers=2,
                                   num_attention_heads=4, intermediate_size=64, pad_token_id=0, **encoder_options)
    v = decoder_base_vocab
    decoder = AutoConfig.for_model(decoder_type, vocab_size=v + 3, hidden_size=32, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                                   max_position_embeddings=64, pad_token_id=v, bos_token_id=v + 1,
                                   eos_token_id=v + 2, **decoder_options)
    config = OptimusConfig(encoder=encoder, decoder=decoder, latent_size=8,
                           encoder_pooling="pooler" if encoder_type == "bert" else "mean")
    return random_model(config, seed=0, scale=0.2)


def pytorch_step(model, input_ids, latent_z):
    """PyTorch's logits and cache (the memory slot dropped, as the graph's present holds tokens only) of a
    teacher-forced pass from an empty cache."""
    with torch.no_grad():
        out = model(decoder_input_ids=torch.from_numpy(input_ids), latent_z=torch.from_numpy(latent_z),
                    use_cache=True)
    memory = int(model.config.latent_as_gpt_memory)
    layers = out.cache.layers
    return out.logits.numpy(), [layers[0].keys[:, :, memory:].numpy(), layers[0].values[:, :, memory:].numpy()]


def test_llama_decoder_with_grouped_query_attention(tmp_path):
    """A Llama decoder (rotary positions, 2 key/value heads for 4 attention heads): the cache tensors have the
    key/value heads; logits, caches and greedy tokens are PyTorch's, and the int8 graphs decode too."""
    model = backbones_model("bert", "llama", encoder_vocab=50, decoder_base_vocab=37)
    model.save_pretrained(tmp_path / "model")
    report = export_onnx(tmp_path / "model", tmp_path / "onnx", quantize="int8")
    encoder_report, decoder_report = report["graphs"]
    assert encoder_report["inputs"] == ["input_ids", "attention_mask", "token_type_ids"]
    decoder = session(tmp_path / "onnx" / "decoder.onnx")
    assert [node.shape[1] for node in decoder.get_inputs() if node.name.startswith("past_")] == [2] * 4

    rng = np.random.default_rng(0)
    input_ids = rng.integers(0, 40, (3, 6))
    latent_z = rng.normal(0, 1, (3, 8)).astype(np.float32)
    empty = np.zeros((3, 2, 0, 8), dtype=np.float32)
    logits, key_0, value_0, *_ = decoder.run(None, {"input_ids": input_ids, "latent_z": latent_z,
                                                    **dict.fromkeys(cache_names("past", 2), empty)})
    expected_logits, (expected_key, expected_value) = pytorch_step(model, input_ids, latent_z)
    assert key_0.shape == (3, 2, 6, 8)
    np.testing.assert_allclose(logits, expected_logits, atol=ATOL, rtol=0)
    np.testing.assert_allclose(key_0, expected_key, atol=ATOL, rtol=0)
    np.testing.assert_allclose(value_0, expected_value, atol=ATOL, rtol=0)

    latent_z = rng.normal(0, 3, (4, 8)).astype(np.float32)
    expected = model.generate(latent_z=torch.from_numpy(latent_z), max_new_tokens=12, min_new_tokens=12,
                              do_sample=False)
    tokens = OptimusOnnx(tmp_path / "onnx").generate(latent_z, max_new_tokens=12, min_new_tokens=12)
    np.testing.assert_array_equal(tokens, expected.numpy())
    assert len({tuple(row) for row in tokens.tolist()}) > 1  # the latents steer the decoder
    # int8 weights: close to the float graph's predictions, and the loop runs on them
    assert min(check["argmax_agreement"]["logits"] for check in decoder_report["int8"]["checks"]) >= 0.9
    quantized = OptimusOnnx(tmp_path / "onnx", "int8").generate(latent_z, max_new_tokens=12, min_new_tokens=12)
    assert quantized.shape == tokens.shape and (quantized == tokens).mean() >= 0.75


def test_sliding_window_decoder_behind_an_encoder_without_segments(tmp_path):
    """ModernBERT (no segment embeddings: its graph has no token_type_ids input) and Mistral with a sliding window
    of 4, decoding well past it: a step on a cache longer than the window gives PyTorch's logits (the graph keeps
    every token and masks), and text goes in and out through the processor as in PyTorch."""
    processor, base = bundled_processor(tmp_path)
    model = backbones_model("modernbert", "mistral", len(processor.tokenizer), base, sliding_window=4)
    model.save_pretrained(tmp_path / "model")
    processor.save_pretrained(tmp_path / "model")
    report = export_onnx(tmp_path / "model", tmp_path / "onnx")
    assert report["graphs"][0]["inputs"] == ["input_ids", "attention_mask"]
    assert [node.name for node in session(tmp_path / "onnx" / "encoder.onnx").get_inputs()] == \
        ["input_ids", "attention_mask"]

    # a 7-token prompt (8 slots with the memory, twice the window), then one token on its cache
    decoder = session(tmp_path / "onnx" / "decoder.onnx")
    rng = np.random.default_rng(1)
    input_ids = rng.integers(0, base, (2, 8))
    latent_z = rng.normal(0, 1, (2, 8)).astype(np.float32)
    empty = np.zeros((2, 2, 0, 8), dtype=np.float32)
    _, *present = decoder.run(None, {"input_ids": input_ids[:, :7], "latent_z": latent_z,
                                     **dict.fromkeys(cache_names("past", 2), empty)})
    assert present[0].shape == (2, 2, 7, 8)
    logits, *_ = decoder.run(None, {"input_ids": input_ids[:, 7:], "latent_z": latent_z,
                                    **dict(zip(cache_names("past", 2), present, strict=True))})
    expected_logits, _ = pytorch_step(model, input_ids, latent_z)
    np.testing.assert_allclose(logits[:, -1], expected_logits[:, -1], atol=ATOL, rtol=0)

    texts = bundled_sentences()[:3]
    runtime = OptimusOnnx(tmp_path / "onnx")
    np.testing.assert_allclose(runtime.encode(texts)[0], OptimusLatentSpace(model, processor).encode(texts)[0].numpy(),
                               atol=ATOL, rtol=0)
    latent_z = rng.normal(0, 3, (4, 8)).astype(np.float32)
    expected = model.generate(latent_z=torch.from_numpy(latent_z), max_new_tokens=12, min_new_tokens=12,
                              do_sample=False)
    np.testing.assert_array_equal(runtime.generate(latent_z, max_new_tokens=12, min_new_tokens=12), expected.numpy())
    assert runtime.reconstruct(texts, max_new_tokens=8) == \
        OptimusLatentSpace(model, processor, max_new_tokens=8).reconstruct(texts)
