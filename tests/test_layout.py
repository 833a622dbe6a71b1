"""The package's layout rules (docs/architecture.md), checked with the functions of `tests/model_layout.py`: one folder
per model, declared once by its `ENTRY` and listed once in `MODELS`, that no other model and no shared module imports,
whose remote-code files import only torch, transformers and their own folder (as transformers counts imports); no
import loop anywhere, no module importing the entry point, a shared layer that names no model, and the top-level
`conversion/` and `model_cards/` folders made from the entries."""

import ast
import importlib
from pathlib import Path

import pytest
from model_layout import (
    REMOTE_CODE_PREFIXES,
    conversion_script,
    drift_problems,
    entry_problems,
    import_cycles,
    import_graph,
    imported_modules,
    model_words,
    naming_problems,
    package_import_problems,
    package_stub,
    remote_code_problems,
)

from hf_ext.models import MODELS, PACKAGES

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "hf_ext"
MODEL_DIRS = sorted(path for path in (PACKAGE / "models").iterdir() if (path / "__init__.py").is_file())
CONVERSION_DIR = ROOT / "conversion"
CARD_DIR = ROOT / "model_cards"
# rendered for every model: by hf_ext/onnx_export.py, and by hf_ext/hub.py for training outputs
SHARED_CARDS = {"onnx", "training"}
# the evaluate metric scripts are named after the protocol they implement (a paper's metrics, as evaluate names
# "squad" or "bleu"), are loaded by path and import nothing of hf-ext
NAMING_EXEMPT = PACKAGE / "metrics"
SHARED_LAYER = [path for path in PACKAGE.rglob("*.py") if "models" not in path.relative_to(PACKAGE).parts]


def test_models_lists_every_model_folder_once():
    assert sorted(entry.name for entry in MODELS) == [path.name for path in MODEL_DIRS] == sorted(PACKAGES)
    assert len({entry.model_type for entry in MODELS}) == len(MODELS)


@pytest.mark.parametrize("entry", MODELS, ids=lambda entry: entry.name)
def test_remote_code_files_import_only_torch_transformers_and_their_own_folder(entry):
    assert remote_code_problems(PACKAGE / "models" / entry.name) == []


def test_the_remote_code_check_counts_imports_as_transformers_does(tmp_path):
    """Indented imports count (a YAML parser imported inside a method is still needed to load the folder), imports in
    try/except do not, and a relative import must reach a remote-code file of the folder."""
    (tmp_path / "configuration_x.py").write_text("import math\n")
    (tmp_path / "modeling_x.py").write_text(
        "import torch\nfrom .configuration_x import XConfig\n\ndef parse(text):\n    import yaml\n\n"
        "try:\n    import numpy\nexcept ImportError:\n    pass\n")
    (tmp_path / "processing_x.py").write_text("from .samples import TEXTS\nfrom . import modeling_x\n")
    problems = remote_code_problems(tmp_path)
    assert len(problems) == 3
    assert problems[0].startswith("modeling_x.py imports yaml: remote code may import only")
    assert problems[1] == "processing_x.py imports .samples, which is not a remote-code file of its folder"
    assert problems[2].startswith("processing_x.py:2: only `from .module import name`")
    assert remote_code_problems(tmp_path / "nothing") == [f"{tmp_path / 'nothing'} has no modeling_ file"]


@pytest.mark.parametrize("entry", MODELS, ids=lambda entry: entry.name)
def test_a_model_imports_only_the_shared_layer_and_its_own_folder(entry):
    assert package_import_problems(PACKAGE / "models" / entry.name, ROOT, [e.package for e in MODELS]) == []


def test_the_shared_layer_imports_no_model():
    assert SHARED_LAYER
    for path in SHARED_LAYER:
        models = [name for name in imported_modules(path, ROOT)
                  if name.startswith("hf_ext.models.") and name.split(".")[2] in PACKAGES]
        assert models == [], f"{path.relative_to(ROOT)} imports {models}: shared code reaches models through MODELS"


def test_the_shared_layer_names_no_model():
    words = set().union(*(model_words(entry) for entry in MODELS))
    problems = [problem for path in SHARED_LAYER if not path.is_relative_to(NAMING_EXEMPT)
                for problem in naming_problems(path, words)]
    assert problems == [], "the shared layer names a model (read it from MODELS instead):\n" + "\n".join(problems)


def test_the_naming_check_reads_code_not_prose(tmp_path):
    source = tmp_path / "shared.py"
    source.write_text('"""Formats as the Optimus code writes them."""\n\n# like mt-dnn\nPLANS = {"mt-dnn": 1}\n'
                      'def optimus_plan():\n    """Optimus."""\n    return "hf_ext.models.optimus"\n'
                      'METRIC = "optimus_lm"\n')
    assert naming_problems(source, {"optimus", "mt-dnn"}) == [
        "shared.py:4 names 'mt-dnn' in 'mt-dnn'", "shared.py:7 names 'optimus' in 'hf_ext.models.optimus'"]


def test_no_import_loop_and_nothing_imports_the_entry_point():
    graph = import_graph(ROOT, "hf_ext")
    assert len(graph) > 40 and "hf_ext.cli_utils" in graph["hf_ext.cli"]
    assert import_cycles(graph) == []
    assert [module for module, targets in graph.items() if "hf_ext.cli" in targets] == []


def test_the_loop_check_finds_a_loop_through_a_type_hint(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "data.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                     "    from .training import Schedule\n")
    (package / "training.py").write_text("from . import data\nfrom .data import load\n")
    (package / "cli.py").write_text("import pkg.training\n")
    graph = import_graph(tmp_path, "pkg")
    assert graph == {"pkg": set(), "pkg.cli": {"pkg.training"}, "pkg.data": {"pkg.training"},
                     "pkg.training": {"pkg.data"}}
    assert import_cycles(graph) == [["pkg.data", "pkg.training"]]


@pytest.mark.parametrize("entry", MODELS, ids=lambda entry: entry.name)
def test_each_model_declares_one_entry_that_names_what_exists(entry):
    package = importlib.import_module(entry.package)
    assert entry_problems(entry, package, CONVERSION_DIR, CARD_DIR) == []


def test_conversion_and_model_cards_hold_what_the_entries_name():
    assert drift_problems(MODELS, CONVERSION_DIR, CARD_DIR, SHARED_CARDS) == []
    assert conversion_script(MODELS[0]).count("convert_main(conversion)") == 1


def test_the_drift_check_finds_a_stray_and_a_missing_file(tmp_path):
    for folder in ("conversion", "model_cards"):
        (tmp_path / folder).mkdir()
    entry = MODELS[0]
    (tmp_path / "conversion" / "convert_old_checkpoint.py").write_text("")
    (tmp_path / "model_cards" / f"{entry.card_template}.md").write_text("")
    assert drift_problems([entry], tmp_path / "conversion", tmp_path / "model_cards", set()) == [
        "conversion/convert_old_checkpoint.py belongs to no model", f"conversion/ lacks {entry.conversion_script}"]


def test_the_package_stub_exports_what_the_package_exports():
    import hf_ext

    expected = package_stub(MODELS)
    stub = (PACKAGE / "__init__.pyi").read_text(encoding="utf-8")
    assert stub == expected, f"hf_ext/__init__.pyi must read:\n{expected}"
    assignments = {node.targets[0].id: node.value for node in ast.parse(expected).body if isinstance(node, ast.Assign)}
    assert ast.literal_eval(assignments["__all__"]) == hf_ext.__all__


def test_remote_code_prefixes_name_the_files_save_pretrained_copies():
    for entry in MODELS:
        for cls in (entry.config_class, *entry.auto_classes.values()):
            assert cls.__module__.rsplit(".", 1)[-1].startswith(REMOTE_CODE_PREFIXES), cls
