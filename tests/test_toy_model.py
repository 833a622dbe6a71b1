"""A sixth model, made in this test only, proves what docs/adding_a_model.md says a model touches.

The toy is a package of its own (`hf_ext_toy`, written into a temporary folder on `sys.path`) with the files the
guide lists, listed with `hf_ext.models.add_model`, the hook for a model outside `hf_ext/models/` (a model inside
adds its folder name to `PACKAGES` instead). Nothing of the shared layer is edited: the toy registers with the Auto
classes, gets `hf-ext convert toy` and its own command group, an app that `hf-ext serve` finds, a LoRA plan, and
passes the layout checks that every model passes; the checks of the top-level folders, of docs/cli.md and of the
bad-input table ask for exactly the files the guide names."""

import importlib
import json
import re
import sys
import textwrap
from pathlib import Path

import pytest
from bad_input import table_problems
from conftest import cli_exit_code, model_test_modules
from model_layout import (
    code_names,
    conversion_script,
    drift_problems,
    entry_problems,
    model_words,
    naming_problems,
    package_import_problems,
    package_stub,
    remote_code_problems,
)
from test_docs import commands, sections

from hf_ext.models import MODELS, add_model

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "adding_a_model.md"

TOY_FILES = {
    "__init__.py": '''
        """A toy model: one linear map."""

        from hf_ext.registration import LoraPlan, ModelEntry

        from .configuration_toy import ToyConfig
        from .modeling_toy import ToyModel

        ENTRY = ModelEntry(
            package=__name__,
            display_name="Toy",
            config_class=ToyConfig,
            auto_classes={"AutoModel": ToyModel},
            top_level=("ToyConfig", "ToyModel"),
            card_template="toy",
            conversion_script="convert_toy_original_checkpoint.py",
            lora=LoraPlan(("dense",)),
            app="app",
            app_summary="the toy's echo",
        )
        ''',
    "configuration_toy.py": '''
        from transformers import PretrainedConfig


        class ToyConfig(PretrainedConfig):
            model_type = "hf-ext-toy"

            def __init__(self, hidden_size=4, **kwargs):
                self.hidden_size = hidden_size
                super().__init__(**kwargs)
        ''',
    "modeling_toy.py": '''
        import torch
        from transformers import PreTrainedModel

        from .configuration_toy import ToyConfig


        class ToyModel(PreTrainedModel):
            config_class = ToyConfig
            base_model_prefix = "toy"

            def __init__(self, config):
                super().__init__(config)
                self.dense = torch.nn.Linear(config.hidden_size, config.hidden_size)
                self.post_init()

            def forward(self, inputs_embeds):
                return self.dense(inputs_embeds)
        ''',
    "conversion.py": '''
        """The toy's converter: an "original checkpoint" is a JSON file of settings."""

        from hf_ext.conversion import add_output_arguments
        from hf_ext.output import atomic_output_dir
        from hf_ext.text_files import read_json

        from .configuration_toy import ToyConfig
        from .modeling_toy import ToyModel

        CONVERT_NAME = "toy"
        CONVERT_SUMMARY = "toy checkpoints (a JSON file of settings)"


        def add_arguments(parser):
            parser.add_argument("src")
            parser.add_argument("out")
            add_output_arguments(parser)


        def looks_original(path):
            return path.is_file() and path.suffix == ".json"


        def run(args):
            settings = read_json(args.src, "toy checkpoint")
            with atomic_output_dir(args.out, args.overwrite) as staging:
                ToyModel(ToyConfig(**settings)).save_pretrained(staging)
            print(args.out)
        ''',
    "commands.py": '''
        from hf_ext.cli_utils import add_model_argument, model_commands
        from hf_ext.loading import load_config

        from . import conversion


        def register(commands):
            tools = model_commands(commands, conversion.CONVERT_NAME, "the toy's tools", "The toy's tools.")
            parser = tools.add_parser("hidden-size", help="print the hidden size")
            add_model_argument(parser, "toy folder")
            parser.set_defaults(handler=lambda args: print(load_config(args.model, "hf-ext-toy").hidden_size))
        ''',
    "app.py": '''
        MODEL_TYPES = ("hf-ext-toy",)


        def build_app(source, trust_remote_code=None, model_kwargs=None):
            import gradio as gr

            with gr.Blocks() as app:
                gr.Markdown(source)
            return app
        ''',
}
# what the guide's table must list, and what asks for each file (`<model>` stands for the model's folder name)
TOUCHES = {
    "hf_ext/models/<model>/__init__.py": "its ENTRY (entry_problems)",
    "hf_ext/models/<model>/configuration_<model>.py": "remote code (remote_code_problems)",
    "hf_ext/models/<model>/modeling_<model>.py": "remote code (remote_code_problems)",
    "hf_ext/models/<model>/conversion.py": "the entry's converter (entry_problems)",
    "hf_ext/models/<model>/commands.py": "the entry's commands (entry_problems)",
    "hf_ext/models/<model>/app.py": "the entry's app, if any (entry_problems)",
    "hf_ext/models/<model>/export_onnx.py": "the entry's exporter, if any (entry_problems)",
    "hf_ext/models/<model>/pipeline_<model>.py": "the entry's custom pipelines, if any: remote code "
                                                 "(remote_code_problems)",
    "hf_ext/models/__init__.py": "one line in PACKAGES (test_layout: every folder listed once)",
    "hf_ext/__init__.pyi": "its top_level names for type checkers (test_layout: package_stub)",
    "conversion/convert_<model>_original_checkpoint.py": "drift_problems, entry_problems",
    "model_cards/<model>.md": "drift_problems, entry_problems",
    "docs/cli.md": "test_docs: a section per command",
    "docs/<model>.md": "test_docs: the strict site build",
    "mkdocs.yml": "test_docs: the strict site build (a page outside the nav fails it)",
    "tests/<model>/bad_input_<model>.py": "test_bad_input: a table per model",
    "tests/<model>/fixtures_<model>.py": "the model's folders for the shared tests, if they need one",
    "tests/fixtures/<model>/": "the parity tests of the converter (the original's outputs)",
    "README.md": "a row of the models table (by hand)",
    "CHANGELOG.md": "an entry (by hand)",
}


def guide_rows() -> list[str]:
    """The paths in the first column of the guide's table of what a new model touches."""
    text = GUIDE.read_text(encoding="utf-8")
    table = text[text.index("## What a new model touches"):]
    table = table[:table.index("\n\n", table.index("|"))]
    return re.findall(r"^\| `([^`]+)` \|", table, re.MULTILINE)


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """The toy package, imported and listed in MODELS for the test (taken off the list again afterwards)."""
    package = tmp_path / "hf_ext_toy"
    package.mkdir()
    for name, text in TOY_FILES.items():
        (package / name).write_text(textwrap.dedent(text).lstrip(), encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("hf_ext_toy")
    add_model(module.ENTRY)
    try:
        yield module
    finally:
        MODELS.remove(module.ENTRY)
        for name in [name for name in sys.modules if name == "hf_ext_toy" or name.startswith("hf_ext_toy.")]:
            del sys.modules[name]


def test_the_guide_lists_what_a_model_touches():
    assert sorted(guide_rows()) == sorted(TOUCHES)


def test_the_toy_registers_with_the_auto_classes(toy, tmp_path):
    from transformers import AutoConfig, AutoModel

    config = AutoConfig.for_model("hf-ext-toy", hidden_size=3)
    model = AutoModel.from_config(config)
    assert type(model) is toy.ToyModel and model.dense.in_features == 3
    model.save_pretrained(tmp_path / "saved")  # remote code: the files and the auto_map come along
    assert {"configuration_toy.py", "modeling_toy.py"} <= {path.name for path in (tmp_path / "saved").iterdir()}
    assert json.loads((tmp_path / "saved" / "config.json").read_text())["auto_map"] == toy.ENTRY.auto_map


def test_the_toy_gets_its_converter_and_command_group(toy, tmp_path, capsys):
    from hf_ext.cli import main

    (tmp_path / "original.json").write_text('{"hidden_size": 5}')
    assert main(["convert", "toy", str(tmp_path / "original.json"), str(tmp_path / "converted")]) == 0
    assert main(["toy", "hidden-size", str(tmp_path / "converted")]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "5"
    assert main(["convert", "toy", str(tmp_path / "missing.json"), str(tmp_path / "other")]) == 1
    assert capsys.readouterr().err == f"hf-ext: error: toy checkpoint {tmp_path / 'missing.json'} does not exist\n"
    # the original given where a model folder belongs: its converter is named
    assert cli_exit_code(["toy", "hidden-size", tmp_path / "original.json"]) == 2
    assert f"{tmp_path / 'original.json'} looks like an original" in capsys.readouterr().err


def test_the_toy_has_an_app_and_a_lora_plan(toy):
    from hf_ext import serve
    from hf_ext.lora import lora_plan

    assert serve.apps()["hf-ext-toy"].__name__ == "hf_ext_toy.app"
    assert lora_plan(toy.ToyModel(toy.ToyConfig())).target_modules == ("dense",)


def test_the_toy_passes_the_layout_checks_and_the_shared_layer_needs_no_edit(toy):
    folder = Path(toy.__file__).parent
    assert remote_code_problems(folder) == []
    assert package_import_problems(folder, folder.parent, [entry.package for entry in MODELS]) == []
    shared = [path for path in (ROOT / "hf_ext").rglob("*.py") if "models" not in path.parts]
    assert all(naming_problems(path, model_words(toy.ENTRY)) == [] for path in shared)
    assert any(name == "ENTRY" for _, name in code_names(folder / "__init__.py"))


def test_the_top_level_folders_ask_for_its_script_and_card(toy, tmp_path):
    conversion_dir, card_dir = tmp_path / "conversion", tmp_path / "model_cards"
    conversion_dir.mkdir()
    card_dir.mkdir()
    assert drift_problems([toy.ENTRY], conversion_dir, card_dir, set()) == [
        "conversion/ lacks convert_toy_original_checkpoint.py", "model_cards/ lacks toy.md"]
    assert len(entry_problems(toy.ENTRY, toy, conversion_dir, card_dir)) == 2
    (conversion_dir / toy.ENTRY.conversion_script).write_text(conversion_script(toy.ENTRY))
    (card_dir / "toy.md").write_text("---\n{{ card_data }}\n---\n# Toy\n")
    assert drift_problems([toy.ENTRY], conversion_dir, card_dir, set()) == []
    assert entry_problems(toy.ENTRY, toy, conversion_dir, card_dir) == []
    stub = package_stub(MODELS)  # what hf_ext/__init__.pyi would read with the toy listed
    assert "from hf_ext_toy import ToyConfig as ToyConfig\nfrom hf_ext_toy import ToyModel as ToyModel\n" in stub


def test_the_docs_and_the_bad_input_table_ask_for_its_sections_and_cases(toy):
    from hf_ext.cli import build_parser

    documented = sections((ROOT / "docs" / "cli.md").read_text(encoding="utf-8"))
    assert sorted(set(commands(build_parser())) - set(documented)) == [
        "hf-ext convert toy", "hf-ext toy", "hf-ext toy hidden-size"]
    assert table_problems(MODELS, model_test_modules("bad_input")) == [
        "hf_ext_toy has no tests/hf_ext_toy/bad_input_hf_ext_toy.py"]
