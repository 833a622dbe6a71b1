"""Bad input for Optimus' converter and commands: the cases `tests/test_bad_input.py` runs (see `tests/bad_input.py`
for the builders and the checks)."""

import json
import math
import shutil

import torch
from bad_input import (
    OPTIMUS,
    UT,
    copy,
    damaged_copy,
    drop_key,
    edit_json,
    edit_state,
    fifo,
    foreign_code,
    payload,
    random_bytes,
    shifted,
    to_dev_zero,
    truncate,
    under_accelerate_fsdp,
    without_cuda,
    without_module,
    written,
)

from hf_ext.models.optimus.tiny_backbones import write_decoder, write_encoder

ENCODER = "checkpoint-encoder-100"
DECODER = "checkpoint-decoder-100"


def optimus(tmp, change=None, *extra):
    src = copy(OPTIMUS, tmp)
    shutil.rmtree(src / "checkpoint-full-100")
    if change is not None:
        change(src)
    return ["convert", "optimus", src, tmp / "out", *extra]


def optimus_weights(change, side=ENCODER):
    return lambda src: edit_state(src / side / "pytorch_model.bin", change)


def optimus_config(side=ENCODER, **changes):
    return lambda src: edit_json(src / side / "config.json", **changes)


CONVERSION_CASES = {
    "missing source": (lambda tmp: ["convert", "optimus", tmp / "nothing", tmp / "out"], 1, "does not exist"),
    "empty source": (lambda tmp: ["convert", "optimus", tmp.joinpath("empty").mkdir() or tmp / "empty", tmp / "out"],
                     1, "is empty"),
    "zero-byte weights": (lambda tmp: optimus(tmp, lambda s: (s / ENCODER / "pytorch_model.bin").write_bytes(b"")),
                          1, "is empty"),
    "truncated weights": (lambda tmp: optimus(tmp, lambda s: truncate(s / ENCODER / "pytorch_model.bin")), 1,
                          "truncated or corrupt"),
    "random weights": (lambda tmp: optimus(tmp, lambda s: random_bytes(s / DECODER / "pytorch_model.bin")), 1,
                       "not a torch checkpoint"),
    "code-running weights": (lambda tmp: optimus(tmp, lambda s: payload(s / ENCODER / "pytorch_model.bin")), 1,
                             "refusing to load"),
    "code-running args": (lambda tmp: optimus(tmp, lambda s: payload(s / ENCODER / "training_encoder_args.bin")), 1,
                          "refusing to load"),
    "code-running training.bin": (lambda tmp: (payload(tmp / "training.bin"),
                                               ["convert", "optimus", tmp / "training.bin", tmp / "out"])[1], 1,
                                  "refusing to load"),
    "foreign weights": (lambda tmp: optimus(tmp, lambda s: shutil.copy(UT / "state_dict.pt",
                                                                       s / ENCODER / "pytorch_model.bin")), 1,
                        "not an Optimus encoder"),
    "missing key": (lambda tmp: optimus(tmp, optimus_weights(
        lambda st: drop_key(st, "encoder.layer.1.output.dense.bias"))), 1, "missing 1 weight"),
    "extra key": (lambda tmp: optimus(tmp, optimus_weights(lambda st: st.update(extra=torch.zeros(2)))), 1,
                  "unexpected 1 weight"),
    "wrong shape": (lambda tmp: optimus(tmp, optimus_weights(
        lambda st: st.update({"encoder.layer.0.output.dense.bias": torch.zeros(3)}))), 1, "has shape"),
    "I32 weights": (lambda tmp: optimus(tmp, optimus_weights(
        lambda st: st.update({"encoder.layer.0.output.dense.bias":
                              st["encoder.layer.0.output.dense.bias"].to(torch.int32)}))), 1, "int32 values"),
    "NaN weights": (lambda tmp: optimus(tmp, optimus_weights(
        lambda st: st["encoder.layer.0.output.dense.bias"].fill_(math.nan))), 1,
                    "NaN or infinite"),
    "infinite decoder weights": (lambda tmp: optimus(tmp, optimus_weights(
        lambda st: st["transformer.h.0.ln_1.weight"].fill_(math.inf), DECODER)), 1, "NaN or infinite"),
    "malformed config": (lambda tmp: optimus(tmp, lambda s: (s / ENCODER / "config.json").write_text("{hidden")), 1,
                         "not valid JSON"),
    "zero attention heads": (lambda tmp: optimus(tmp, optimus_config(num_attention_heads=0)), 1,
                             "num_attention_heads must be a positive integer"),
    "string size": (lambda tmp: optimus(tmp, optimus_config(hidden_size="32")), 1, "hidden_size"),
    "boolean size": (lambda tmp: optimus(tmp, optimus_config(num_hidden_layers=True)), 1, "num_hidden_layers"),
    "negative layers": (lambda tmp: optimus(tmp, optimus_config(num_hidden_layers=-1)), 1,
                        "num_hidden_layers must be a positive integer"),
    "decoder heads do not divide": (lambda tmp: optimus(tmp, optimus_config(DECODER, n_head=5)), 1,
                                    "not divisible"),
    "decoder string vocab": (lambda tmp: optimus(tmp, optimus_config(DECODER, vocab_size="99")), 1, "vocab_size"),
    "NaN layer norm eps": (lambda tmp: optimus(tmp, optimus_config(layer_norm_eps=math.nan)), 1, "layer_norm_eps"),
    "config is a FIFO": (lambda tmp: optimus(tmp, lambda s: fifo(s / ENCODER / "config.json")), 1,
                         "not a regular file"),
    "config is /dev/zero": (lambda tmp: optimus(tmp, lambda s: to_dev_zero(s / DECODER / "config.json")), 1,
                            "not a regular file"),
    "corrupt reference": (lambda tmp: (random_bytes(tmp / "r.safetensors"),
                                       optimus(tmp, None, "--reference", tmp / "r.safetensors"))[1], 1,
                          "not a readable safetensors file"),
    "zero-byte reference": (lambda tmp: ((tmp / "r.safetensors").write_bytes(b""),
                                         optimus(tmp, None, "--reference", tmp / "r.safetensors"))[1], 1,
                            "not a readable safetensors file"),
    "reference of another model": (lambda tmp: optimus(tmp, None, "--reference", UT / "reference.safetensors"), 1,
                                   "lacks the tensor"),
    "reference not safetensors": (lambda tmp: optimus(tmp, None, "--reference", OPTIMUS / "reference.json"), 1,
                                  "not a .safetensors file"),
    "reference beyond tolerance": (lambda tmp: optimus(
        tmp, None, "--reference", shifted(OPTIMUS / "reference.safetensors", tmp / "r.safetensors", "dec_logits")), 1,
        "dec_logits: max abs error 5 exceeds its tolerance (atol 1e-05)"),
    "no such step": (lambda tmp: optimus(tmp, None, "--step", "7"), 1, "no checkpoint for step 7"),
    "bad flag value": (lambda tmp: optimus(tmp, None, "--latent-as-gpt-memory", "2"), 2, "invalid choice"),
}


# the commands run on this model folder (a fixture of tests/optimus/fixtures_optimus.py)
COMMAND_FOLDER = "optimus_sample_folder"

COMMAND_CASES = {
    "reconstruct with an unconverted output folder": (
        lambda tmp, folder: ["optimus", "reconstruct", OPTIMUS, "a dog runs ."], 2,
        "looks like an original Optimus checkpoint, not a model folder: convert it first (hf-ext convert optimus"),
    "top-p above 1": (lambda tmp, folder: ["optimus", "sample", folder, "--sample", "--top-p", "2"], 2,
                      "--top-p: must be in (0, 1]"),
    "zero temperature": (lambda tmp, folder: ["optimus", "sample", folder, "--sample", "--temperature", "0"], 2,
                         "--temperature: must be > 0"),
    "tokens beyond the decoder's positions": (
        lambda tmp, folder: ["optimus", "reconstruct", folder, "a dog", "--max-new-tokens", "500"], 1,
        "exceeds what the decoder's 64 positions allow"),
    "zero samples": (lambda tmp, folder: ["optimus", "sample", folder, "--num", "0"], 2,
                     "argument --num: must be at least 1"),
    "sampling options without --sample": (lambda tmp, folder: ["optimus", "sample", folder, "--top-k", "5",
                                                                "--temperature", "2"], 1,
                                          "--top-k, --temperature apply only with --sample"),
    "an empty sentence": (lambda tmp, folder: ["optimus", "reconstruct", folder, "a dog runs .", "  "], 2,
                          "argument texts: an empty sentence"),
    "infinite beta": (lambda tmp, folder: ["optimus", "train", folder, "--train-file", tmp / "t.txt",
                                           "--output-dir", tmp / "out", "--beta", "inf"], 2,
                      "--beta: expected a finite"),
    "negative beta": (lambda tmp, folder: ["optimus", "train", folder, "--train-file", tmp / "t.txt",
                                           "--output-dir", tmp / "out", "--beta", "-1"], 2, "--beta: must be >= 0"),
    "streamed training from a folder without text shards": (lambda tmp, folder: [
        "optimus", "train", folder, "--streaming", "--train-file", (tmp / "shards").mkdir() or tmp / "shards",
        "--output-dir", tmp / "out"], 1, "shards holds no shards (*.txt, *.txt.gz)"),
    "streamed training from a Hub dataset while offline": (lambda tmp, folder: [
        "optimus", "train", folder, "--streaming", "--train-file", "someone/sentences", "--output-dir", tmp / "out"],
        1, "text someone/sentences is neither a local path nor a reachable Hub dataset"),
    "training output exists": (lambda tmp, folder: ((tmp / "out").mkdir(), (tmp / "t.txt").write_text("a\n"),
                                                    ["optimus", "train", folder, "--train-file", tmp / "t.txt",
                                                     "--output-dir", tmp / "out"])[2], 1, "already exists"),
    "truncated model.safetensors": (lambda tmp, folder: ["optimus", "encode", damaged_copy(
        folder, tmp, lambda f: truncate(f / "model.safetensors")), "a dog"], 1,
        "safetensors weights are corrupt or truncated"),
    "model config with zero heads": (lambda tmp, folder: ["optimus", "encode", damaged_copy(
        folder, tmp, lambda f: edit_json(f / "config.json", decoder={
            **json.loads((f / "config.json").read_text())["decoder"], "n_head": 0})), "a dog"], 1,
        "n_head must be a positive integer"),
    "model config is a FIFO": (lambda tmp, folder: ["optimus", "encode", damaged_copy(
        folder, tmp, lambda f: fifo(f / "config.json")), "a dog"], 1, "config.json"),
    "optimus encode of a folder with its own code": (
        lambda tmp, folder: ["optimus", "encode", foreign_code(tmp), "a dog"], 1, "only with --trust-remote-code"),
    # --quantize: an unknown scheme, a model that is not an Optimus (a bare causal LM's folder)
    "unknown quantization": (lambda tmp, folder: ["optimus", "reconstruct", folder, "a dog", "--quantize", "int3"],
                             2, "argument --quantize: invalid choice: 'int3' (choose from 'int8', 'nf4')"),
    "int4 in PyTorch (int4 is an ONNX export's; PyTorch's 4-bit is nf4)": (
        lambda tmp, folder: ["optimus", "reconstruct", folder, "a dog", "--quantize", "int4"], 2,
        "argument --quantize: invalid choice: 'int4' (choose from 'int8', 'nf4')"),
    "quantizing a decoder that is not an Optimus": (
        lambda tmp, folder: ["optimus", "sample", write_decoder(tmp / "gpt2"), "--quantize", "int8"], 1,
        "holds a 'gpt2' model, not an Optimus model"),
    "--quantize nf4 without bitsandbytes": (
        lambda tmp, folder: without_module("bitsandbytes", ["optimus", "sample", folder, "--quantize", "nf4"]), 1,
        "--quantize nf4 needs bitsandbytes: pip install"),
    "--quantize on encode, which decodes nothing": (
        lambda tmp, folder: ["optimus", "encode", folder, "a dog", "--quantize", "int8"], 2,
        "unrecognized arguments: --quantize int8"),
    # hf-ext optimus init: backbones in the wrong role, without a key/value cache, with a tokenizer of another model
    "init with an encoder given as the decoder": (
        lambda tmp, folder: ["optimus", "init", write_encoder(tmp / "bert"), tmp / "bert", tmp / "out"], 1,
        "is not one (an encoder given as the decoder?)"),
    "init with a decoder given as the encoder": (
        lambda tmp, folder: ["optimus", "init", write_decoder(tmp / "gpt2"), tmp / "gpt2", tmp / "out"], 1,
        "is not one (a decoder given as the encoder?)"),
    "init with a decoder without a key/value cache": (
        lambda tmp, folder: ["optimus", "init", write_encoder(tmp / "bert"), write_decoder(tmp / "mamba", "mamba"),
                             tmp / "out"], 1, "the decoder 'mamba' keeps no key/value cache in every layer"),
    "init with latent size 0": (
        lambda tmp, folder: ["optimus", "init", write_encoder(tmp / "bert"), write_decoder(tmp / "gpt2"),
                             tmp / "out", "--latent-size", "0"], 2, "argument --latent-size: must be at least 1"),
    "init with an encoder tokenizer larger than its model's vocabulary": (
        lambda tmp, folder: ["optimus", "init", write_encoder(tmp / "bert", vocab_size=50),
                             write_decoder(tmp / "gpt2"), tmp / "out"], 1,
        "its tokenizer has 191 tokens but its model only 50 embeddings"),
    "init with a decoder tokenizer larger than its model's vocabulary": (
        lambda tmp, folder: ["optimus", "init", write_encoder(tmp / "bert"),
                             write_decoder(tmp / "gpt2", vocab_size=200), tmp / "out"], 1,
        "its tokenizer has 301 tokens but its model only 200 embeddings"),
    "init with the pooler of an encoder without one": (
        lambda tmp, folder: ["optimus", "init", write_encoder(tmp / "modernbert", "modernbert"),
                             write_decoder(tmp / "gpt2"), tmp / "out", "--encoder-pooling", "pooler"], 1,
        "its checkpoint has no pretrained pooler: choose the 'cls' or 'mean' encoder pooling"),
    "init with a backbone path that names no folder": (
        lambda tmp, folder: ["optimus", "init", tmp / "nothing", "org/decoder", tmp / "out"], 2,
        "argument encoder: no folder named"),
    # hf-ext optimus init --adapter: the model a LoRA run trained, rebuilt from its backbones
    "init --adapter with a setting the adapter fixes": (
        lambda tmp, folder: ["optimus", "init", *backbones_adapter(tmp)[:2], tmp / "out", "--adapter", tmp / "adapter",
                             "--latent-size", "8"], 1,
        "--latent-size with --adapter: the adapter's model fixes the latent size"),
    "init --adapter given no folder": (
        lambda tmp, folder: ["optimus", "init", write_encoder(tmp / "bert", "bert"),
                             write_decoder(tmp / "llama", "llama"), tmp / "out", "--adapter", tmp / "nothing"], 2,
        "argument --adapter: no folder named"),
    "init --adapter whose folder lacks its settings": (
        lambda tmp, folder: ["optimus", "init", *backbones_adapter(tmp, settings=False)[:2], tmp / "out",
                             "--adapter", tmp / "adapter"], 1,
        "cannot load the Optimus adapter from"),
    "init --adapter of other backbones": (
        lambda tmp, folder: ["optimus", "init", backbones_adapter(tmp)[0],
                             write_decoder(tmp / "wider", "llama", hidden_size=64, intermediate_size=96), tmp / "out",
                             "--adapter", tmp / "adapter"], 1,
        "does not fit these backbones (trained on others?)"),
    # hf-ext optimus train with frozen or LoRA backbones
    "LoRA on an encoder without the attention projections LoRA adapts": (
        lambda tmp, folder: ["optimus", "train", initialised(tmp, "distilbert", "gpt2"), "--train-file",
                             written(tmp / "t.txt", "a dog runs .\n"), "--output-dir", tmp / "out", "--lora-r", "4",
                             "--lora-on", "encoder"], 1,
        "LoRA on the encoder: the distilbert architecture has none of the attention projections hf-ext adapts"),
    "--lora-r under FSDP": (
        lambda tmp, folder: under_accelerate_fsdp(["optimus", "train", folder, "--train-file",
                                                   written(tmp / "t.txt", "a dog runs .\n"), "--output-dir",
                                                   tmp / "out", "--lora-r", "4"]), 1,
        "--lora-r under FSDP: the adapters cannot be merged into sharded weights"),
    "--lora-on without --lora-r": (
        lambda tmp, folder: ["optimus", "train", folder, "--train-file", written(tmp / "t.txt", "a dog runs .\n"),
                             "--output-dir", tmp / "out", "--lora-on", "decoder"], 1, "--lora-on needs --lora-r"),
    "--lora-alpha without --lora-r": (
        lambda tmp, folder: ["optimus", "train", folder, "--train-file", written(tmp / "t.txt", "a dog runs .\n"),
                             "--output-dir", tmp / "out", "--lora-alpha", "8"], 1,
        "--lora-alpha and --lora-dropout need --lora-r"),
    # hf-ext optimus train --eval-file: refused before training
    "train with an evaluation file of one sentence": (
        lambda tmp, folder: ["optimus", "train", folder, "--train-file", written(tmp / "t.txt", "a dog runs .\n"),
                             "--output-dir", tmp / "out", "--eval-file", written(tmp / "e.txt", "a cat sits .\n")], 1,
        "needs at least 2 sentences (active units use a variance)"),
    "train with evaluation samples not a multiple of those per pass": (
        lambda tmp, folder: ["optimus", "train", folder, "--train-file", written(tmp / "t.txt", "a dog runs .\n"),
                             "--output-dir", tmp / "out", "--eval-file", written(tmp / "e.txt", "a.\nb.\n"),
                             "--num-samples", "5", "--samples-per-pass", "2"], 1,
        "--num-samples must be a multiple of --samples-per-pass"),
    # --device and --dtype (hf_ext.cli_utils.add_device_arguments); `--device cuda` only where there is no CUDA
    **without_cuda({"encode with --device cuda on a machine without CUDA": (
        lambda tmp, folder: ["optimus", "encode", folder, "a dog", "--device", "cuda"], 2,
        "argument --device: cuda: CUDA is not available on this machine")}),
    "sample on a CUDA device the machine lacks": (
        lambda tmp, folder: ["optimus", "sample", folder, "--device", "cuda:99"], 2, "argument --device: cuda:99: "),
    "reconstruct with an unknown dtype": (
        lambda tmp, folder: ["optimus", "reconstruct", folder, "a dog", "--dtype", "int8"], 2,
        "argument --dtype: invalid choice: 'int8'"),
    "train in float16 on the CPU": (
        lambda tmp, folder: ["optimus", "train", folder, "--train-file", written(tmp / "t.txt", "a dog runs .\n"),
                             "--output-dir", tmp / "out", "--device", "cpu", "--dtype", "float16"], 1,
        "--dtype float16 trains only on CUDA (fp16 mixed precision with loss scaling), not on cpu"),
    "train with --dtype auto (no mixed precision of that name)": (
        lambda tmp, folder: ["optimus", "train", folder, "--train-file", written(tmp / "t.txt", "a dog runs .\n"),
                             "--output-dir", tmp / "out", "--dtype", "auto"], 2,
        "argument --dtype: invalid choice: 'auto'"),
    # hf-ext optimus attribute: operators, requests and labelled data
    "guided sampling without operators": (
        lambda tmp, folder: ["optimus", "attribute", "sample", folder, "--attribute", "subject=a man"], 1,
        "holds no latent attribute operators"),
    "an unknown attribute": (
        lambda tmp, folder: ["optimus", "attribute", "sample", folder, "--operators", operator(tmp, folder),
                             "--attribute", "mood=happy"], 1, "unknown attribute 'mood'; the operators are: subject"),
    "a label the operator does not know": (
        lambda tmp, folder: ["optimus", "attribute", "edit", folder, "a man is reading .", "--operators",
                             operator(tmp, folder), "--attribute", "subject=a dog"], 1,
        "attribute 'subject' has no label 'a dog'"),
    "an operator of another model": (
        lambda tmp, folder: ["optimus", "attribute", "sample", folder, "--operators",
                             operator(tmp, folder, fingerprint="0" * 16), "--attribute", "subject=a man"], 1,
        "was trained on another model (fingerprint 0000000000000000"),
    "an operator of another latent size": (
        lambda tmp, folder: ["optimus", "attribute", "sample", folder, "--operators",
                             operator(tmp, folder, latent_size=7), "--attribute", "subject=a man"], 1,
        "is for a latent size of 7, the model's is 5"),
    "a contradictory request": (
        lambda tmp, folder: ["optimus", "attribute", "sample", folder, "--operators", operator(tmp, folder),
                             "--attribute", "subject=a man", "--attribute", "subject=a woman"], 1,
        "contradictory request: attribute 'subject' asked to be both 'a man' and 'a woman'"),
    "an attribute without a label": (
        lambda tmp, folder: ["optimus", "attribute", "sample", folder, "--attribute", "subject"], 1,
        "'subject': write an attribute as name=label"),
    "no attribute requested": (lambda tmp, folder: ["optimus", "attribute", "sample", folder], 2,
                               "the following arguments are required: --attribute"),
    "an unknown guided-sampling method": (
        lambda tmp, folder: ["optimus", "attribute", "sample", folder, "--operators", operator(tmp, folder),
                             "--attribute", "subject=a man", "--method", "magic"], 2,
        "argument --method: invalid choice: 'magic'"),
    "an unknown editing method": (
        lambda tmp, folder: ["optimus", "attribute", "edit", folder, "a man is reading .", "--operators",
                             operator(tmp, folder), "--attribute", "subject=a man", "--method", "magic"], 2,
        "argument --method: invalid choice: 'magic'"),
    "the gaussian method with an operator saved before label Gaussians (format 1)": (
        lambda tmp, folder: ["optimus", "attribute", "sample", folder, "--operators",
                             operator(tmp, folder, format_1=True), "--attribute", "subject=a man"], 1,
        "operator 'subject' was saved before label Gaussians existed (format 1): retrain it"),
    "labelled data of one label": (
        lambda tmp, folder: ["optimus", "attribute", "train", folder, tmp / "out", "--name", "subject", "--data",
                             written(tmp / "d.jsonl", '{"text": "a man is reading .", "label": "a man"}\n')], 1,
        "needs sentences of at least 2 labels, got 'a man'"),
    "labelled data without labels": (
        lambda tmp, folder: ["optimus", "attribute", "train", folder, tmp / "out", "--name", "subject", "--data",
                             written(tmp / "d.jsonl", '{"text": "a man is reading ."}\n')], 1,
        'd.jsonl, line 1: expected {"text": "...", "label": "..."}'),
    "empty labelled data": (
        lambda tmp, folder: ["optimus", "attribute", "train", folder, tmp / "out", "--name", "subject", "--data",
                             written(tmp / "d.jsonl", "\n")], 1, "needs sentences of at least 2 labels, got none"),
    "an attribute name that is no file name": (
        lambda tmp, folder: ["optimus", "attribute", "train", folder, tmp / "out", "--name", "../up", "--data",
                             written(tmp / "d.jsonl", "")], 1, "--name '../up': use letters, digits"),
    "an operator that exists": (
        lambda tmp, folder: ["optimus", "attribute", "train", folder, operator(tmp, folder), "--name", "subject",
                             "--data", written(tmp / "d.jsonl", "")], 1,
        "latent_attributes/subject already exists (pass --overwrite to replace it)"),
    # the label-conditional method (`--method conditional`): its operators are the embeddings of a fine-tuned model
    "the gaussian method with label-conditional operators": (
        lambda tmp, folder: ["optimus", "attribute", "sample", folder, "--operators",
                             conditional_operator(tmp, folder), "--attribute", "subject=a man", "--method",
                             "gaussian"], 1,
        "operator 'subject' holds the label embeddings of a fine-tuned model: use method 'conditional'"),
    "the conditional method with a classifier operator": (
        lambda tmp, folder: ["optimus", "attribute", "edit", folder, "a man is reading .", "--operators",
                             operator(tmp, folder), "--attribute", "subject=a man", "--method", "conditional"], 1,
        "operator 'subject' is a classifier on z (methods gaussian and flow): method 'conditional' needs the label "
        "embeddings"),
    "a label the label-conditional operator does not know": (
        lambda tmp, folder: ["optimus", "attribute", "sample", folder, "--operators",
                             conditional_operator(tmp, folder), "--attribute", "subject=a dog"], 1,
        "attribute 'subject' has no label 'a dog'"),
    "an unknown attribute of label-conditional operators": (
        lambda tmp, folder: ["optimus", "attribute", "edit", folder, "a man is reading .", "--operators",
                             conditional_operator(tmp, folder), "--attribute", "mood=happy"], 1,
        "unknown attribute 'mood'; the operators are: subject"),
    "a label-conditional operator of another model": (
        lambda tmp, folder: ["optimus", "attribute", "sample", folder, "--operators",
                             conditional_operator(tmp, folder, fingerprint="0" * 16), "--attribute",
                             "subject=a man"], 1, "was trained on another model (fingerprint 0000000000000000"),
    "conditional training into the model's own folder": (
        lambda tmp, folder: ["optimus", "attribute", "train", folder, folder, "--method", "conditional", "--name",
                             "subject", "--data", written(tmp / "d.jsonl", TWO_LABELS)], 1,
        "--method conditional writes a new model folder: OUT must not be the model's own folder"),
    "several attributes for one classifier operator": (
        lambda tmp, folder: ["optimus", "attribute", "train", folder, tmp / "out", "--name", "subject", "--data",
                             written(tmp / "d.jsonl", TWO_LABELS), "--name", "place", "--data", tmp / "d.jsonl"], 1,
        "--method gaussian trains one attribute per run"),
    "an attribute name without its data": (
        lambda tmp, folder: ["optimus", "attribute", "train", folder, tmp / "out", "--method", "conditional",
                             "--name", "subject", "--name", "place", "--data", written(tmp / "d.jsonl", TWO_LABELS)],
        1, "give one --data per --name: got 2 names and 1 files"),
    "one attribute named twice": (
        lambda tmp, folder: ["optimus", "attribute", "train", folder, tmp / "out", "--method", "conditional",
                             "--name", "subject", "--data", written(tmp / "d.jsonl", TWO_LABELS), "--name", "subject",
                             "--data", tmp / "d.jsonl"], 1, "--name ['subject', 'subject']: each attribute once"),
    "a sentence given two labels of one attribute": (
        lambda tmp, folder: ["optimus", "attribute", "train", folder, tmp / "out", "--method", "conditional",
                             "--name", "subject", "--data", written(tmp / "d.jsonl", TWO_LABELS + '{"text": '
                                                                    '"a man is reading .", "label": "a woman"}\n')], 1,
        "attribute 'subject': the sentence 'a man is reading .' is labelled both 'a man' and 'a woman'"),
    "conditional training with --dtype auto": (
        lambda tmp, folder: ["optimus", "attribute", "train", folder, tmp / "out", "--method", "conditional",
                             "--name", "subject", "--data", written(tmp / "d.jsonl", TWO_LABELS), "--dtype", "auto"],
        1, "--dtype auto: --method conditional trains float32 weights"),
}
TWO_LABELS = '{"text": "a man is reading .", "label": "a man"}\n{"text": "a woman is reading .", "label": "a woman"}\n'


def operator(tmp, folder, fingerprint=None, latent_size=None, format_1=False):
    """A folder holding a `subject` operator (labels "a man", "a woman") for the model in `folder`; with `format_1`
    as saved before the label Gaussians existed."""
    from hf_ext.models.optimus import OptimusModel
    from hf_ext.models.optimus.attributes import ATTRIBUTES_FOLDER, LatentAttribute, latent_fingerprint

    model = OptimusModel.from_pretrained(folder)
    saved = LatentAttribute("subject", ["a man", "a woman"], latent_size or model.config.latent_size,
                            fingerprint=latent_fingerprint(model) if fingerprint is None else fingerprint).save(
        tmp / "operators" / ATTRIBUTES_FOLDER / "subject")
    if format_1:
        as_format_1(saved)
    return tmp / "operators"


def conditional_operator(tmp, folder, fingerprint=None):
    """A folder holding a label-conditional `subject` operator (labels "a man", "a woman"; untrained embeddings) for
    the model in `folder`."""
    from hf_ext.models.optimus import OptimusModel
    from hf_ext.models.optimus.attributes import ATTRIBUTES_FOLDER, ConditionalAttribute, latent_fingerprint

    model = OptimusModel.from_pretrained(folder)
    ConditionalAttribute("subject", ["a man", "a woman"], model.config.latent_size,
                         latent_fingerprint(model) if fingerprint is None else fingerprint).save(
        tmp / "operators" / ATTRIBUTES_FOLDER / "subject")
    return tmp / "operators"


def as_format_1(folder):
    """Rewrite the operator in `folder` as format 1 wrote it: no version field, no label Gaussians."""
    import json

    from safetensors.torch import load_file, save_file

    from hf_ext.models.optimus.attributes import CONFIG_NAME, LABEL_GAUSSIAN_KEYS, WEIGHTS_NAME

    config = json.loads((folder / CONFIG_NAME).read_text())
    del config["format_version"]
    (folder / CONFIG_NAME).write_text(json.dumps(config))
    weights = load_file(folder / WEIGHTS_NAME)
    save_file({key: value for key, value in weights.items() if key not in LABEL_GAUSSIAN_KEYS}, folder / WEIGHTS_NAME)


def backbones_adapter(tmp, decoder="llama", settings=True):
    """The LoRA adapter folder `save_backbones_adapter` writes for tiny BERT + `decoder` backbones (untrained: what
    the cases check is how it is read), and the two backbones; `settings=False` drops its settings file."""
    from hf_ext.models.optimus.backbones import ADAPTER_SETTINGS, optimus_from_backbones, save_backbones_adapter
    from hf_ext.models.optimus.training import freeze_or_adapt

    encoder_folder = write_encoder(tmp / "bert", "bert")
    decoder_folder = write_decoder(tmp / decoder, decoder)
    model, processor = optimus_from_backbones(str(encoder_folder), str(decoder_folder), latent_size=4)
    adapted, _ = freeze_or_adapt(model, processor, lora_on=("decoder",), lora_r=2)
    save_backbones_adapter(adapted, tmp / "adapter", str(encoder_folder), str(decoder_folder))
    if not settings:
        (tmp / "adapter" / ADAPTER_SETTINGS).unlink()
    return encoder_folder, decoder_folder, tmp / "adapter"


def initialised(tmp, encoder, decoder):
    """An Optimus folder `hf-ext optimus init` built from tiny `encoder` and `decoder` backbones."""
    from hf_ext.models.optimus.backbones import optimus_from_backbones

    model, processor = optimus_from_backbones(str(write_encoder(tmp / encoder, encoder)),
                                              str(write_decoder(tmp / decoder, decoder)), latent_size=4)
    model.save_pretrained(tmp / "init")
    processor.save_pretrained(tmp / "init")
    return tmp / "init"
