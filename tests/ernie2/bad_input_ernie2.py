"""Bad input for ERNIE 2.0's converter and commands: the cases `tests/test_bad_input.py` runs (see `tests/bad_input.py`
for the builders and the checks)."""

import json
import math
import struct

import numpy as np
from bad_input import (
    ERNIE_PADDLENLP,
    ERNIE_STATIC,
    FIXTURES,
    GLUE,
    OPTIMUS,
    alias_bomb,
    copy,
    damaged_copy,
    edit_json,
    fifo,
    foreign_code,
    payload,
    shifted,
    to_dev_zero,
    truncate,
    truncated_copy,
    written,
)


def ernie(tmp, change=None, *extra, source=ERNIE_STATIC):
    src = copy(source, tmp)
    if change is not None:
        change(src)
    return ["convert", "ernie2", src, tmp / "out", *extra]


def ernie_config(**changes):
    return lambda src: edit_json(src / "ernie_config.json", **changes)


def lod_tensor(path, dims, code=5, data=None):
    """A Paddle LoDTensor file (no LoD levels) of `dims` with dtype `code` (5 = float32)."""
    desc = bytes([0x08, code]) + b"".join(bytes([0x10, d]) for d in dims)
    dtype = {5: np.float32, 2: np.int32}[code]
    values = np.zeros(dims, dtype) if data is None else np.asarray(data, dtype).reshape(dims)
    path.write_bytes(struct.pack("<IQIi", 0, 0, 0, len(desc)) + desc + values.tobytes())


def huge_lod_block(path):
    path.write_bytes(struct.pack("<IQQ", 0, 1, 1 << 62) + b"\0" * 64)


CONVERSION_CASES = {
    "missing config": (lambda tmp: ernie(tmp, lambda s: (s / "ernie_config.json").unlink()), 1,
                       "no ernie_config.json"),
    "negative layers": (lambda tmp: ernie(tmp, ernie_config(num_hidden_layers=-1)), 1,
                        "num_hidden_layers must be a positive integer"),
    "zero attention heads": (lambda tmp: ernie(tmp, ernie_config(num_attention_heads=0)), 1,
                             "num_attention_heads must be a positive integer"),
    "string size": (lambda tmp: ernie(tmp, ernie_config(hidden_size="32")), 1, "hidden_size must be an integer"),
    "boolean size": (lambda tmp: ernie(tmp, ernie_config(hidden_size=True)), 1, "hidden_size must be an integer"),
    "heads do not divide": (lambda tmp: ernie(tmp, ernie_config(num_attention_heads=5)), 1, "not divisible"),
    "malformed config": (lambda tmp: ernie(tmp, lambda s: (s / "ernie_config.json").write_text("[1,")), 1,
                         "not valid JSON"),
    "config is a FIFO": (lambda tmp: ernie(tmp, lambda s: fifo(s / "ernie_config.json")), 1, "not a regular file"),
    "truncated tensor": (lambda tmp: ernie(tmp, lambda s: truncate(s / "params" / "word_embedding")), 1,
                         "truncated"),
    "zero-byte tensor": (lambda tmp: ernie(tmp, lambda s: (s / "params" / "pooled_fc.b_0").write_bytes(b"")), 1,
                         "truncated"),
    "huge LoD block": (lambda tmp: ernie(tmp, lambda s: huge_lod_block(s / "params" / "pooled_fc.b_0")), 1,
                       "LoD block"),
    "integer tensor": (lambda tmp: ernie(tmp, lambda s: lod_tensor(s / "params" / "pooled_fc.b_0", [32], code=2)),
                       1, "int32 values"),
    "NaN tensor": (lambda tmp: ernie(tmp, lambda s: lod_tensor(s / "params" / "pooled_fc.b_0", [32],
                                                               data=[math.nan] * 32)), 1, "NaN or infinite"),
    "wrong dims": (lambda tmp: ernie(tmp, lambda s: lod_tensor(s / "params" / "pooled_fc.b_0", [31])), 1,
                   "has dims [31]"),
    "missing tensor": (lambda tmp: ernie(tmp, lambda s: (s / "params" / "pooled_fc.w_0").unlink()), 1,
                       "lacks 1 weight"),
    "negative layer norm eps": (lambda tmp: ernie(tmp, None, "--layer-norm-eps", "-1"), 2, "must be > 0"),
    "NaN layer norm eps": (lambda tmp: ernie(tmp, None, "--layer-norm-eps", "nan"), 2, "finite"),
    "code-running pdparams": (lambda tmp: ernie(tmp, lambda s: payload(s / "model_state.pdparams"),
                                                source=ERNIE_PADDLENLP), 1, "refusing to load"),
    "zero-byte pdparams": (lambda tmp: ernie(tmp, lambda s: (s / "model_state.pdparams").write_bytes(b""),
                                             source=ERNIE_PADDLENLP), 1, "truncated"),
    "paddlenlp config is /dev/zero": (lambda tmp: ernie(tmp, lambda s: to_dev_zero(s / "config.json"),
                                                        source=ERNIE_PADDLENLP), 1, "not a regular file"),
    "vocabulary not UTF-8": (lambda tmp: ernie(tmp, lambda s: (s / "vocab.txt").write_bytes(b"\xff\xfe[PAD]\n")), 1,
                             "not UTF-8"),
    "truncated reference": (lambda tmp: (truncated_copy(FIXTURES / "ernie2" / "tiny" / "reference.safetensors",
                                                        tmp / "r.safetensors"),
                                         ernie(tmp, None, "--reference", tmp / "r.safetensors"))[1], 1,
                          "not a readable safetensors file"),
    "reference of another model": (lambda tmp: ernie(tmp, None, "--reference", OPTIMUS / "reference.safetensors"),
                                   1, "lacks the tensor"),
    "reference beyond tolerance": (lambda tmp: ernie(
        tmp, None, "--reference", shifted(FIXTURES / "ernie2" / "tiny" / "reference.safetensors", tmp / "r.safetensors",
                                          "pooled_output")), 1,
        "pooled_output: max abs error 5 exceeds its tolerance (atol 0.0001, rtol 0.0001)"),
}


def export_linking_out(tmp, folder):
    folder = damaged_copy(folder, tmp, lambda f: (f / "vocab.txt").unlink(missing_ok=True))  # a fast tokenizer has none
    (folder / "vocab.txt").symlink_to(written(tmp / "id_rsa", "not a real key"))
    return ["export", "onnx", folder, tmp / "out"]


# the commands run on this model folder (a fixture of tests/ernie2/fixtures_ernie2.py)
COMMAND_FOLDER = "ernie_converted_folder"

COMMAND_CASES = {
    "ernie export of an unconverted release": (lambda tmp, folder: ["ernie2", "export", ERNIE_STATIC, tmp / "out"],
                                               2, "looks like an original ERNIE 2.0 checkpoint, not a model folder"),
    "ernie finetune of a folder with zero heads": (lambda tmp, folder: [
        "ernie2", "finetune", damaged_copy(folder, tmp, lambda f: edit_json(f / "config.json",
                                                                            num_attention_heads=0)),
        "--task", "MRPC", "--train-file", GLUE / "MRPC" / "train.tsv", "--output-dir", tmp / "out"], 1,
        "num_attention_heads must be a positive integer"),
    "ernie pretrain from a folder with a string size": (lambda tmp, folder: [
        "ernie2", "pretrain", damaged_copy(folder, tmp, lambda f: edit_json(f / "config.json", hidden_size="32")),
        "--documents", written(tmp / "docs.txt", "A sentence.\nAnother one.\n"), "--output-dir", tmp / "out"], 1,
        "hidden_size"),
    "ernie export of a missing folder": (lambda tmp, folder: ["ernie2", "export", tmp / "nothing", tmp / "out"],
                                         2, "argument model: no folder named"),
    "ernie finetune of a folder with its own code": (lambda tmp, folder: [
        "ernie2", "finetune", foreign_code(tmp), "--task", "MRPC", "--train-file", GLUE / "MRPC" / "train.tsv",
        "--output-dir", tmp / "out"], 1, "only with --trust-remote-code"),
    "alias bomb in a pre-training schedule": (lambda tmp, folder: [
        "ernie2", "pretrain", folder, "--stages", written(tmp / "stages.yml", "stages:\n  - steps: "
                                                          f"{{knowledge_masking: {alias_bomb()}}}\n"),
        "--documents", written(tmp / "docs.txt", "A sentence.\n"), "--output-dir", tmp / "out"], 1,
        "its aliases expand it by more than 100000 values (an alias bomb)"),
    "export a folder whose vocabulary links out of it": (export_linking_out, 1,
                                                         "is a link leading out of the folder"),
    # --device and --dtype (hf_ext.cli_utils.add_device_arguments)
    "finetune in float16 on the CPU": (lambda tmp, folder: [
        "ernie2", "finetune", folder, "--task", "MRPC", "--train-file", GLUE / "MRPC" / "train.tsv", "--output-dir",
        tmp / "out", "--device", "cpu", "--dtype", "float16"], 1, "--dtype float16 trains only on CUDA"),
    "pretrain on an unknown device": (lambda tmp, folder: [
        "ernie2", "pretrain", folder, "--documents", written(tmp / "docs.txt", "A sentence.\n"), "--output-dir",
        tmp / "out", "--device", "npu"], 2, "argument --device: expected cpu, cuda, cuda:N, mps or auto, got 'npu'"),
    "pretrain from a DeBERTa model": (lambda tmp, folder: [
        "ernie2", "pretrain", config_folder(tmp / "deberta", model_type="deberta-v2"), "--documents",
        written(tmp / "docs.txt", "A sentence.\nAnother one.\n"), "--output-dir", tmp / "out"], 1,
        "deberta-v2 model: its attention is not BERT's (relative or rotary positions)"),
    "pretrain from a RoBERTa without positions past its padding": (lambda tmp, folder: [
        "ernie2", "pretrain", config_folder(tmp / "roberta", model_type="roberta", pad_token_id=1,
                                            max_position_embeddings=2), "--documents",
        written(tmp / "docs.txt", "A sentence.\nAnother one.\n"), "--output-dir", tmp / "out"], 1,
        "its 2 positions leave none after the 2 that RoBERTa keeps for padding"),
    "streamed pretrain from a shard that is not JSON": (lambda tmp, folder: [
        "ernie2", "pretrain", folder, "--streaming", "--documents",
        written(empty_folder(tmp / "shards") / "shard-00.jsonl", '{"paragraphs": [["cut\n'), "--max-length", "32",
        "--output-dir", tmp / "out"], 1, "shard-00.jsonl, line 1: not JSON"),
    "pretrain from an ELECTRA with narrow embeddings": (lambda tmp, folder: [
        "ernie2", "pretrain", config_folder(tmp / "electra", model_type="electra", embedding_size=16,
                                            hidden_size=32, num_attention_heads=4), "--documents",
        written(tmp / "docs.txt", "A sentence.\nAnother one.\n"), "--output-dir", tmp / "out"], 1,
        "its embeddings (16) are narrower than its hidden states (32)"),
    "streamed pretrain from a folder without shards": (lambda tmp, folder: [
        "ernie2", "pretrain", folder, "--streaming", "--documents", empty_folder(tmp / "shards"), "--output-dir",
        tmp / "out"], 1, "shards holds no shards (*.jsonl, *.json, *.jsonl.gz, *.json.gz)"),
    "streamed pretrain from a glob matching no shard": (lambda tmp, folder: [
        "ernie2", "pretrain", folder, "--streaming", "--documents", tmp / "corpus" / "*.jsonl", "--output-dir",
        tmp / "out"], 1, "no documents shard matches"),
    "streamed pretrain from a Hub dataset while offline": (lambda tmp, folder: [
        "ernie2", "pretrain", folder, "--streaming", "--documents", "someone/corpus", "--output-dir", tmp / "out"],
        1, "documents someone/corpus is neither a local path nor a reachable Hub dataset"),
}


def config_folder(path, **config):
    """A model folder holding only a config.json: the pre-training command refuses it before loading weights."""
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    return path


def empty_folder(path):
    path.mkdir()
    return path
