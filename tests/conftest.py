"""Shared test fixtures: where the repository and its test fixtures are (`tests/fixtures/`, written by the original
implementations; see `tests/fixtures/README.md`), and the tiny Optimus fixture converted once per session."""

from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
FIXTURES = REPO_ROOT / "tests" / "fixtures"


@pytest.fixture(scope="session")
def repo_root():
    return REPO_ROOT


@pytest.fixture(scope="session")
def fixtures_dir():
    return FIXTURES


@pytest.fixture(scope="session")
def optimus_tiny(fixtures_dir):
    """The original Optimus code's output folder (checkpoint-{encoder,decoder,full}-N/) and its reference outputs."""
    return fixtures_dir / "optimus" / "tiny"


@pytest.fixture(scope="session")
def optimus_tiny_converted(optimus_tiny, tmp_path_factory):
    """`hf-ext convert optimus` (in-process) of the tiny fixture's split folders, checked against its reference
    outputs; read it, do not modify it."""
    from hf_ext.cli import main

    out = tmp_path_factory.mktemp("optimus_tiny") / "converted"
    code = main(["convert", "optimus", str(optimus_tiny), str(out),
                 "--reference", str(optimus_tiny / "reference.safetensors")])
    assert code == 0, "converting the tiny Optimus fixture failed"
    return out


@pytest.fixture
def no_network(monkeypatch):
    """Fail on any attempt to open a network connection (name lookups included), in an environment that allows the
    Hub (HF_HUB_OFFLINE unset): what runs under it must make no request at all. Yields the attempts."""
    import socket

    from huggingface_hub import constants

    attempts = []

    def refuse(*args, **kwargs):
        attempts.append(args)
        raise OSError("network access during a test that must stay local")

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    yield attempts
    assert attempts == [], f"network requests were made: {attempts}"


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread for a module of tiny models: extra threads only add synchronisation, which costs seconds
    per step on a busy 2-core machine. Use with `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def run_script(script, *args, monkeypatch, capsys):
    """Run a stand-alone script (`benchmarks/`, `reproductions/`) in this process as `python SCRIPT ARGS` would, its
    folder importable; a non-zero exit fails the test. transformers' verbosity, which the scripts lower, is restored.
    Returns what it printed on stdout."""
    import runpy
    import sys

    from transformers import logging as transformers_logging

    monkeypatch.setattr(sys, "argv", [str(script), *map(str, args)])
    monkeypatch.syspath_prepend(str(Path(script).parent))
    verbosity = transformers_logging.get_verbosity()
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as exit_info:
        assert exit_info.code in (0, None), capsys.readouterr().out
    finally:
        transformers_logging.set_verbosity(verbosity)
    return capsys.readouterr().out


def run_torchrun(script, *args, timeout=300):
    """Run `script` (a path under tests/) under `torchrun --nproc_per_node 2` on a free loopback port and return each
    rank's JSON result (`<out>/rank{0,1}.json`, where `out` is the last argument). A hang (e.g. a DDP deadlock)
    becomes a timeout failure; the completed process is returned too, for its stderr."""
    import json
    import os
    import socket
    import subprocess
    import sys

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT)}
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr",
                          "127.0.0.1", "--master_port", str(port), str(Path(__file__).parent / script),
                          *map(str, args)], env=env, capture_output=True, text=True, timeout=timeout)
    assert run.returncode == 0, run.stderr[-3000:]
    out = Path(args[-1])
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in (0, 1)], run


def cli_exit_code(argv: list) -> int:
    """`hf-ext ARGV` run in-process: the exit code, also of an argparse usage error (which raises SystemExit)."""
    from hf_ext.cli import main

    try:
        return main([str(argument) for argument in argv])
    except SystemExit as usage_error:
        return usage_error.code


def require_extra(extra: str, *modules: str) -> None:
    """At the top of a test module for an optional extra (`pip install 'hf-ext[EXTRA]'`): skip the module when one of
    `modules` is missing, except under CI (CI=true), where `.ci/run` installs every extra and a missing one fails,
    so that these tests cannot silently stop running."""
    import importlib.util
    import os

    missing = [name for name in modules if importlib.util.find_spec(name) is None]
    if not missing:
        return
    message = f"needs the {extra} extra (missing {', '.join(missing)}): pip install 'hf-ext[{extra}]'"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI installs every extra, but this test {message}", pytrace=False)
    pytest.skip(message, allow_module_level=True)
