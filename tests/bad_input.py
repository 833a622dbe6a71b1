"""What the bad-input tables share (`tests/test_bad_input.py` runs them; each model's own cases are in
`tests/<model>/bad_input_<model>.py`): the fixtures' paths, builders of damaged inputs, running a command in-process
and the checks every refusal must pass."""

import json
import math
import os
import pickle
import shutil
import socket
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from hf_ext.cli import main

REPO_ROOT = Path(__file__).resolve().parent.parent
FIXTURES = REPO_ROOT / "tests" / "fixtures"
OPTIMUS = FIXTURES / "optimus" / "tiny"
ERNIE_STATIC = FIXTURES / "ernie2" / "tiny" / "paddle_static"
ERNIE_PADDLENLP = FIXTURES / "ernie2" / "tiny" / "paddlenlp"
MTDNN = FIXTURES / "mtdnn" / "tiny"
UT = FIXTURES / "universal_transformer" / "tiny"
GLUE = REPO_ROOT / "tests" / "data" / "glue_samples"


class Payload:
    """Unpickling this runs a shell command that leaves a marker file: it must never run."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def without_cuda(cases: dict) -> dict:
    """`cases` where torch finds no CUDA device (`--device cuda` refused), none where it does."""
    return {} if torch.cuda.is_available() else cases


# what `without_module` and `under_accelerate_fsdp` change until the case's run ends (tests/test_bad_input.py undoes it)
CASE_PATCHES = pytest.MonkeyPatch()


def under_accelerate_fsdp(argv: list) -> list:
    """`argv`, run as `accelerate launch` with FSDP runs it: with the environment flag from which accelerate builds
    its FSDP plugin."""
    CASE_PATCHES.setenv("ACCELERATE_USE_FSDP", "true")
    return argv


def without_module(module: str, argv: list) -> list:
    """`argv`, to be run as if `module` were not installed (`import module` raises ImportError)."""
    CASE_PATCHES.setitem(sys.modules, module, None)
    return argv


# listening sockets that hold their ports in use until the test process ends
HELD_SOCKETS: list[socket.socket] = []


def port_in_use() -> int:
    """A local port something is listening on."""
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    HELD_SOCKETS.append(taken)
    return taken.getsockname()[1]


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


def alias_bomb(levels=6, width=9):
    """A YAML flow list of nested aliases: `levels` anchors, each `width` aliases of the one before (9 ** 6 strings in
    a few hundred bytes)."""
    anchors = ["&a0 [" + ", ".join(["lol"] * width) + "]"]
    anchors += [f"&a{level} [" + ", ".join([f"*a{level - 1}"] * width) + "]" for level in range(1, levels)]
    return "[" + ", ".join(anchors) + "]"


TOKEN = "hf_" + "Ab1" * 11 + "Z"  # shaped like a Hub token: no error line may show it


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


def drop_key(state, name):
    del state[name]


def fifo(path):
    path.unlink()
    os.mkfifo(path)


def to_dev_zero(path):
    path.unlink()
    path.symlink_to("/dev/zero")


def damaged_copy(folder, tmp, change):
    target = copy(folder, tmp, "model")
    change(target)
    return target


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


def table_problems(entries: list, modules: list) -> list[str]:
    """The models of `entries` (`MODELS`) without their table, `tests/<model>/bad_input_<model>.py` among `modules`,
    and tables without conversion cases."""
    names = {module.__name__ for module in modules}
    problems = [f"{entry.name} has no tests/{entry.name}/bad_input_{entry.name}.py" for entry in entries
                if f"bad_input_{entry.name}" not in names]
    return problems + [f"{module.__name__} has no CONVERSION_CASES" for module in modules
                       if not getattr(module, "CONVERSION_CASES", None)]
