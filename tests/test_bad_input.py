"""Bad input over every converter and command (issue #16): truncated, zero-byte, random and foreign checkpoints,
missing/extra keys, wrong shapes and dtypes, NaN weights, malformed configs, code-running pickles, bad references,
existing and special outputs, out-of-range arguments. Each case asserts the exit code, exactly one `hf-ext: error:`
line (the last on stderr) without a traceback, that nothing was written, and that no payload ran.

Signals, concurrent runs, output modes and interrupted checkpoint saves are tested after the table."""

import json
import math
import os
import pickle
import shutil
import signal
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from hf_ext.cli import main
from hf_ext.errors import HfExtError
from hf_ext.output import atomic_output_dir

REPO_ROOT = Path(__file__).resolve().parent.parent
FIXTURES = REPO_ROOT / "tests" / "fixtures"
OPTIMUS = FIXTURES / "optimus" / "tiny"
ERNIE_STATIC = FIXTURES / "ernie2" / "tiny" / "paddle_static"
ERNIE_PADDLENLP = FIXTURES / "ernie2" / "tiny" / "paddlenlp"
MTDNN = FIXTURES / "mtdnn" / "tiny"
UT = FIXTURES / "universal_transformer" / "tiny"
GLUE = REPO_ROOT / "tests" / "data" / "glue_samples"
ENCODER = "checkpoint-encoder-100"
DECODER = "checkpoint-decoder-100"

pytestmark = pytest.mark.usefixtures("one_thread")


class Payload:
    """Unpickling this runs a shell command that leaves a marker file: it must never run."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


# ----- input builders: each takes the case's folder and returns the path it made ---------------------------------

def copy(source, tmp, name="src"):
    target = tmp / name
    shutil.copytree(source, target)
    return target


def edit_json(path, **changes):
    document = json.loads(path.read_text())
    target = document.get("constructor_kwargs", document)
    target.update(changes)
    path.write_text(json.dumps(document))


def payload(path):
    path.write_bytes(pickle.dumps(Payload(path.parent / "PAYLOAD_RAN"), protocol=2))


def truncate(path, keep=0.5):
    data = path.read_bytes()
    path.write_bytes(data[:int(len(data) * keep)])


def random_bytes(path, size=4096):
    path.write_bytes(np.random.default_rng(0).bytes(size))


def edit_state(path, change):
    state = torch.load(path, weights_only=True)
    change(state)
    torch.save(state, path)


def written(path, text):
    path.write_text(text)
    return path


def truncated_copy(source, target):
    shutil.copy(source, target)
    truncate(target)


def nan_logits(source, target):
    """A copy of a reference whose logits are NaN."""
    tensors = load_file(str(source))
    save_file({name: tensor.fill_(math.nan) if name.endswith("logits") else tensor
               for name, tensor in tensors.items()}, str(target))


def changed(source, target, name, change):
    """A copy of a reference whose tensor `name` is `change(tensor)`."""
    tensors = load_file(str(source))
    tensors[name] = change(tensors[name]).contiguous()
    save_file(tensors, str(target))
    return target


def shifted(source, target, name, by=5.0):
    """A copy of a reference whose tensor `name` is moved by `by` (a conversion no longer reproduces it)."""
    return changed(source, target, name, lambda tensor: tensor + by)


def lod_tensor(path, dims, code=5, data=None):
    """A Paddle LoDTensor file (no LoD levels) of `dims` with dtype `code` (5 = float32)."""
    desc = bytes([0x08, code]) + b"".join(bytes([0x10, d]) for d in dims)
    dtype = {5: np.float32, 2: np.int32}[code]
    values = np.zeros(dims, dtype) if data is None else np.asarray(data, dtype).reshape(dims)
    path.write_bytes(struct.pack("<IQIi", 0, 0, 0, len(desc)) + desc + values.tobytes())


# ----- Optimus -----------------------------------------------------------------------------------------------------

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


def drop_key(state, name):
    del state[name]


def fifo(path):
    path.unlink()
    os.mkfifo(path)


def to_dev_zero(path):
    path.unlink()
    path.symlink_to("/dev/zero")


OPTIMUS_CASES = {
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


# ----- ERNIE 2.0 ---------------------------------------------------------------------------------------------------

def ernie(tmp, change=None, *extra, source=ERNIE_STATIC):
    src = copy(source, tmp)
    if change is not None:
        change(src)
    return ["convert", "ernie2", src, tmp / "out", *extra]


def ernie_config(**changes):
    return lambda src: edit_json(src / "ernie_config.json", **changes)


def huge_lod_block(path):
    path.write_bytes(struct.pack("<IQQ", 0, 1, 1 << 62) + b"\0" * 64)


ERNIE_CASES = {
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


def alias_bomb(levels=6, width=9):
    """A YAML flow list of nested aliases: `levels` anchors, each `width` aliases of the one before (9 ** 6 strings in
    a few hundred bytes)."""
    anchors = ["&a0 [" + ", ".join(["lol"] * width) + "]"]
    anchors += [f"&a{level} [" + ", ".join([f"*a{level - 1}"] * width) + "]" for level in range(1, levels)]
    return "[" + ", ".join(anchors) + "]"


# ----- MT-DNN ------------------------------------------------------------------------------------------------------

def mtdnn_checkpoint(tmp, change_state=None, **options):
    """The fixture's checkpoint with the task definitions left out (converted with --task-def) and `options`."""
    from hf_ext.models.mtdnn.conversion import read_checkpoint

    state, opt = read_checkpoint(MTDNN / "model_0.pt")
    opt = {key: value for key, value in opt.items() if key != "task_def_list"} | options
    if change_state is not None:
        change_state(state)
    torch.save({"state": state, "config": opt}, tmp / "model.pt")
    return ["convert", "mtdnn", tmp / "model.pt", tmp / "out", "--task-def", MTDNN / "task_def.yml"]


def mtdnn(tmp, *extra):
    return ["convert", "mtdnn", MTDNN / "model_0.pt", tmp / "out", *extra]


def mtdnn_file(make):
    def build(tmp):
        make(tmp / "model.pt")
        return ["convert", "mtdnn", tmp / "model.pt", tmp / "out"]
    return build


MTDNN_CASES = {
    "missing checkpoint": (lambda tmp: ["convert", "mtdnn", tmp / "model.pt", tmp / "out"], 1, "does not exist"),
    "zero-byte checkpoint": (mtdnn_file(lambda p: p.write_bytes(b"")), 1, "is empty"),
    "truncated checkpoint": (mtdnn_file(lambda p: (shutil.copy(MTDNN / "model_0.pt", p), truncate(p))), 1,
                             "truncated or corrupt"),
    "random checkpoint": (mtdnn_file(lambda p: random_bytes(p)), 1, "not a torch checkpoint"),
    "code-running checkpoint": (mtdnn_file(payload), 1, "refusing to load"),
    "foreign checkpoint": (mtdnn_file(lambda p: shutil.copy(UT / "state_dict.pt", p)), 1,
                           "not an MT-DNN checkpoint"),
    "string size": (lambda tmp: mtdnn_checkpoint(tmp, hidden_size="32"), 1, "invalid BERT settings"),
    "boolean size": (lambda tmp: mtdnn_checkpoint(tmp, num_hidden_layers=True), 1, "invalid BERT settings"),
    "zero attention heads": (lambda tmp: mtdnn_checkpoint(tmp, num_attention_heads=0), 1,
                             "num_attention_heads must be a positive integer"),
    "negative layers": (lambda tmp: mtdnn_checkpoint(tmp, num_hidden_layers=-1), 1,
                        "num_hidden_layers must be a positive integer"),
    "NaN weights": (lambda tmp: mtdnn_checkpoint(
        tmp, lambda st: st["bert.embeddings.LayerNorm.weight"].fill_(math.nan)), 1, "NaN or infinite"),
    "integer weights": (lambda tmp: mtdnn_checkpoint(
        tmp, lambda st: st.update({"bert.embeddings.LayerNorm.bias": st["bert.embeddings.LayerNorm.bias"].long()})),
                        1, "int64 values"),
    "malformed task definitions": (lambda tmp: ((tmp / "t.yml").write_text("mnli: [\n"),
                                                mtdnn(tmp, "--task-def", tmp / "t.yml"))[1], 1, "malformed"),
    "alias bomb in the task definitions": (lambda tmp: (written(tmp / "t.yml", "sst:\n  task_type: Classification\n"
                                                                f"  n_class: 2\n  labels: {alias_bomb()}\n"),
                                                        mtdnn(tmp, "--task-def", tmp / "t.yml"))[1], 1,
                                           "its aliases expand it by more than 100000 values (an alias bomb)"),
    "corrupt reference": (lambda tmp: (random_bytes(tmp / "r.safetensors"),
                                       mtdnn(tmp, "--reference", tmp / "r.safetensors"))[1], 1,
                          "not a readable safetensors file"),
    "reference of another model": (lambda tmp: mtdnn(tmp, "--reference", OPTIMUS / "reference.safetensors"), 1,
                                   "holds none of the outputs"),
    "NaN in the reference": (lambda tmp: (nan_logits(MTDNN / "reference.safetensors", tmp / "r.safetensors"),
                                          mtdnn(tmp, "--reference", tmp / "r.safetensors"))[1], 1,
                          "cola logits holds NaN values"),
    "reference beyond tolerance": (lambda tmp: mtdnn(
        tmp, "--reference", shifted(MTDNN / "reference.safetensors", tmp / "r.safetensors", "cola.logits")), 1,
        "cola logits: max abs error 5 exceeds its tolerance (atol 5e-05, rtol 0.0001)"),
    "bad group size": (lambda tmp: mtdnn(tmp, "--group-size", "qnnli=x"), 2, "expected TASK=K"),
}


# ----- Universal Transformer ---------------------------------------------------------------------------------------

def ut(tmp, change=None, *extra):
    src = copy(UT, tmp)
    if change is not None:
        change(src)
    return ["convert", "universal-transformer", src, tmp / "out", *extra]


def ut_config(**changes):
    return lambda src: edit_json(src / "config.json", **changes)


UT_CASES = {
    "zero heads": (lambda tmp: ut(tmp, ut_config(num_heads=0)), 1, "bad model arguments"),
    "string size": (lambda tmp: ut(tmp, ut_config(hidden_size="32", embedding_size="32")), 1,
                    "bad model arguments"),
    "code-running state dict": (lambda tmp: ut(tmp, lambda s: payload(s / "state_dict.pt")), 1, "refusing to load"),
    "truncated state dict": (lambda tmp: ut(tmp, lambda s: truncate(s / "state_dict.pt")), 1, "truncated"),
    "missing state dict": (lambda tmp: ut(tmp, lambda s: (s / "state_dict.pt").unlink()), 1, "does not exist"),
    "NaN weights": (lambda tmp: ut(tmp, lambda s: edit_state(s / "state_dict.pt",
                                                             lambda st: st["W.bias"].fill_(math.nan))), 1,
                    "NaN or infinite"),
    "config is a FIFO": (lambda tmp: ut(tmp, lambda s: fifo(s / "config.json")), 1, "not a regular file"),
    "config is /dev/zero": (lambda tmp: ut(tmp, lambda s: to_dev_zero(s / "config.json")), 1, "not a regular file"),
    "corrupt reference": (lambda tmp: (random_bytes(tmp / "r.safetensors"),
                                       ut(tmp, None, "--reference", tmp / "r.safetensors"))[1], 1,
                          "not a readable safetensors file"),
    "reference of another model": (lambda tmp: ut(tmp, None, "--reference", OPTIMUS / "reference.safetensors"), 1,
                                   "lacks the tensor"),
    "reference beyond tolerance": (lambda tmp: ut(
        tmp, None, "--reference", shifted(UT / "reference.safetensors", tmp / "r.safetensors", "act_logits")), 1,
        "act_logits: max abs error 5 exceeds its tolerance (atol 0.0001, rtol 0.0001)"),
    "halting steps off by one": (lambda tmp: ut(
        tmp, None, "--reference", shifted(UT / "reference.safetensors", tmp / "r.safetensors", "act_n_updates", 1.0)),
        1, "act_n_updates: max abs error 1 exceeds its tolerance (exact)"),
    "reference of another shape": (lambda tmp: ut(tmp, None, "--reference", changed(
        UT / "reference.safetensors", tmp / "r.safetensors", "act_logits", lambda logits: logits[:, :-1])), 1,
        "act_logits has shape [2, 23], the converted model gives [2, 24]"),
    "infinite reference": (lambda tmp: ut(tmp, None, "--reference", changed(
        UT / "reference.safetensors", tmp / "r.safetensors", "act_ponder_cost", lambda cost: cost + math.inf)), 1,
        "act_ponder_cost holds infinite values"),
}


# ----- every output ------------------------------------------------------------------------------------------------

def existing_output(tmp):
    argv = ut(tmp)
    (tmp / "out").mkdir()
    (tmp / "out" / "keep").write_text("mine")
    return argv


def dangling_output(tmp):
    argv = ut(tmp)
    (tmp / "out").symlink_to(tmp / "nowhere")
    return argv


OUTPUT_CASES = {
    "existing output": (existing_output, 1, "already exists"),
    "dangling symlink output": (dangling_output, 1, "dangling symbolic link"),
    "output under a file": (lambda tmp: ((tmp / "file").write_text(""),
                                         ["convert", "universal-transformer", UT, tmp / "file" / "out"])[1], 1,
                            "is a file"),
    "non-UTF-8 output": (lambda tmp: ["convert", "universal-transformer", UT,
                                      os.fsdecode(bytes(tmp / "out") + b"\xff")], 2, "not valid UTF-8"),
}


# ----- commands on converted folders -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def ernie_folder(tmp_path_factory):
    from hf_ext.models.ernie2.conversion import convert_ernie2_checkpoint

    folder = tmp_path_factory.mktemp("bad_input_ernie") / "converted"
    convert_ernie2_checkpoint(ERNIE_STATIC, folder)
    return folder


def damaged_copy(folder, tmp, change):
    target = copy(folder, tmp, "model")
    change(target)
    return target


COMMAND_CASES = {
    "top-p above 1": (lambda tmp, m: ["optimus", "sample", m["optimus"], "--sample", "--top-p", "2"], 2,
                      "--top-p: must be in (0, 1]"),
    "zero temperature": (lambda tmp, m: ["optimus", "sample", m["optimus"], "--sample", "--temperature", "0"], 2,
                         "--temperature: must be > 0"),
    "tokens beyond the decoder's positions": (
        lambda tmp, m: ["optimus", "reconstruct", m["optimus"], "a dog", "--max-new-tokens", "500"], 1,
        "exceeds what the decoder's 64 positions allow"),
    "zero samples": (lambda tmp, m: ["optimus", "sample", m["optimus"], "--num", "0"], 2,
                     "argument --num: must be at least 1"),
    "infinite beta": (lambda tmp, m: ["optimus", "train", m["optimus"], "--train-file", tmp / "t.txt",
                                      "--output-dir", tmp / "out", "--beta", "inf"], 2, "--beta: expected a finite"),
    "negative beta": (lambda tmp, m: ["optimus", "train", m["optimus"], "--train-file", tmp / "t.txt",
                                      "--output-dir", tmp / "out", "--beta", "-1"], 2, "--beta: must be >= 0"),
    "training output exists": (lambda tmp, m: ((tmp / "out").mkdir(), (tmp / "t.txt").write_text("a\n"),
                                               ["optimus", "train", m["optimus"], "--train-file", tmp / "t.txt",
                                                "--output-dir", tmp / "out"])[2], 1, "already exists"),
    "truncated model.safetensors": (lambda tmp, m: ["optimus", "encode", damaged_copy(
        m["optimus"], tmp, lambda f: truncate(f / "model.safetensors")), "a dog"], 1,
        "safetensors weights are corrupt or truncated"),
    "model config with zero heads": (lambda tmp, m: ["optimus", "encode", damaged_copy(
        m["optimus"], tmp, lambda f: edit_json(f / "config.json", decoder={
            **json.loads((f / "config.json").read_text())["decoder"], "n_head": 0})), "a dog"], 1,
        "n_head must be a positive integer"),
    "model config is a FIFO": (lambda tmp, m: ["optimus", "encode", damaged_copy(
        m["optimus"], tmp, lambda f: fifo(f / "config.json")), "a dog"], 1, "config.json"),
    "halting map of a huge input": (lambda tmp, m: ["universal-transformer", "halting-map", m["ut"], "1" * 5000,
                                                    tmp / "out.png"], 1, "a halting map takes at most 512"),
    "ernie finetune of a folder with zero heads": (lambda tmp, m: [
        "ernie2", "finetune", damaged_copy(m["ernie"], tmp, lambda f: edit_json(f / "config.json",
                                                                                num_attention_heads=0)),
        "--task", "MRPC", "--train-file", GLUE / "MRPC" / "train.tsv", "--output-dir", tmp / "out"], 1,
        "num_attention_heads must be a positive integer"),
    "ernie pretrain from a folder with a string size": (lambda tmp, m: [
        "ernie2", "pretrain", damaged_copy(m["ernie"], tmp, lambda f: edit_json(f / "config.json", hidden_size="32")),
        "--documents", written(tmp / "docs.txt", "A sentence.\nAnother one.\n"), "--output-dir", tmp / "out"], 1,
        "hidden_size"),
    "ernie export of a missing folder": (lambda tmp, m: ["ernie2", "export", tmp / "nothing", tmp / "out"], 1,
                                         "cannot load a model config"),
    "mtdnn train with a bad warmup": (lambda tmp, m: ["mtdnn", "train", m["optimus"], "--train", "a=b.tsv",
                                                      "--output-dir", tmp / "out", "--warmup", "2"], 2,
                                      "argument --warmup: must be in [0, 1)"),
}

# ----- security (docs/security.md): remote code, what push publishes, tokens -------------------------------------

TOKEN = "hf_" + "Ab1" * 11 + "Z"  # shaped like a Hub token


def foreign_code(tmp):
    """A folder whose config needs its own code (`auto_map`), which would leave PAYLOAD_RAN if it ran."""
    folder = tmp / "foreign"
    folder.mkdir()
    (folder / "configuration_foreign.py").write_text(
        f"from pathlib import Path\nPath({str(tmp / 'PAYLOAD_RAN')!r}).touch()\n")
    (folder / "config.json").write_text(json.dumps({"model_type": "foreign-net", "auto_map": {
        "AutoConfig": "configuration_foreign.ForeignConfig", "AutoModel": "modeling_foreign.ForeignModel"}}))
    return folder


def folder_with(tmp, name, make):
    """A model folder (a config.json) holding `name`, made by `make(path)`."""
    folder = tmp / "model"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text("{}")
    make(folder / name)
    return folder


def link_to_a_key(tmp):
    return lambda path: path.symlink_to(written(tmp / "id_rsa", "not a real key"))


def export_linking_out(tmp, m):
    folder = damaged_copy(m["ernie"], tmp, lambda f: (f / "vocab.txt").unlink())
    (folder / "vocab.txt").symlink_to(written(tmp / "id_rsa", "not a real key"))
    return ["export", "onnx", folder, tmp / "out"]


SECURITY_CASES = {
    "optimus encode of a folder with its own code": (
        lambda tmp, m: ["optimus", "encode", foreign_code(tmp), "a dog"], 1, "only with --trust-remote-code"),
    "halting map of a folder with its own code": (
        lambda tmp, m: ["universal-transformer", "halting-map", foreign_code(tmp), "1", tmp / "out.png"], 1,
        "only with --trust-remote-code"),
    "serve a folder with its own code": (lambda tmp, m: ["serve", foreign_code(tmp)], 1,
                                         "only with --trust-remote-code"),
    "export a folder with its own code": (lambda tmp, m: ["export", "onnx", foreign_code(tmp), tmp / "out"], 1,
                                          "only with --trust-remote-code"),
    "ernie finetune of a folder with its own code": (lambda tmp, m: [
        "ernie2", "finetune", foreign_code(tmp), "--task", "MRPC", "--train-file", GLUE / "MRPC" / "train.tsv",
        "--output-dir", tmp / "out"], 1, "only with --trust-remote-code"),
    "mtdnn train from a folder with its own code": (lambda tmp, m: [
        "mtdnn", "train", foreign_code(tmp), "--train", "a=b.tsv", "--output-dir", tmp / "out"], 1,
        "only with --trust-remote-code"),
    "push a link leading out of the folder": (
        lambda tmp, m: ["push", folder_with(tmp, "notes.txt", link_to_a_key(tmp)), "org/model"], 1,
        "notes.txt (a link leading out of the folder)"),
    "push a hidden file": (lambda tmp, m: ["push", folder_with(tmp, ".env", lambda p: p.write_text("HF_TOKEN=x")),
                                           "org/model"], 1, ".env (hidden)"),
    "push a FIFO": (lambda tmp, m: ["push", folder_with(tmp, "pipe", os.mkfifo), "org/model"], 1,
                    "pipe (not a regular file)"),
    "export a folder whose vocabulary links out of it": (export_linking_out, 1, "is a link leading out of the folder"),
    "token with a line ending": (lambda tmp, m: ["push", tmp, "org/model", "--token", TOKEN + "\r\n"], 2,
                                 "argument --token: the token holds whitespace or a control character"),
    "token of a converter with a line ending": (lambda tmp, m: [
        "convert", "universal-transformer", UT, tmp / "out", "--push-to-hub", "org/model", "--token", TOKEN + "\r"],
        2, "argument --token: the token holds whitespace or a control character"),
    "mistyped token option": (lambda tmp, m: ["push", tmp, "org/model", "--tokn", TOKEN], 2,
                              "unrecognized arguments: --tokn hf_***"),
    "alias bomb in a pre-training schedule": (lambda tmp, m: [
        "ernie2", "pretrain", m["ernie"], "--stages", written(tmp / "stages.yml", "stages:\n  - steps: "
                                                              f"{{knowledge_masking: {alias_bomb()}}}\n"),
        "--documents", written(tmp / "docs.txt", "A sentence.\n"), "--output-dir", tmp / "out"], 1,
        "its aliases expand it by more than 100000 values (an alias bomb)"),
}
COMMAND_CASES.update(SECURITY_CASES)

CASES = [pytest.param(build, code, message, id=f"{group}: {name}")
         for group, cases in (("optimus", OPTIMUS_CASES), ("ernie2", ERNIE_CASES), ("mtdnn", MTDNN_CASES),
                              ("universal-transformer", UT_CASES), ("output", OUTPUT_CASES))
         for name, (build, code, message) in cases.items()]


def run(argv, capsys):
    capsys.readouterr()
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exit_:  # argparse usage errors
        code = exit_.code
    return code, capsys.readouterr().err


def assert_refused(tmp, code, err, expected_code, message):
    lines = err.strip().splitlines()
    errors = [line for line in lines if line.startswith("hf-ext: error:")]
    assert code == expected_code, err
    assert "Traceback" not in err and len(errors) == 1 and lines[-1] == errors[0], err
    assert message in errors[0], errors[0]
    if (tmp / "out").exists() or (tmp / "out").is_symlink():  # an existing output stays as it was
        assert not (tmp / "out").exists() or sorted(p.name for p in (tmp / "out").iterdir()) in ([], ["keep"])
    assert not list(tmp.glob(".out.*")), "a staging folder survived"
    assert not list(tmp.rglob("PAYLOAD_RAN")), "a pickle payload ran"


@pytest.mark.parametrize("build, expected_code, message", CASES)
def test_bad_conversion_input_gives_one_line_and_writes_nothing(build, expected_code, message, tmp_path, capsys,
                                                                monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    argv = build(tmp_path)
    code, err = run(argv, capsys)
    assert_refused(tmp_path, code, err, expected_code, message)
    assert not (tmp_path / "out").exists() or (tmp_path / "out" / "keep").is_file()


@pytest.mark.parametrize("build, expected_code, message",
                         [pytest.param(*case, id=name) for name, case in COMMAND_CASES.items()])
def test_bad_command_input_gives_one_line_and_writes_nothing(build, expected_code, message, tmp_path, capsys,
                                                             monkeypatch, optimus_sample_folder,
                                                             algorithmic_seq2seq_folder, ernie_folder):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    argv = build(tmp_path, {"optimus": optimus_sample_folder, "ut": algorithmic_seq2seq_folder,
                            "ernie": ernie_folder})
    code, err = run(argv, capsys)
    assert_refused(tmp_path, code, err, expected_code, message)
    assert not (tmp_path / "out.png").exists()
    assert TOKEN not in err


def test_an_unexpected_exception_is_one_line_and_a_traceback_with_hf_ext_debug(capsys, monkeypatch):
    import argparse

    from hf_ext.cli import execute

    def divide(args):
        return 1 // 0

    assert execute(argparse.Namespace(handler=divide, command="x"), "hf-ext") == 1
    assert capsys.readouterr().err == "hf-ext: error: ZeroDivisionError: integer division or modulo by zero\n"
    monkeypatch.setenv("HF_EXT_DEBUG", "1")
    with pytest.raises(ZeroDivisionError):
        execute(argparse.Namespace(handler=divide, command="x"), "hf-ext")


def test_the_table_covers_at_least_sixty_cases():
    assert len(CASES) + len(COMMAND_CASES) >= 60


# ----- signals, concurrent runs, modes -----------------------------------------------------------------------------

SLOW_WRITER = """
import argparse, signal, sys, time
from transformers.utils import logging
from hf_ext.cli import execute
from hf_ext.output import atomic_output_dir

def write_slowly(args):
    with atomic_output_dir(args.out) as staging:
        (staging / "model.safetensors").write_bytes(bytes(1 << 20))
        logging.get_logger("hf_ext.slow_writer").info('{"step": 1, "loss": 2.5}')
        print("ready", flush=True)
        time.sleep(120)

# Ctrl-C as in a foreground shell: a job started in the background inherits SIGINT ignored (CI runners may do that)
signal.signal(signal.SIGINT, signal.default_int_handler)
sys.exit(execute(argparse.Namespace(handler=write_slowly, out=sys.argv[1], command="convert"), "hf-ext"))
"""


def start_slow_writer(out):
    process = subprocess.Popen([sys.executable, "-c", SLOW_WRITER, str(out)], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert process.stdout.readline() == "ready\n", process.stderr.read()
    return process


@pytest.mark.parametrize("sent, code, message", [(signal.SIGTERM, 143, "terminated (SIGTERM)"),
                                                  (signal.SIGINT, 130, "interrupted")])
def test_a_signal_during_a_save_removes_the_staging_folder(tmp_path, sent, code, message):
    process = start_slow_writer(tmp_path / "out")
    assert len(list(tmp_path.glob(".out.partial-*"))) == 1
    process.send_signal(sent)
    assert process.wait(timeout=60) == code
    lines = process.stderr.read().splitlines()
    assert lines[-2:] == ['{"step": 1, "loss": 2.5}', f"hf-ext: error: {message}"]  # each on a line of its own
    assert list(tmp_path.iterdir()) == []


def stop(process):
    process.kill()
    process.wait(timeout=60)
    process.stdout.close()
    process.stderr.close()


def test_a_later_run_removes_the_staging_folder_of_a_killed_one_whatever_its_output(tmp_path):
    alive = start_slow_writer(tmp_path / "other")  # a run in progress in the same folder keeps its staging folder
    try:
        stop(start_slow_writer(tmp_path / "out1"))  # SIGKILL cannot be handled: the staging folder stays behind
        left = list(tmp_path.glob(".out1.partial-*"))
        assert len(left) == 1
        with atomic_output_dir(tmp_path / "out2") as staging:  # another output in the same folder
            (staging / "done").write_text("")
        assert not left[0].exists() and (tmp_path / "out2" / "done").is_file()
        assert len(list(tmp_path.glob(".other.partial-*"))) == 1
    finally:
        stop(alive)


@pytest.mark.parametrize("empty", [True, False])
def test_a_run_never_replaces_an_output_another_run_committed_meanwhile(tmp_path, empty):
    out = tmp_path / "out"
    with pytest.raises(HfExtError, match="was created by someone else while this run worked"):
        with atomic_output_dir(out) as staging:
            (staging / "model.safetensors").write_text("second")
            out.mkdir()  # the other run commits first (an empty folder would be replaced by a plain rename)
            if not empty:
                (out / "model.safetensors").write_text("first")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert [p.read_text() for p in out.iterdir()] == ([] if empty else ["first"])
    with atomic_output_dir(out, overwrite=True) as staging:  # --overwrite keeps its meaning
        (staging / "model.safetensors").write_text("third")
    assert (out / "model.safetensors").read_text() == "third" and sorted(p.name for p in tmp_path.iterdir()) == ["out"]


@pytest.mark.parametrize("umask, folder_mode, file_mode", [(0o022, 0o755, 0o644), (0o077, 0o700, 0o600)])
def test_converted_folders_follow_the_umask(tmp_path, capsys, umask, folder_mode, file_mode):
    previous = os.umask(umask)
    try:
        code, err = run(["convert", "universal-transformer", UT, tmp_path / "out"], capsys)
    finally:
        os.umask(previous)
    assert code == 0, err
    out = tmp_path / "out"
    assert out.stat().st_mode & 0o777 == folder_mode
    assert {p.name: p.stat().st_mode & 0o777 for p in out.iterdir()} == \
        {p.name: file_mode for p in out.iterdir()}


def test_an_output_moved_aside_by_a_killed_overwrite_is_put_back(tmp_path):
    import socket

    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = int(finished.stdout)  # a process that has ended
    aside = tmp_path / f".out.old-{socket.gethostname()}-{dead}-abc123" / "out"
    aside.mkdir(parents=True)
    (aside / "model.safetensors").write_text("previous")
    partial = tmp_path / f".out.partial-{socket.gethostname()}-{dead}-def456"
    partial.mkdir()
    with atomic_output_dir(tmp_path / "another") as staging:  # any later run writing into the folder
        (staging / "model.safetensors").write_text("new")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["another", "out"]
    assert (tmp_path / "out" / "model.safetensors").read_text() == "previous"
