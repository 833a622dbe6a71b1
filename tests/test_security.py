"""The promises of docs/security.md, each held by a test here or in the file the page names: what `hf-ext push`
publishes and says first, copies of model files, tokens in arguments and error lines, remote code, YAML aliases in
error messages, and local paths in published files. What `hf-ext serve` exposes is tested in tests/test_serve.py; the
bad inputs among these cases are rows of tests/test_bad_input.py's table as well."""

import argparse
import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import FIXTURES, PROCESS_TIMEOUT, REPO_ROOT, cli_exit_code
from hub_server import MockHub

from hf_ext.errors import HfExtError

TOKEN = "hf_" + "Ab1" * 11 + "Z"  # shaped like a Hub token: hf_ and 34 letters and digits
FAKE_KEY = "-----BEGIN OPENSSH PRIVATE KEY----- (a test's stand-in)"
MTDNN = FIXTURES / "mtdnn" / "tiny"


@pytest.fixture
def hub(monkeypatch, tmp_path):
    """tests/hub_server.py as the Hub, and an empty Hub cache of the test's own."""
    from huggingface_hub import constants

    server = MockHub().start()
    monkeypatch.setattr(constants, "ENDPOINT", server.endpoint)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub_cache"))
    yield server
    server.stop()


def careless_folder(tmp_path: Path) -> Path:
    """A model folder as a careless user may have it: beside the model, a link to their SSH key (mode 600) and a
    .env holding their token."""
    key = tmp_path / "ssh" / "id_rsa"
    key.parent.mkdir()
    key.write_text(FAKE_KEY)
    key.chmod(0o600)
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "bert"}')
    (folder / "model.safetensors").write_bytes(bytes(2048))
    (folder / "notes.txt").symlink_to(key)
    (folder / ".env").write_text(f"HF_TOKEN={TOKEN}\n")
    return folder


# the metadata block a model card starts with (the Hub warns of a card without one)
CARD_METADATA = "---\nlicense: mit\n---\n"


def error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.splitlines()[-1]


# ----- push --------------------------------------------------------------------------------------------------------

def test_push_refuses_a_link_out_of_the_folder_and_hidden_files(tmp_path, hub, capsys):
    folder = careless_folder(tmp_path)
    assert cli_exit_code(["push", folder, "org/model", "--token", TOKEN]) == 1
    assert error_line(capsys) == (
        f"hf-ext: error: refusing to publish .env (hidden), notes.txt (a link leading out of the folder) from "
        f"{folder}: push publishes regular files inside the folder only (move them out, or pass --skip-refused to "
        "leave them out)")
    assert hub.requests == []  # refused before anything was sent


def test_push_publishes_regular_files_and_links_inside_the_folder_or_the_hub_cache_and_lists_them(tmp_path, hub,
                                                                                                  capsys):
    from huggingface_hub import constants

    folder = careless_folder(tmp_path)
    (folder / "same_config.json").symlink_to("config.json")  # a link inside the folder
    (folder / "settings.json").symlink_to(".env")  # a link to a hidden file
    blob = Path(constants.HF_HUB_CACHE) / "models--org--base" / "blobs" / "0123abcd"
    blob.parent.mkdir(parents=True)
    blob.write_text('{"vocab": [1]}')
    (folder / "tokenizer.json").symlink_to(blob)  # a link into the Hub cache, as a cached snapshot is made of
    (folder / "fifo").mkdir()
    os.mkfifo(folder / "fifo" / "pipe")
    assert cli_exit_code(["push", folder, "org/model", "--token", TOKEN, "--skip-refused", "--allow-no-card"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert hub.files("org/model") == {"config.json": b'{"model_type": "bert"}', "model.safetensors": bytes(2048),
                                      "same_config.json": b'{"model_type": "bert"}',
                                      "tokenizer.json": b'{"vocab": [1]}'}
    assert not any(TOKEN.encode() in content or FAKE_KEY.encode() in content
                   for content in hub.files("org/model").values())
    assert TOKEN not in "\n".join(err)
    assert {"warning: not publishing .env (hidden)", "warning: not publishing fifo/pipe (not a regular file)",
            "warning: not publishing notes.txt (a link leading out of the folder)",
            "warning: not publishing settings.json (a link to a hidden file)"} <= set(err)
    listing = err.index(f"uploading 4 files (0.0 MiB) from {folder} to org/model, a public repository (anyone can "
                        "read it):")
    assert err[listing + 1:listing + 5] == ["  config.json (22 bytes)", "  model.safetensors (2.0 KiB)",
                                            "  same_config.json (22 bytes)", "  tokenizer.json (14 bytes)"]


def test_push_publishes_the_eval_results_folder_and_no_other_hidden_one(tmp_path, hub, capsys):
    folder = careless_folder(tmp_path)
    (folder / "notes.txt").unlink()
    (folder / "README.md").write_text(CARD_METADATA + "# model\n")
    (folder / ".eval_results").mkdir()
    (folder / ".eval_results" / "sst2.yaml").write_text("- dataset: {id: nyu-mll/glue, task_id: sst2}\n  value: 0.9\n")
    (folder / ".git").mkdir()
    (folder / ".git" / "config").write_text("[core]\n")
    assert cli_exit_code(["push", folder, "org/model", "--token", TOKEN, "--skip-refused"]) == 0
    assert sorted(hub.files("org/model")) == [".eval_results/sst2.yaml", "README.md", "config.json",
                                              "model.safetensors"]
    assert {"warning: not publishing .env (hidden)", "warning: not publishing .git (hidden)"} <= \
        set(capsys.readouterr().err.splitlines())


def test_push_says_whether_the_repository_is_private(tmp_path, hub, capsys):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "README.md").write_text(CARD_METADATA + "# model\n")
    assert cli_exit_code(["push", folder, "org/private", "--token", TOKEN, "--private"]) == 0
    assert f"uploading 2 files (0.0 MiB) from {folder} to org/private, a private repository:" in \
        capsys.readouterr().err.splitlines()
    assert cli_exit_code(["push", folder, "org/public", "--token", TOKEN]) == 0
    assert cli_exit_code(["push", folder, "org/public", "--token", TOKEN, "--private"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert "warning: org/public exists and is public: --private does not change an existing repository" in err
    assert err[-4].endswith("to org/public, a public repository (anyone can read it):")


def test_push_needs_a_card_and_publishes_it_loading_the_model_by_the_repo_id(tmp_path, hub, capsys):
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    assert cli_exit_code(["push", folder, "org/model", "--token", TOKEN]) == 1
    assert error_line(capsys) == (
        f"hf-ext: error: {folder} has no model card (README.md): write one (the Hub shows it as the model's page), "
        "or pass --allow-no-card to publish the folder without one")
    assert hub.requests == []
    card = (CARD_METADATA + 'model = AutoModel.from_pretrained("my-model")\n'
            '`hf-ext optimus reconstruct my-model "a sentence"`\n'
            'my-model-2, "my-model/x" and hf-ext push my-model-2 stay\n')
    (folder / "README.md").write_text(card)
    assert cli_exit_code(["push", folder, "org/model", "--token", TOKEN]) == 0
    assert hub.files("org/model")["README.md"].decode() == (
        CARD_METADATA + 'model = AutoModel.from_pretrained("org/model")\n'
        '`hf-ext optimus reconstruct org/model "a sentence"`\n'
        'my-model-2, "my-model/x" and hf-ext push my-model-2 stay\n')
    assert (folder / "README.md").read_text() == card  # the folder itself is as it was


# ----- copies of model files ---------------------------------------------------------------------------------------

def test_copies_follow_no_link_out_of_the_folder_and_never_widen_a_mode(tmp_path, hub):
    from hf_ext.hub import install_into_hub_cache
    from hf_ext.onnx_export import model_files
    from hf_ext.output import atomic_output_dir, copy_file

    folder = careless_folder(tmp_path)
    (folder / ".env").unlink()
    with pytest.raises(HfExtError, match=f"^{folder / 'notes.txt'} is a link leading out of the folder"):
        model_files(str(folder))
    with pytest.raises(HfExtError, match="notes.txt is a link leading out of the folder"):
        install_into_hub_cache(folder, "org/model", tmp_path / "cache")
    (folder / "notes.txt").unlink()
    (folder / "vocab.txt").write_text("[PAD]\n")
    (folder / "vocab.txt").chmod(0o600)
    (folder / "config.json").chmod(0o644)
    (folder / "tokenizer.json").symlink_to("vocab.txt")  # inside the folder: copied as the file it leads to
    assert [(str(name), path) for name, path in model_files(str(folder))] == [
        ("config.json", (folder / "config.json").resolve()), ("tokenizer.json", (folder / "vocab.txt").resolve()),
        ("vocab.txt", (folder / "vocab.txt").resolve())]
    umask = os.umask(0o022)
    try:
        with atomic_output_dir(tmp_path / "out") as staging:
            for name in ("config.json", "vocab.txt"):
                copy_file(folder / name, staging / name)
            (staging / "written.json").write_text("{}")
            (staging / "written.json").chmod(0o600)  # as some writers leave their files: opened to the umask's 644
    finally:
        os.umask(umask)
    assert {path.name: path.stat().st_mode & 0o777 for path in (tmp_path / "out").iterdir()} == {
        "config.json": 0o644, "vocab.txt": 0o600, "written.json": 0o644}


# ----- tokens ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("bad", ["\r", "\n", " ", "\x00"], ids=["CR", "LF", "space", "NUL"])
def test_a_token_with_whitespace_or_a_control_character_is_refused_unseen(tmp_path, hub, capsys, bad):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    assert cli_exit_code(["push", folder, "org/model", "--token", TOKEN + bad]) == 2
    err = capsys.readouterr().err
    assert err == ("hf-ext: error: argument --token: the token holds whitespace or a control character (a line "
                   "ending read from a file?); it is not shown here. Set HF_TOKEN or run `hf auth login` instead (see "
                   "hf-ext push --help)\n")
    assert hub.requests == []


def test_a_mistyped_token_option_does_not_echo_the_token(capsys):
    assert cli_exit_code(["push", "model", "org/model", f"--tokn={TOKEN}"]) == 2
    assert capsys.readouterr().err == "hf-ext: error: unrecognized arguments: --tokn=hf_*** (see hf-ext --help)\n"


def test_every_error_line_is_redacted(capsys):
    from hf_ext.cli_utils import execute

    def header_refused(args):
        raise RuntimeError(f"Illegal header value b'Bearer {TOKEN}\\r'")

    def quoting(args):
        raise HfExtError(f"push failed for {TOKEN}; authorization: Bearer some-other-secret")

    assert execute(argparse.Namespace(handler=header_refused, command="x"), "hf-ext") == 1
    assert capsys.readouterr().err == "hf-ext: error: RuntimeError: Illegal header value b'Bearer ***'\n"
    assert execute(argparse.Namespace(handler=quoting, command="x"), "hf-ext") == 1
    assert capsys.readouterr().err == "hf-ext: error: push failed for hf_***; authorization: Bearer ***\n"


def test_token_options_point_to_hf_token_and_hf_auth_login():
    from hf_ext.cli import build_parser

    commands = next(action for action in build_parser()._actions if isinstance(action, argparse._SubParsersAction))
    converters = next(action for action in commands.choices["convert"]._actions
                      if isinstance(action, argparse._SubParsersAction))
    for parser in (commands.choices["push"], *converters.choices.values()):
        (token,) = [action for action in parser._actions if "--token" in action.option_strings]
        assert "HF_TOKEN" in token.help and "`hf auth login`" in token.help and "process list" in token.help


# ----- remote code -------------------------------------------------------------------------------------------------

FOREIGN_CONFIG = """
from pathlib import Path

from transformers import PretrainedConfig

Path(MARKER).write_text("the folder's own code ran")


class ForeignConfig(PretrainedConfig):
    model_type = "foreign-net"
"""


def foreign_folder(tmp_path: Path) -> Path:
    """A model folder that needs its own code (`auto_map`); running that code leaves `CODE_RAN` beside it."""
    folder = tmp_path / "foreign"
    folder.mkdir()
    (folder / "configuration_foreign.py").write_text(f"MARKER = {str(tmp_path / 'CODE_RAN')!r}\n{FOREIGN_CONFIG}")
    (folder / "config.json").write_text(json.dumps({"model_type": "foreign-net", "auto_map": {
        "AutoConfig": "configuration_foreign.ForeignConfig", "AutoModel": "modeling_foreign.ForeignModel"}}))
    return folder


@pytest.mark.slow
def test_a_folder_with_its_own_code_is_refused_without_a_prompt_though_stdin_answers_y(tmp_path):
    folder = foreign_folder(tmp_path)
    env = {key: value for key, value in os.environ.items() if not key.startswith(("HF_", "HUGGINGFACE_"))}
    env.update(PYTHONPATH=str(REPO_ROOT), HF_HOME=str(tmp_path / "home"), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    run = subprocess.run([sys.executable, "-m", "hf_ext.cli", "optimus", "encode", str(folder), "a man ."],
                         input="y\ny\ny\n", capture_output=True, text=True, env=env, timeout=PROCESS_TIMEOUT)
    assert run.returncode == 1, run.stderr
    assert run.stderr.splitlines()[-1] == (f"hf-ext: error: {folder} needs its own model code, which hf-ext runs only "
                                           "with --trust-remote-code (read that code first)")
    assert "[y/N]" not in run.stdout + run.stderr
    assert not (tmp_path / "CODE_RAN").exists()


# ----- YAML aliases and quoted values ------------------------------------------------------------------------------

def alias_bomb(levels: int = 6, width: int = 9) -> str:
    """A YAML flow list of nested aliases: `levels` anchors, each `width` aliases of the one before, standing for
    width ** levels strings in a few hundred bytes."""
    anchors = ["&a0 [" + ", ".join(["lol"] * width) + "]"]
    anchors += [f"&a{level} [" + ", ".join([f"*a{level - 1}"] * width) + "]" for level in range(1, levels)]
    return "[" + ", ".join(anchors) + "]"


def test_an_alias_bomb_in_task_definitions_is_refused_as_such():
    from hf_ext.models.mtdnn.task_defs import config_from_task_def_yaml

    text = f"sst:\n  task_type: Classification\n  n_class: 2\n  labels: {alias_bomb()}\n"
    assert len(text) < 500
    with pytest.raises(ValueError) as refused:
        config_from_task_def_yaml(text, {"hidden_size": 8, "num_attention_heads": 2})
    assert str(refused.value) == ("malformed task-definition YAML: its aliases expand it by more than 100000 values "
                                  "(an alias bomb)")


def test_an_alias_bomb_in_a_schedule_is_refused_as_such(tmp_path):
    from hf_ext.models.ernie2.schedule import ContinualSchedule

    (tmp_path / "stages.yml").write_text(f"stages:\n  - steps: {{knowledge_masking: {alias_bomb()}}}\n")
    with pytest.raises(HfExtError, match=r"is not YAML/JSON: its aliases expand it by more than 100000 values \(an "
                       r"alias bomb\)$"):
        ContinualSchedule.from_file(tmp_path / "stages.yml")


def test_a_few_aliases_load_and_quoted_values_stay_short(tmp_path):
    import yaml

    from hf_ext.errors import MAX_QUOTED_CHARS, quoted
    from hf_ext.models.ernie2.schedule import ContinualSchedule
    from hf_ext.text_files import BoundedYamlLoader

    assert yaml.load("a: &x [1, 2]\nb: *x\nc: *x\n", Loader=BoundedYamlLoader) == {"a": [1, 2], "b": [1, 2],
                                                                                   "c": [1, 2]}
    with pytest.raises(yaml.YAMLError, match="an alias refers to a node that holds it"):
        yaml.load("a: &x [1, *x]\n", Loader=BoundedYamlLoader)
    with pytest.raises(yaml.YAMLError, match="nested too deeply"):
        yaml.load("[" * 5000 + "]" * 5000, Loader=BoundedYamlLoader)
    assert quoted("32") == "'32'" and quoted([1, "a"]) == "[1, 'a']"  # as repr, while short
    assert len(quoted("x" * 10**6)) == MAX_QUOTED_CHARS and len(quoted([[["x" * 100] * 100] * 100])) <= MAX_QUOTED_CHARS
    # a long list without aliases is no bomb: the schedule's own check refuses it, quoting the start of it
    (tmp_path / "stages.yml").write_text(f"stages:\n  - steps: {{knowledge_masking: [{'1, ' * 10**4}1]}}\n")
    with pytest.raises(HfExtError) as refused:
        ContinualSchedule.from_file(tmp_path / "stages.yml")
    assert str(refused.value).startswith(f"{tmp_path / 'stages.yml'}, stage 1: the steps of knowledge_masking must be "
                                         "a positive integer, got [1, 1, 1, 1, 1, 1, ...]")


def test_the_mtdnn_configurations_copy_of_quoted_has_its_constants():
    """configuration_mtdnn.py is remote code (it imports only torch, transformers and the standard library), so it
    holds a copy of `quoted`, marked `# Copied from` (tests/test_copies.py keeps the function equal), and of the
    constants it reads, kept equal here."""
    from hf_ext import errors
    from hf_ext.models.mtdnn import configuration_mtdnn

    assert configuration_mtdnn.MAX_QUOTED_CHARS == errors.MAX_QUOTED_CHARS
    assert vars(configuration_mtdnn._SHORT_REPR) == vars(errors._SHORT_REPR)


# ----- local paths -------------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_a_converted_folder_names_no_local_path(tmp_path, capsys):
    out = tmp_path / "mtdnn-tiny"
    assert cli_exit_code(["convert", "mtdnn", MTDNN / "model_0.pt", out, "--task-def", MTDNN / "task_def.yml"]) == 0
    for file in out.rglob("*"):
        content = file.read_bytes()
        for local in (str(tmp_path), str(REPO_ROOT), str(Path.home())):
            assert local.encode() not in content, f"{file.name} names {local}"
    assert "task definitions from `task_def.yml`" in (out / "README.md").read_text()


def test_model_names_are_repo_ids_or_folder_names(tmp_path):
    from hf_ext.hub import install_into_hub_cache, model_name

    folder = tmp_path / "converted"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    assert model_name(str(folder)) == "converted" and model_name("org/name") == "org/name"
    assert model_name(install_into_hub_cache(folder, "org/cached", tmp_path / "cache")) == "org/cached"


# ----- docs/security.md --------------------------------------------------------------------------------------------

def test_the_security_page_names_tests_that_exist():
    page = (REPO_ROOT / "docs" / "security.md").read_text()
    named = re.findall(r"`(tests/[\w/]+\.py)::(test_\w+)`", page)
    assert len(named) >= 12
    for path, name in named:
        tree = ast.parse((REPO_ROOT / path).read_text())
        assert name in {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}, f"{path}::{name}"
    sections = re.split(r"\n## ", page)[1:]
    assert all("`tests/" in section for section in sections), "a promise without the test that holds it"
