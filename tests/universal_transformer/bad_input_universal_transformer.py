"""Bad input for the Universal Transformer's converter and commands: the cases `tests/test_bad_input.py` runs (see
`tests/bad_input.py` for the builders and the checks)."""

import math

from bad_input import (
    OPTIMUS,
    UT,
    changed,
    copy,
    edit_json,
    edit_state,
    fifo,
    foreign_code,
    payload,
    random_bytes,
    shifted,
    to_dev_zero,
    truncate,
    without_cuda,
)


def ut(tmp, change=None, *extra):
    src = copy(UT, tmp)
    if change is not None:
        change(src)
    return ["convert", "universal-transformer", src, tmp / "out", *extra]


def ut_config(**changes):
    return lambda src: edit_json(src / "config.json", **changes)


CONVERSION_CASES = {
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


# the commands run on this model folder (a fixture of tests/universal_transformer/fixtures_universal_transformer.py)
COMMAND_FOLDER = "algorithmic_seq2seq_folder"

COMMAND_CASES = {
    "halting map of an unconverted checkpoint": (lambda tmp, folder: [
        "universal-transformer", "halting-map", UT, "1", tmp / "out.png"], 2,
        "looks like an original Universal Transformer checkpoint, not a model folder: convert it first"),
    "halting map of a huge input": (lambda tmp, folder: ["universal-transformer", "halting-map", folder, "1" * 5000,
                                                         tmp / "out.png"], 1, "a halting map takes at most 512"),
    "halting map of a folder with its own code": (lambda tmp, folder: [
        "universal-transformer", "halting-map", foreign_code(tmp), "1", tmp / "out.png"], 1,
        "only with --trust-remote-code"),
    # --device and --dtype (hf_ext.cli_utils.add_device_arguments); `--device cuda` only where there is no CUDA
    **without_cuda({"halting map with --device cuda on a machine without CUDA": (
        lambda tmp, folder: ["universal-transformer", "halting-map", folder, "1", tmp / "out.png", "--device",
                             "cuda"], 2, "argument --device: cuda: CUDA is not available on this machine")}),
    "train-algorithmic in float16 on the CPU": (
        lambda tmp, folder: ["universal-transformer", "train-algorithmic", "--task", "copy", "--output-dir",
                             tmp / "out", "--device", "cpu", "--dtype", "float16"], 1,
        "--dtype float16 trains only on CUDA"),
}
