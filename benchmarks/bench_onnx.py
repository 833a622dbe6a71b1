#!/usr/bin/env python
"""ONNX Runtime against PyTorch eager, on graphs written by `hf-ext export onnx` (one run, same machine, same threads).

(a) MT-DNN at BERT-base size (12 layers, 768 wide, vocabulary 30522) with a linear head (CoLA) and a SAN head (MNLI,
    5 turns), and ERNIE 2.0 base as a sequence classifier with its task embedding: batch 1 x 128 and 16 x 128, eager
    PyTorch (`torch.inference_mode`) against the float graph and the int8 graph (dynamic quantization of the
    weights). Targets at batch 1: float at least 1.3x faster than eager, int8 at least 2x.
(b) Prediction agreement of the int8 graph with the float model: the argmax of every classification head on the
    GLUE and SNLI samples in tests/data (pairs padded to 128 tokens). Target: at least 99% unchanged.
(c) Optimus greedy decoding with a GPT-2 small decoder: the ONNX Runtime loop (`OptimusOnnx.generate`, decoder step
    with its key/value cache) against `OptimusModel.generate()`, both giving the same tokens.

The weights are random (initialised as transformers does): no trained checkpoint can be downloaded here, so the
agreement is measured on untrained heads, whose logits lie closer together than a trained model's.

The results file (`--output`) is published by this script's `tables`: timing's, with the agreement as tables of
its own.
"""

import csv
import statistics
import tempfile
from pathlib import Path

import numpy as np
import torch
from timing import benchmark_parser, finish, markdown_table, record, report_ratio, setup, time_interleaved
from timing import tables as timing_tables
from transformers import BertConfig, BertTokenizerFast, ErnieConfig, ErnieForSequenceClassification

from hf_ext import MTDNNConfig, MTDNNModel, OptimusConfig
from hf_ext.cli_utils import configure_logging
from hf_ext.models.optimus.export_onnx import OptimusOnnx
from hf_ext.models.optimus.samples import random_model
from hf_ext.onnx_export import export_onnx, session
from hf_ext.sample_text import train_bert_vocab

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"
# PyTorch's and ONNX Runtime's thread pools spin after their work: without a pause each slows the other's next run
# (measured here: eager 0.14 s instead of 0.10 s, int8 0.08 s instead of 0.05 s at batch 1 x 128)
SETTLE = 0.3


def encoder_sizes(quick):
    return dict(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                intermediate_size=3072) if not quick else dict(vocab_size=300, hidden_size=32, num_hidden_layers=2,
                                                                num_attention_heads=2, intermediate_size=64)


def mtdnn_model(quick):
    tasks = [{"name": "cola", "type": "classification", "num_labels": 2},
             {"name": "mnli", "type": "classification", "num_labels": 3, "head": "san"}]
    return MTDNNModel(MTDNNConfig(encoder=BertConfig(**encoder_sizes(quick)), tasks=tasks)).eval()


def ernie_model(quick):
    config = ErnieConfig(**encoder_sizes(quick), use_task_id=True, task_type_vocab_size=3, num_labels=3)
    return ErnieForSequenceClassification(config).eval()


def sample_pairs():
    """Sentence pairs of the GLUE samples (every task, split and row) and of consecutive SNLI sentences."""
    pairs = []
    for path in sorted((DATA / "glue_samples").glob("*/*.tsv")):
        with open(path, encoding="utf-8", newline="") as file:
            rows = list(csv.reader(file, delimiter="\t", quoting=csv.QUOTE_NONE))
        for row in rows[1:]:
            texts = sorted((field for field in row if len(field.split()) > 3 and "(" not in field), key=len)[-2:]
            if texts:
                pairs.append(tuple(texts) if len(texts) == 2 else (texts[0], None))
    sentences = (DATA / "snli_sentences" / "test.txt").read_text(encoding="utf-8").split("\n")
    sentences = [sentence for sentence in sentences if sentence.strip()]
    pairs += list(zip(sentences[::2], sentences[1::2], strict=False))  # an odd last sentence pairs with none
    return pairs


def tokenized_pairs(folder, vocab_size, length):
    pairs = sample_pairs()
    sentences = [text for pair in pairs for text in pair if text]
    vocab = train_bert_vocab(sentences, folder, vocab_size=min(vocab_size, 2000))
    tokenizer = BertTokenizerFast(vocab_file=str(vocab))
    batch = tokenizer([first for first, _ in pairs], [second or "" for _, second in pairs], padding="max_length",
                      truncation=True, max_length=length, return_tensors="np")
    return {name: batch[name].astype(np.int64) for name in ("input_ids", "attention_mask", "token_type_ids")}


def ort_feeds(graph, inputs):
    names = {node.name for node in graph.get_inputs()}
    return {name: value for name, value in inputs.items() if name in names}


def classifier_benchmark(name, model, vocab_size, folder, shapes, repeats, agreement_inputs, label_outputs):
    """Time eager / float / int8 at each shape, then the int8 graph's agreement with the float model, which it
    returns: the predictions that agree and their number, the sample pairs, the target and, for every output, the
    int8 graph's largest error and the float model's margins between its top two logits."""
    model.save_pretrained(folder / name)
    # dynamic int8, as published: encoders at batch x 128 are bound by arithmetic, which MatMulInteger does in int8
    report = export_onnx(folder / name, folder / f"{name}-onnx", quantize="int8-dynamic")
    errors = [check["max_abs_error"] for check in report["graphs"][0]["checks"]]
    print(f"{name}: exported in {report['seconds']} s; float graph max abs error against PyTorch {max(errors):.1e}")
    record(f"{name}_export", {"seconds": report["seconds"], "float_graph_max_abs_error": max(errors)})
    graphs = {kind: session(folder / f"{name}-onnx" / file) for kind, file in
              (("float", "model.onnx"), ("int8", "model_int8_dynamic.onnx"))}
    wrapper = _graph_module(name, model)
    generator = torch.Generator().manual_seed(0)
    for batch, length in shapes:
        inputs = {"input_ids": torch.randint(5, vocab_size, (batch, length), generator=generator),
                  "attention_mask": torch.ones(batch, length, dtype=torch.long),
                  "token_type_ids": torch.zeros(batch, length, dtype=torch.long)}
        inputs["token_type_ids"][:, length // 2:] = 1
        if "task_type_ids" in report["graphs"][0]["inputs"]:
            inputs["task_type_ids"] = torch.ones(batch, length, dtype=torch.long)
        arrays = {key: value.numpy() for key, value in inputs.items()}
        args = [inputs[key] for key in report["graphs"][0]["inputs"]]

        def eager(args=args):
            with torch.inference_mode():
                wrapper(*args)

        print(f"{name} at batch {batch} x {length}:")
        times = time_interleaved({"eager": eager,
                                  "onnxruntime float": lambda arrays=arrays: graphs["float"].run(
                                      None, ort_feeds(graphs["float"], arrays)),
                                  "onnxruntime int8": lambda arrays=arrays: graphs["int8"].run(
                                      None, ort_feeds(graphs["int8"], arrays))},
                                 repeats, settle=SETTLE, section=f"{name} at batch {batch} x {length}")
        targets = (1.3, 2.0) if batch == 1 else (None, None)
        for kind, target in zip(("float", "int8"), targets, strict=True):
            report_ratio(f"{name} {batch}x{length}: eager time / onnxruntime {kind} time", times["eager"],
                         times[f"onnxruntime {kind}"], target, higher_is_better=True)
    feeds = dict(agreement_inputs)
    if "task_type_ids" in report["graphs"][0]["inputs"]:
        feeds["task_type_ids"] = np.ones_like(feeds["input_ids"])
    output_names = report["graphs"][0]["outputs"]
    float_outputs = dict(zip(output_names, graphs["float"].run(None, ort_feeds(graphs["float"], feeds)), strict=True))
    int8_outputs = dict(zip(output_names, graphs["int8"].run(None, ort_feeds(graphs["int8"], feeds)), strict=True))
    same = total = 0
    outputs = {}
    for output in label_outputs:
        reference, quantized = float_outputs[output], int8_outputs[output]
        agree = reference.argmax(-1) == quantized.argmax(-1)
        same += int(agree.sum())
        total += len(reference)
        top_two = np.sort(reference, axis=-1)[:, -2:]
        margins = top_two[:, 1] - top_two[:, 0]  # how far the float model's prediction is from a tie
        error, median_margin = float(np.abs(reference - quantized).max()), float(np.median(margins))
        disagreeing_margin = None if agree.all() else float(np.max(margins[~agree]))
        outputs[output] = {"int8_max_abs_error": error, "median_margin": median_margin,
                           "largest_margin_where_int8_disagrees": disagreeing_margin}
        print(f"  {output}: int8 max abs error {error:.3f}; the float model's margin between its top two logits: "
              f"median {median_margin:.3f}"
              + (f", {disagreeing_margin:.4f} at most where int8 disagrees" if disagreeing_margin is not None else ""))
    fraction = same / total
    print(f"RESULT {name}: int8 argmax agreement with the float model on {total} head predictions "
          f"({len(feeds['input_ids'])} sample pairs): {fraction:.1%} (target >= 99%: "
          f"{'met' if fraction >= 0.99 else 'MISSED'})")
    return {"same": same, "total": total, "sample_pairs": len(feeds["input_ids"]), "target": 0.99,
            "met": fraction >= 0.99, "outputs": outputs}


def _graph_module(name, model):
    """The module the exporter wrapped, run eagerly for the timing."""
    if name == "mtdnn":
        from hf_ext.models.mtdnn.export_onnx import MTDNNHeads

        return MTDNNHeads(model, model.config.task_names)
    from hf_ext.models.ernie2.export_onnx import ErnieGraph

    return ErnieGraph(model, ["logits"])


def optimus_benchmark(folder, quick, repeats):
    from transformers import GPT2Config

    vocab = 1003 if quick else 50260  # the last three ids: <PAD>, <BOS>, <EOS>
    width, layers, heads = (64, 2, 2) if quick else (768, 12, 12)
    decoder = GPT2Config(vocab_size=vocab, n_embd=width, n_layer=layers, n_head=heads, n_positions=1024,
                         pad_token_id=vocab - 3, bos_token_id=vocab - 2, eos_token_id=vocab - 1)
    encoder = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=1,
                         intermediate_size=64)
    model = random_model(OptimusConfig(encoder=encoder, decoder=decoder, latent_size=32), seed=0, scale=0.02).eval()
    model.save_pretrained(folder / "optimus")
    report = export_onnx(folder / "optimus", folder / "optimus-onnx")
    print(f"optimus: exported in {report['seconds']} s")
    record("optimus_export", {"seconds": report["seconds"]})
    runtime = OptimusOnnx(folder / "optimus-onnx")
    batch, new_tokens = (2, 4) if quick else (4, 32)
    latent_z = torch.randn(batch, 32, generator=torch.Generator().manual_seed(0))
    # <EOS> banned in both (min_new_tokens), so that every call decodes exactly `new_tokens` tokens
    expected = model.generate(latent_z=latent_z, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                              do_sample=False)
    produced = runtime.generate(latent_z.numpy(), max_new_tokens=new_tokens, min_new_tokens=new_tokens)
    same = np.array_equal(produced, expected.numpy())
    print(f"optimus greedy decoding of {batch} latents x {new_tokens} tokens (decoder {layers} layers, {width} wide, "
          f"vocabulary {vocab}); same tokens: {same}")
    record("optimus_greedy_decoding", {"latents": batch, "new_tokens": new_tokens, "decoder_layers": layers,
                                       "decoder_width": width, "vocabulary": vocab, "same_tokens": same})
    if not same:
        raise SystemExit("the ONNX Runtime loop and generate() disagree")

    def eager():
        with torch.inference_mode():
            model.generate(latent_z=latent_z, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)

    times = time_interleaved({"generate()": eager,
                              "onnxruntime loop": lambda: runtime.generate(
                                  latent_z.numpy(), max_new_tokens=new_tokens, min_new_tokens=new_tokens)},
                             repeats, settle=SETTLE,
                             section=f"optimus greedy decoding, {batch} latents x {new_tokens} tokens")
    report_ratio("optimus greedy decoding: generate() time / onnxruntime loop time", times["generate()"],
                 times["onnxruntime loop"], higher_is_better=True)
    milliseconds_per_token = statistics.median(times["onnxruntime loop"]) / new_tokens * 1000
    print(f"  ({milliseconds_per_token:.1f} ms per token on ONNX Runtime)")
    record("optimus_onnxruntime_ms_per_token", milliseconds_per_token)


def main():
    args = benchmark_parser(__doc__).parse_args()
    repeats = setup(args, default_repeats=5)
    configure_logging()  # hf-ext's progress lines on stderr, transformers' notices off, as the command runs
    length = 16 if args.quick else 128
    shapes = [(1, length), (2 if args.quick else 16, length)]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        torch.manual_seed(0)
        vocab_size = encoder_sizes(args.quick)["vocab_size"]
        pairs = tokenized_pairs(folder / "vocab", vocab_size, length)
        agreement = {"mtdnn": classifier_benchmark("mtdnn", mtdnn_model(args.quick), vocab_size, folder, shapes,
                                                   repeats, pairs, ["logits_cola", "logits_mnli"]),
                     "ernie": classifier_benchmark("ernie", ernie_model(args.quick), vocab_size, folder, shapes,
                                                   repeats, pairs, ["logits"])}
        record("int8_argmax_agreement", agreement)
        optimus_benchmark(folder, args.quick, repeats)
    finish()


def tables(results: dict) -> str:
    """timing's tables with the int8 argmax agreement (this script's own RESULT lines) as tables instead of a figure:
    one row per model before them, one per head output after them."""
    figures = dict(results["figures"])
    agreement = figures.pop("int8_argmax_agreement")
    models = [[model, f"{shown['same'] / shown['total']:.1%}", f"{shown['same']}/{shown['total']}",
               str(shown["sample_pairs"]), f">= {shown['target']:.0%}", "met" if shown["met"] else "MISSED"]
              for model, shown in agreement.items()]
    outputs = [[model, output, f"{shown['int8_max_abs_error']:.3f}", f"{shown['median_margin']:.3f}",
                "" if shown["largest_margin_where_int8_disagrees"] is None
                else f"{shown['largest_margin_where_int8_disagrees']:.4f}"]
               for model, of_model in agreement.items() for output, shown in of_model["outputs"].items()]
    return "\n\n".join([
        markdown_table(["model", "int8 argmax agreement with the float model", "predictions", "sample pairs",
                        "target", "verdict"], models),
        timing_tables({**results, "figures": figures}),
        markdown_table(["model", "output", "int8 max abs error", "float model's median top-two margin",
                        "largest margin where int8 disagrees"], outputs)])


if __name__ == "__main__":
    main()
