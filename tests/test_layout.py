"""The package's layout rules (docs/architecture.md): one folder per model, listed once, that no other model and
no shared module imports, and whose remote-code files import only torch, transformers and their own folder."""

import ast
import importlib
import sys
from pathlib import Path

import pytest

from hf_ext.models import MODELS

PACKAGE = Path(__file__).resolve().parents[1] / "hf_ext"
MODEL_DIRS = sorted(path for path in (PACKAGE / "models").iterdir() if (path / "__init__.py").is_file())
REMOTE_CODE_PREFIXES = ("configuration_", "modeling_", "processing_")
# installed with transformers wherever it is (its own requirements), so remote code may use them too
TRANSFORMERS_REQUIREMENTS = ("yaml", "numpy", "huggingface_hub", "safetensors", "tokenizers")


def imported_modules(path: Path) -> list[str]:
    """Every module `path` imports, as absolute names (relative imports resolved against its package)."""
    package = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1])
    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
                # `from . import x` may import a submodule x
                names += [module] + ([f"{module}.{alias.name}" for alias in node.names] if not node.module else [])
            else:
                names.append(node.module)
    return names


def test_models_lists_every_model_folder_once():
    assert sorted(MODELS) == [path.name for path in MODEL_DIRS] and len(set(MODELS)) == len(MODELS)


@pytest.mark.parametrize("folder", MODEL_DIRS, ids=lambda path: path.name)
def test_remote_code_files_import_only_torch_transformers_and_their_own_folder(folder):
    files = [path for path in folder.glob("*.py") if path.name.startswith(REMOTE_CODE_PREFIXES)]
    assert any(path.name.startswith("modeling_") for path in files)
    own = {f"hf_ext.models.{folder.name}.{path.stem}" for path in files}
    for path in files:
        for name in imported_modules(path):
            top = name.split(".")[0]
            allowed = top in ("torch", "transformers", *TRANSFORMERS_REQUIREMENTS) or top in sys.stdlib_module_names \
                or name in own
            assert allowed, f"{path.relative_to(PACKAGE.parent)} imports {name}: remote code may import only torch, " \
                            "transformers, the standard library and the other remote-code files of its folder"


@pytest.mark.parametrize("folder", MODEL_DIRS, ids=lambda path: path.name)
def test_no_model_imports_another_model(folder):
    others = [f"hf_ext.models.{name}" for name in MODELS if name != folder.name]
    for path in folder.rglob("*.py"):
        for name in imported_modules(path):
            assert not any(name == other or name.startswith(other + ".") for other in others), \
                f"{path.relative_to(PACKAGE.parent)} imports {name}, a module of another model"


def test_the_shared_layer_imports_no_model():
    shared = [path for path in PACKAGE.rglob("*.py") if "models" not in path.relative_to(PACKAGE).parts]
    assert shared
    for path in shared:
        for name in imported_modules(path):
            assert name == "hf_ext.models" or not name.startswith("hf_ext.models"), \
                f"{path.relative_to(PACKAGE.parent)} imports {name}: shared code reaches models through MODELS only"


@pytest.mark.parametrize("name", MODELS)
def test_each_model_package_offers_the_same_entry_points(name):
    package = importlib.import_module(f"hf_ext.models.{name}")
    assert callable(package.register) and package.AUTO_CLASSES and set(package.TOP_LEVEL) <= set(dir(package))
    conversion = importlib.import_module(f"hf_ext.models.{name}.conversion")
    assert conversion.CONVERT_NAME and conversion.CONVERT_SUMMARY
    assert callable(conversion.add_arguments) and callable(conversion.run)
    assert callable(importlib.import_module(f"hf_ext.models.{name}.commands").register)
