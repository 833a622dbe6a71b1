#!/usr/bin/env python
"""Greedy decoding with int8 (and 4-bit) weights on the CPU: batch 1, 64 new tokens, against float32
`OptimusModel.generate` in the same run, interleaved.

Candidates, per decoder:
- `float32 generate()`: `OptimusModel.generate`, the baseline;
- `dynamic int8 generate()`: the same after `quantize_decoder(model, "int8")` (PyTorch's dynamic int8 linear layers:
  no maintained weight-only int8 for the CPU beat float32 in eager mode, docs/export.md);
- `nf4 generate()`: after `quantize_decoder(model, "nf4")` (bitsandbytes' 4-bit layers on its CPU backend), where
  bitsandbytes is installed (the quantize extra);
- `onnxruntime float32`: `OptimusOnnx` on the float decoder graph;
- `onnxruntime int8`, `onnxruntime int4`, `onnxruntime dynamic int8`: `OptimusOnnx` on the decoder graphs of
  `hf-ext export onnx --quantize int8` / `int4` / `int8-dynamic` (MatMulNBits int8 and 4-bit weights in blocks of 32;
  ONNX Runtime's dynamic int8), GPT-2's Gemm projections included.
Target: int8 at least 3x the tokens per second of float32 `generate()`.

Decoders: GPT-2 small (768 wide, 12 layers, 12 heads, vocabulary 50260; random weights), and a Llama-style decoder
of similar size: SmolLM2-135M's own weights from `--llama-decoder PATH` (a float32 folder) behind the encoder of
`--encoder PATH` (as `hf-ext optimus init` builds it), else a random decoder of SmolLM2-135M's shape (576 wide, 30
layers, 9 heads with 3 key/value heads, MLP 1536, vocabulary 49152, tied embeddings).

Quality, with SmolLM2's weights (a trained language model; random weights have no margins to keep): the greedy
tokens of each quantized decoder under teacher forcing on the bundled sentences, against float32's. The
reconstruction accuracy of a trained Optimus is checked in tests/optimus/test_optimus_quantization.py.
"""

import copy
import importlib.util
import statistics
import tempfile
from pathlib import Path

import numpy as np
import torch
from bench_optimus_generation import build_models, greedy_config, tiny_encoder
from timing import benchmark_parser, finish, record, report_ratio, setup, time_interleaved
from transformers import LlamaConfig

from hf_ext import OptimusConfig
from hf_ext.cli_utils import configure_logging
from hf_ext.models.optimus.export_onnx import OptimusOnnx, cache_names
from hf_ext.models.optimus.quantization import greedy_agreement, quantize_decoder
from hf_ext.models.optimus.samples import random_model
from hf_ext.onnx_export import export_onnx, quantize_graph, quantized_file
from hf_ext.sample_text import bundled_sentences

SMOLLM2 = Path("/work/cache/backbones/SmolLM2-135M-Instruct-Q4_1-f32")
ENCODER = Path("/work/cache/backbones/all-MiniLM-L6-v2")
SETTLE = 0.3  # seconds before each run: the thread pools of the other library go idle (benchmarks/bench_onnx.py)
TARGET = 3.0


def smollm2_shape(quick):
    """A random Llama-style decoder of SmolLM2-135M's shape; the last three ids pad, BOS and EOS."""
    vocab = 1003 if quick else 49152
    width, layers, heads, key_value_heads, mlp = (64, 2, 4, 2, 128) if quick else (576, 30, 9, 3, 1536)
    return LlamaConfig(vocab_size=vocab, hidden_size=width, num_hidden_layers=layers, num_attention_heads=heads,
                       num_key_value_heads=key_value_heads, intermediate_size=mlp, max_position_embeddings=2048,
                       tie_word_embeddings=True, rope_parameters={"rope_theta": 100000.0, "rope_type": "default"},
                       pad_token_id=vocab - 3, bos_token_id=vocab - 2, eos_token_id=vocab - 1)


def llama_model(args):
    """(model, processor or None, where the weights came from)."""
    if not args.quick and args.llama_decoder.is_dir() and args.encoder.is_dir():
        from hf_ext.models.optimus.backbones import optimus_from_backbones

        model, processor = optimus_from_backbones(str(args.encoder), str(args.llama_decoder), latent_size=32)
        return model.eval(), processor, f"{args.llama_decoder.name} (pretrained)"
    config = OptimusConfig(encoder=tiny_encoder(), decoder=smollm2_shape(args.quick), latent_size=32)
    return random_model(config, seed=0, scale=None).eval(), None, "random, SmolLM2-135M's shape"


def teacher_forced_agreement(model, quantized, runtimes, processor):
    """Per quantized candidate (`quantized`: the PyTorch models by candidate name), its greedy tokens under teacher
    forcing against float32's, on the bundled sentences, from the posterior means."""
    batch = processor(bundled_sentences())
    pad = model.config.decoder.pad_token_id
    with torch.no_grad():
        mean = model.encode(batch["input_ids"], batch["attention_mask"])[0]
        reference = model(decoder_input_ids=batch["labels"], latent_z=mean).logits
        found = {name: module(decoder_input_ids=batch["labels"], latent_z=mean).logits
                 for name, module in quantized.items()}
    float_runtime = runtimes["onnxruntime float32"]
    empty = np.zeros((mean.shape[0], float_runtime.key_value_heads, 0, float_runtime.head_dim), dtype=np.float32)
    feeds = {"input_ids": batch["labels"].numpy(), "latent_z": mean.numpy(),
             **dict.fromkeys(cache_names("past", float_runtime.num_layers), empty)}
    for name, runtime in runtimes.items():
        found[name] = torch.from_numpy(runtime.decoder.run(["logits"], feeds)[0])
    agreement = {}
    for name, logits in found.items():
        equal, total = greedy_agreement(reference, logits, batch["labels"], pad)
        agreement[name] = {"equal": equal, "total": total, "share": equal / total}
        print(f"  {name}: greedy tokens under teacher forcing equal to float32's at {equal}/{total} positions "
              f"({equal / total:.2%})")
    return agreement


def measure(name, model, processor, folder, new_tokens, repeats):
    """Export, quantize and time one decoder; returns the candidates' greedy tokens against float32's."""
    decoder = model.config.decoder
    parameters = sum(parameter.numel() for parameter in model.decoder.parameters())
    print(f"{name}: {decoder.model_type}, {decoder.num_hidden_layers} layers, width {decoder.hidden_size}, "
          f"vocabulary {decoder.vocab_size}, {parameters / 1e6:.1f}M decoder parameters")
    model.save_pretrained(folder / name)
    if processor is not None:
        processor.save_pretrained(folder / name)
    exported = folder / f"{name}-onnx"
    report = export_onnx(folder / name, exported, quantize="int8")
    # the other schemes from the same float graph, as `--quantize int4` / `int8-dynamic` would write them
    for scheme in ("int4", "int8-dynamic"):
        for graph in ("encoder", "decoder"):
            quantize_graph(exported / f"{graph}.onnx", exported / quantized_file(graph, scheme), scheme)
    sizes = {path.name: path.stat().st_size for path in sorted(exported.glob("decoder*.onnx"))}
    print(f"  exported in {report['seconds']} s; graphs: "
          + ", ".join(f"{file} {size / 2**20:.0f} MiB" for file, size in sizes.items()))
    runtimes = {"onnxruntime float32": OptimusOnnx(exported),
                **{f"onnxruntime {scheme.replace('int8-dynamic', 'dynamic int8')}": OptimusOnnx(exported, scheme)
                   for scheme in ("int8", "int4", "int8-dynamic")}}
    quantized = {"dynamic int8 generate()": quantize_decoder(copy.deepcopy(model))}
    if importlib.util.find_spec("bitsandbytes") is not None:  # the quantize extra
        quantized["nf4 generate()"] = quantize_decoder(copy.deepcopy(model), "nf4")

    latent_z = model.sample_prior(1, torch.Generator().manual_seed(1))
    generation = greedy_config(model.config, new_tokens)
    candidates = {
        "float32 generate()": torch.no_grad()(lambda: model.generate(latent_z=latent_z, generation_config=generation)),
        **{candidate: torch.no_grad()(lambda module=module: module.generate(latent_z=latent_z,
                                                                            generation_config=generation))
           for candidate, module in quantized.items()},
        **{candidate: (lambda runtime=runtime: runtime.generate(latent_z.numpy(), max_new_tokens=new_tokens,
                                                                min_new_tokens=new_tokens))
           for candidate, runtime in runtimes.items()}}
    reference = candidates["float32 generate()"]()
    tokens = {candidate: np.asarray(run()) for candidate, run in candidates.items()}
    same = {candidate: int((found == reference.numpy()).sum()) for candidate, found in tokens.items()}
    print("  greedy tokens equal to float32 generate()'s: "
          + ", ".join(f"{candidate} {count}/{reference.numel()}" for candidate, count in same.items()))
    if same["onnxruntime float32"] != reference.numel():
        raise SystemExit(f"{name}: the float32 ONNX Runtime loop and generate() disagree")
    times = time_interleaved(candidates, repeats, warmup=0, settle=SETTLE,
                             section=f"{name}: greedy decoding, batch 1, {new_tokens} new tokens")
    tokens_per_second = {candidate: new_tokens / statistics.median(seconds) for candidate, seconds in times.items()}
    for candidate, speed in tokens_per_second.items():
        print(f"  {candidate}: {speed:.1f} tokens/s")
    for candidate in candidates:
        if candidate != "float32 generate()":
            target = TARGET if "int8" in candidate else None
            report_ratio(f"{name}: tokens per second of {candidate} / float32 generate()",
                         times["float32 generate()"], times[candidate], target, higher_is_better=True)
    figures = {"decoder": {"model_type": decoder.model_type, "layers": decoder.num_hidden_layers,
                           "width": decoder.hidden_size, "vocabulary": decoder.vocab_size, "parameters": parameters},
               "graph_bytes": sizes, "tokens_per_second_of_the_median_run": tokens_per_second,
               "greedy_tokens_equal_to_float32": {"equal": same, "total": reference.numel()}}
    if processor is not None:
        figures["teacher_forced_agreement"] = teacher_forced_agreement(model, quantized, runtimes, processor)
    return figures


def main(argv=None):
    parser = benchmark_parser(__doc__)
    parser.add_argument("--new-tokens", type=int, help="tokens generated (default 64; quick 8)")
    parser.add_argument("--llama-decoder", type=Path, default=SMOLLM2, metavar="PATH",
                        help=f"SmolLM2-135M's folder (default {SMOLLM2}; random weights of its shape when absent)")
    parser.add_argument("--encoder", type=Path, default=ENCODER, metavar="PATH",
                        help=f"the encoder beside it (default {ENCODER})")
    args = parser.parse_args(argv)
    repeats = setup(args, default_repeats=5)
    configure_logging()
    new_tokens = args.new_tokens or (8 if args.quick else 64)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        gpt2, _ = build_models(args.quick)
        record("gpt2", measure("gpt2", gpt2.eval(), None, folder, new_tokens, repeats))
        llama, processor, weights = llama_model(args)
        figures = measure("llama", llama, processor, folder, new_tokens, repeats)
        record("llama", {"weights": weights, **figures})
    finish()


if __name__ == "__main__":
    main()
