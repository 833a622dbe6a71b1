"""Shared test fixtures: where the repository and its test fixtures are (`tests/fixtures/`: checkpoints and reference
outputs, and which code wrote each, in `tests/fixtures/README.md`), running commands and scripts, and for
`hf-ext serve` a model's app running on a free local port.

What is a model's own lives in its test folder: `tests/<model>/fixtures_<model>.py` holds the fixtures that tests
outside the folder use too (its tiny model folders for the serve and bad-input tests), registered here as plugins;
`tests/<model>/bad_input_<model>.py` its rows of the bad-input table. A new model adds these files: nothing here
names a model."""

import contextlib
import importlib
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import NoReturn

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
FIXTURES = REPO_ROOT / "tests" / "fixtures"
TESTS = REPO_ROOT / "tests"
# how long a test waits for a Python process it starts (torch and transformers imported, a tiny model run): beyond
# this it has hung. The slowest takes about a minute on the project's idle 2-core machine, ten on a loaded one.
PROCESS_TIMEOUT = 900


def model_test_modules(kind: str) -> list[ModuleType]:
    """The modules `tests/<model>/<kind>_<model>.py` of every model test folder that has one (`"fixtures"`,
    `"bad_input"`), imported by name with their folder on `sys.path`, as pytest imports the tests beside them."""
    modules = []
    for path in sorted(TESTS.glob(f"*/{kind}_*.py")):
        if path.stem != f"{kind}_{path.parent.name}":
            continue
        if str(path.parent) not in sys.path:
            sys.path.insert(0, str(path.parent))
        modules.append(importlib.import_module(path.stem))
    return modules


def pytest_configure(config):
    for module in model_test_modules("fixtures"):  # each model's shared fixtures, for every test
        if not config.pluginmanager.is_registered(module):
            config.pluginmanager.register(module, f"hf_ext_tests.{module.__name__}")


def pytest_collection_finish(session: pytest.Session) -> None:
    """One intra-op thread for every test of tiny models: the suite's worker processes already take every core, and
    extra threads only add synchronisation, which costs seconds per step on a busy 2-core machine. The test modules
    have imported torch by now; the processes that tests start keep torch's default."""
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)


NO_CUDA_REASON = "needs a CUDA device, and torch finds none here: run python -m pytest -m gpu on a GPU machine"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tests marked `gpu` (docs/gpu.md) run where torch finds a CUDA device; elsewhere (CI included, which has
    none) each is skipped with `NO_CUDA_REASON`, so that pytest's summary (`-ra`) lists them as skipped rather than
    leaving them out unseen. A missing GPU is a check that does not apply, not a missing dependency: CI=true does not
    turn these skips into failures."""
    needing_cuda = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not needing_cuda:
        return
    import torch

    if not torch.cuda.is_available():
        for item in needing_cuda:
            item.add_marker(pytest.mark.skip(reason=NO_CUDA_REASON))


# a module whose tests are all slow says so once, at its top
WHOLLY_SLOW_MODULE = re.compile(r"^pytestmark = .*\bpytest\.mark\.slow\b", re.MULTILINE)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Under `-m "not slow"` (the README's test command) a module marked slow as a whole is not imported at all:
    its tests would be deselected anyway, and importing what they need (Trainer, the apps, the exporters) costs
    minutes of the run on a 2-core machine. Returns None (no opinion) otherwise."""
    if (collection_path.suffix == ".py" and collection_path.name.startswith("test_")
            and " ".join(config.getoption("markexpr").split()) == "not slow"
            and WHOLLY_SLOW_MODULE.search(collection_path.read_text(encoding="utf-8"))):
        return True
    return None


@pytest.fixture(scope="session")
def repo_root():
    return REPO_ROOT


@pytest.fixture(scope="session")
def fixtures_dir():
    return FIXTURES


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


def run_torchrun(script, *args, timeout=PROCESS_TIMEOUT):
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


def torchrun_cli(argv, timeout):
    """`hf-ext --quiet ARGV` under `torchrun --nproc_per_node 2` (gloo on the CPU): (exit code, stdout, stderr). A
    run still going after `timeout` seconds (a process waiting in a collective for one that is gone) is stopped and
    fails the test: SIGTERM to torchrun, which stops its workers (they run in sessions of their own, out of reach of
    a signal to its group), killing them after its 30 s of grace."""
    import os
    import socket
    import subprocess
    import sys

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT)}
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
               "--master_port", str(port), "-m", "hf_ext.cli", "--quiet", *map(str, argv)]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.terminate()
        _, err = process.communicate(timeout=120)
        pytest.fail(f"torchrun still ran after {timeout} s: a process waits for one that is gone\n{err[-3000:]}")
    return process.returncode, out, err


def cli_exit_code(argv: list) -> int:
    """`hf-ext ARGV` run in-process: the exit code, also of an argparse usage error (which raises SystemExit)."""
    from hf_ext.cli import main

    try:
        return main([str(argument) for argument in argv])
    except SystemExit as usage_error:
        return usage_error.code


def cli_run(capsys, *argv) -> tuple[int, str, str]:
    """`hf-ext ARGV` run in-process: (exit code, stdout, stderr)."""
    code = cli_exit_code(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def cli_output(capsys, *argv) -> str:
    """`hf-ext ARGV` run in-process, which must succeed (its stderr is the failure's message): its stdout."""
    from hf_ext.cli import main

    capsys.readouterr()
    code = main([str(argument) for argument in argv])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def require_extra(extra: str, *modules: str) -> None:
    """At the top of a test module for an optional extra (`hf_ext.extras.install_command(EXTRA)` installs it), or
    in a test or fixture: a dependency that is missing when one of `modules` cannot be imported (see
    `missing_dependency`)."""
    import importlib.util

    from hf_ext.extras import install_command

    missing = [name for name in modules if importlib.util.find_spec(name) is None]
    if missing:
        missing_dependency(f"this test needs the {extra} extra (missing {', '.join(missing)}): "
                           f"{install_command(extra)}")


def missing_dependency(reason: str) -> NoReturn:
    """The one rule for a test whose dependency is not installed: it is skipped with `reason`, except under CI
    (CI=true, which `.ci/run` sets), where the test fails instead, so that no test can silently stop running there:
    `.ci/run` installs the `test` extra, all that the tests not marked slow need, and a run of the slow tests under
    CI=true needs the `test-slow` extra (and Debian's chromium for the browser test). Skips for any other reason (a
    check that does not apply) are not this rule's."""
    import os

    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true: a missing dependency fails the test: {reason}", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


# ----- hf-ext serve: a model's app running -------------------------------------------------------------------------

@contextlib.contextmanager
def running_app(folder, page_load_js: str | None = None, host: str = "127.0.0.1"):
    """`hf-ext serve`'s app of `folder` on a free port of `host` (a loopback address), in a background thread: yields
    its URL; closed on the way out. `page_load_js`: a JavaScript function the page runs once gradio has mounted every
    component."""
    from hf_ext import serve

    require_extra("app", "gradio")
    app = serve.build_app(str(folder))
    if page_load_js is not None:
        with app:
            app.load(None, js=page_load_js)
    url = serve.launch(app, host, free_port())
    try:
        yield url
    finally:
        app.close()


@pytest.fixture(scope="module")
def client(request):
    """A `gradio_client` of the app of the test module's model folder: the module names that folder's fixture in
    `APP_FOLDER`."""
    with running_app(request.getfixturevalue(request.module.APP_FOLDER)) as url:
        yield local_client(url)


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def local_client(url: str):
    """A `gradio_client.Client` of a local app, made with the Hub switched off: gradio_client otherwise asks the Hub
    for its request headers and sends it telemetry."""
    from hf_ext.hub import hub_offline

    require_extra("test-slow", "gradio_client")
    import gradio_client

    with hub_offline():
        return gradio_client.Client(url, verbose=False)
