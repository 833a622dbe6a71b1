"""Shared test fixtures: where the repository and its test fixtures are (`tests/fixtures/`: checkpoints and reference
outputs, and which code wrote each, in `tests/fixtures/README.md`), the tiny Optimus fixture converted once per session, and for
`hf-ext serve`: a tiny model folder of each model with an app, and its app running on a free local port."""

import contextlib
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


# ----- hf-ext serve: tiny model folders with their tokenizers, and a running app -----------------------------------

@pytest.fixture(scope="session")
def optimus_sample_folder(tmp_path_factory):
    """A tiny converted Optimus folder with its two tokenizers (random weights)."""
    from hf_ext.models.optimus.conversion import convert_optimus_checkpoint
    from hf_ext.models.optimus.samples import write_sample_checkpoint

    root = tmp_path_factory.mktemp("optimus_app")
    write_sample_checkpoint(root / "original", seed=7, latent_size=5, hidden_size=32)
    convert_optimus_checkpoint(root / "original", root / "converted")
    return root / "converted"


@pytest.fixture(scope="session")
def algorithmic_seq2seq_folder(tmp_path_factory):
    """A tiny seq2seq Universal Transformer with ACT over the algorithmic vocabulary, with its tokenizer; the
    halting unit starts at bias 0, so that positions halt after different numbers of steps."""
    import torch

    from hf_ext.models.universal_transformer import UniversalTransformerForSeq2SeqLM
    from hf_ext.models.universal_transformer.training import algorithmic_config, algorithmic_tokenizer

    folder = tmp_path_factory.mktemp("universal_transformer_app") / "model"
    torch.manual_seed(0)
    config = algorithmic_config(hidden_size=16, num_attention_heads=2, intermediate_size=32, act_max_steps=4,
                                dropout=0.0, act_halting_bias_init=0.0)
    UniversalTransformerForSeq2SeqLM(config).save_pretrained(folder)
    algorithmic_tokenizer().save_pretrained(folder)
    return folder


MTDNN_APP_TASKS = """\
sst:
  data_format: PremiseOnly
  enable_san: false
  labels: [negative, positive]
  n_class: 2
  task_type: Classification
nli:
  data_format: PremiseAndOneHypothesis
  enable_san: true
  labels: [contradiction, neutral, entailment]
  n_class: 3
  task_type: Classification
sts:
  data_format: PremiseAndOneHypothesis
  enable_san: false
  n_class: 1
  task_type: Regression
"""
MTDNN_APP_WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "man", "woman", "is", "playing", "sleeping",
                   "."]


@pytest.fixture(scope="session")
def mtdnn_sample_folder(tmp_path_factory):
    """A tiny MT-DNN model (a single-sentence task, a SAN pair task, a regression pair task) with a BERT
    tokenizer."""
    import torch
    from transformers import BertConfig, BertTokenizer

    from hf_ext.models.mtdnn import MTDNNConfig, MTDNNModel

    root = tmp_path_factory.mktemp("mtdnn_app")
    encoder = BertConfig(vocab_size=len(MTDNN_APP_WORDS), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=24, max_position_embeddings=40)
    torch.manual_seed(0)
    MTDNNModel(MTDNNConfig.from_task_def_yaml(MTDNN_APP_TASKS, encoder)).save_pretrained(root / "model")
    (root / "vocab.txt").write_text("\n".join(MTDNN_APP_WORDS) + "\n", encoding="utf-8")
    BertTokenizer(vocab_file=str(root / "vocab.txt")).save_pretrained(root / "model")
    return root / "model"


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

    require_extra("test", "gradio_client")
    import gradio_client

    with hub_offline():
        return gradio_client.Client(url, verbose=False)
