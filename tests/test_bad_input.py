"""Bad input over every converter and command (issue #16): truncated, zero-byte, random and foreign checkpoints,
missing/extra keys, wrong shapes and dtypes, NaN weights, malformed configs, code-running pickles, bad references,
existing and special outputs, out-of-range arguments. Each case asserts the exit code, exactly one `hf-ext: error:`
line (the last on stderr) without a traceback, that nothing was written, and that no payload ran.

The cases of each model are in its test folder (`tests/<model>/bad_input_<model>.py`: `CONVERSION_CASES`, and
`COMMAND_CASES` run on the model folder its `COMMAND_FOLDER` fixture gives), the builders and checks they share in
`tests/bad_input.py`; the cases of the outputs every converter writes are here. Signals, concurrent runs, output modes
and interrupted checkpoint saves are tested after the table."""

import os
import signal
import subprocess
import sys

import pytest
from bad_input import (
    CASE_PATCHES,
    REPO_ROOT,
    TOKEN,
    UT,
    assert_refused,
    copy,
    folder_with,
    foreign_code,
    link_to_a_key,
    run,
    table_problems,
    without_cuda,
    written,
)
from conftest import PROCESS_TIMEOUT, model_test_modules

from hf_ext.errors import HfExtError
from hf_ext.output import atomic_output_dir

MODEL_CASES = model_test_modules("bad_input")


# ----- every output ------------------------------------------------------------------------------------------------

def conversion(tmp, out):
    """A conversion of a valid checkpoint (the smallest fixture) into `out`."""
    return ["convert", "universal-transformer", copy(UT, tmp), out]


def existing_output(tmp):
    argv = conversion(tmp, tmp / "out")
    (tmp / "out").mkdir()
    (tmp / "out" / "keep").write_text("mine")
    return argv


def dangling_output(tmp):
    argv = conversion(tmp, tmp / "out")
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

# ----- a MODEL argument that names no folder (hf_ext.cli_utils.model_source) ------------------------------------

PATH_CASES = {
    "a path that names no folder": (lambda tmp: ["export", "onnx", tmp / "nothing", tmp / "out"], 2,
                                    "argument model: no folder named"),
    "a file given as the model": (lambda tmp: ["export", "onnx", written(tmp / "model.txt", "x"), tmp / "out"], 2,
                                  "model.txt is a file, not a model folder"),
}

# ----- hf-ext export onnx --quantize: the schemes are int8, int4 and int8-dynamic ---------------------------------

EXPORT_CASES = {
    "export with an unknown quantization": (lambda tmp: ["export", "onnx", tmp, tmp / "out", "--quantize", "int3"], 2,
                                            "argument --quantize: invalid choice: 'int3' (choose from 'int8', "
                                            "'int4', 'int8-dynamic')"),
}

# ----- security (docs/security.md): remote code, what push publishes, tokens -------------------------------------

SECURITY_CASES = {
    "serve a folder with its own code": (lambda tmp: ["serve", foreign_code(tmp)], 1,
                                         "only with --trust-remote-code"),
    "export a folder with its own code": (lambda tmp: ["export", "onnx", foreign_code(tmp), tmp / "out"], 1,
                                          "only with --trust-remote-code"),
    "push a link leading out of the folder": (
        lambda tmp: ["push", folder_with(tmp, "notes.txt", link_to_a_key(tmp)), "org/model"], 1,
        "notes.txt (a link leading out of the folder)"),
    "push a hidden file": (lambda tmp: ["push", folder_with(tmp, ".env", lambda p: p.write_text("HF_TOKEN=x")),
                                        "org/model"], 1, ".env (hidden)"),
    "push a FIFO": (lambda tmp: ["push", folder_with(tmp, "pipe", os.mkfifo), "org/model"], 1,
                    "pipe (not a regular file)"),
    "push a folder without a model card": (
        lambda tmp: ["push", folder_with(tmp, "model.safetensors", lambda path: path.write_bytes(b"")), "org/model"],
        1, "has no model card (README.md)"),
    "token with a line ending": (lambda tmp: ["push", tmp, "org/model", "--token", TOKEN + "\r\n"], 2,
                                 "argument --token: the token holds whitespace or a control character"),
    "token of a converter with a line ending": (lambda tmp: [
        "convert", "universal-transformer", UT, tmp / "out", "--push-to-hub", "org/model", "--token", TOKEN + "\r"],
        2, "argument --token: the token holds whitespace or a control character"),
    "mistyped token option": (lambda tmp: ["push", tmp, "org/model", "--tokn", TOKEN], 2,
                              "unrecognized arguments: --tokn hf_***"),
}

# ----- --device and --dtype of `hf-ext serve` (each model's commands are in its table) ---------------------------

DEVICE_CASES = {
    **without_cuda({"serve with --device cuda on a machine without CUDA": (
        lambda tmp: ["serve", tmp, "--device", "cuda"], 2,
        "argument --device: cuda: CUDA is not available on this machine")}),
    "serve on a CUDA device the machine lacks": (lambda tmp: ["serve", tmp, "--device", "cuda:99"], 2,
                                                 "argument --device: cuda:99: "),
    "serve on an unknown device": (lambda tmp: ["serve", tmp, "--device", "gpu"], 2,
                                   "argument --device: expected cpu, cuda, cuda:N, mps or auto, got 'gpu'"),
    "serve in an unknown dtype": (lambda tmp: ["serve", tmp, "--dtype", "fp8"], 2,
                                  "argument --dtype: invalid choice: 'fp8'"),
}

CASES = [pytest.param(build, code, message, id=f"{group}: {name}")
         for group, cases in [*((module.__name__.removeprefix("bad_input_"), module.CONVERSION_CASES)
                                for module in MODEL_CASES), ("output", OUTPUT_CASES), ("path", PATH_CASES),
                                ("export", EXPORT_CASES), ("security", SECURITY_CASES), ("device", DEVICE_CASES)]
         for name, (build, code, message) in cases.items()]
COMMAND_CASES = [pytest.param(build, code, message, module.COMMAND_FOLDER,
                              id=f"{module.__name__.removeprefix('bad_input_')}: {name}")
                 for module in MODEL_CASES for name, (build, code, message) in module.COMMAND_CASES.items()]


@pytest.mark.slow
@pytest.mark.parametrize("build, expected_code, message", CASES)
def test_bad_conversion_input_gives_one_line_and_writes_nothing(build, expected_code, message, tmp_path, capsys,
                                                                monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    argv = build(tmp_path)
    code, err = run(argv, capsys)
    assert_refused(tmp_path, code, err, expected_code, message)
    assert not (tmp_path / "out").exists() or (tmp_path / "out" / "keep").is_file()
    assert TOKEN not in err


@pytest.mark.slow
@pytest.mark.parametrize("build, expected_code, message, folder", COMMAND_CASES)
def test_bad_command_input_gives_one_line_and_writes_nothing(build, expected_code, message, folder, tmp_path,
                                                             capsys, monkeypatch, request):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    try:
        argv = build(tmp_path, request.getfixturevalue(folder))
        code, err = run(argv, capsys)
    finally:
        CASE_PATCHES.undo()
    assert_refused(tmp_path, code, err, expected_code, message)
    assert not (tmp_path / "out.png").exists()
    assert TOKEN not in err


def test_every_model_has_its_table():
    from hf_ext.models import MODELS

    assert table_problems(MODELS, MODEL_CASES) == []
    assert len(MODEL_CASES) == len(MODELS)


def test_an_unexpected_exception_is_one_line_and_a_traceback_with_hf_ext_debug(capsys, monkeypatch):
    import argparse

    from hf_ext.cli_utils import execute

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
from hf_ext.cli_utils import execute
from hf_ext.output import atomic_output_dir

def write_slowly(args):
    with atomic_output_dir(args.out) as staging:
        (staging / "model.safetensors").write_bytes(bytes(1 << 20))
        logging.get_logger("hf_ext.slow_writer").info('{"step": 1, "loss": 2.5}')
        print("ready", flush=True)
        time.sleep(3600)  # until the test signals or kills it (starting another writer can take minutes)

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
@pytest.mark.slow
def test_a_signal_during_a_save_removes_the_staging_folder(tmp_path, sent, code, message):
    process = start_slow_writer(tmp_path / "out")
    assert len(list(tmp_path.glob(".out.partial-*"))) == 1
    process.send_signal(sent)
    try:
        assert process.wait(timeout=PROCESS_TIMEOUT) == code
    except subprocess.TimeoutExpired:  # the signal was ignored: the writer would sleep on
        process.kill()
        raise
    lines = process.stderr.read().splitlines()
    assert lines[-2:] == ['{"step": 1, "loss": 2.5}', f"hf-ext: error: {message}"]  # each on a line of its own
    assert list(tmp_path.iterdir()) == []


def stop(process):
    process.kill()
    process.wait(timeout=PROCESS_TIMEOUT)
    process.stdout.close()
    process.stderr.close()


@pytest.mark.slow
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
