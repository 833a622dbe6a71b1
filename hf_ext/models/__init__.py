"""The models of hf-ext, one package each (docs/adding_a_model.md lists what a package holds), and `MODELS`: the
entries they declare (`ENTRY`, a `hf_ext.registration.ModelEntry`), the one list through which the shared layer
reaches them.

In each package, `configuration_*`, `modeling_*`, `processing_*` and `pipeline_*` import only torch, transformers
and their own folder, since they are pushed to the Hub as remote code; the package's other modules (conversion,
training, data, commands, samples) build on the shared layer in `hf_ext/`. No package imports another."""

import importlib
from types import ModuleType

from ..registration import ModelEntry

PACKAGES = ("optimus", "universal_transformer", "mtdnn", "ernie2")  # the folders here: the one line a model adds
MODELS: list[ModelEntry] = [importlib.import_module(f"{__name__}.{name}").ENTRY for name in PACKAGES]


def add_model(entry: ModelEntry) -> None:
    """List a model whose package lives outside `hf_ext/models/` (a plug-in, a test's toy model) and register it
    with the Auto classes: the command line built after this call, `hf-ext serve`, `hf-ext export onnx` and
    `hf_ext.lora` find it as they find the others. `MODELS.remove(entry)` takes it off the list again."""
    for known in MODELS:
        if entry.name == known.name or entry.model_type == known.model_type:
            raise ValueError(f"a model named {entry.name!r} or of model type {entry.model_type!r} is listed already")
    entry.register()
    MODELS.append(entry)


def model_entry(model_type: str) -> ModelEntry | None:
    """The entry of the model whose configuration has `model_type`, if hf-ext has one."""
    return next((entry for entry in MODELS if entry.model_type == model_type), None)


def modules_by_model_type(kind: str) -> dict[str, ModuleType]:
    """`{model_type: module}` over the models whose entry names the optional module `kind` (`"app"`,
    `"export_onnx"`): each such module names the config model types it serves in `MODEL_TYPES`. Imported only when
    asked for, since these modules build on optional extras."""
    found = {}
    for entry in MODELS:
        module_name = getattr(entry, kind)
        if module_name is not None:
            module = entry.module(module_name)
            found.update(dict.fromkeys(module.MODEL_TYPES, module))
    return found


__all__ = ["MODELS", "PACKAGES", "add_model", "model_entry", "modules_by_model_type"]
