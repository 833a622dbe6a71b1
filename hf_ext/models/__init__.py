"""The models of hf-ext, one package each (docs/adding_a_model.md lists what a package holds).

In each package, `configuration_*`, `modeling_*` and `processing_*` import only torch, transformers and their own
folder, since they are pushed to the Hub as remote code; the package's other modules (conversion, training, data,
commands, samples) build on the shared layer in `hf_ext/`. No package imports another."""

import importlib
import importlib.util
from types import ModuleType

MODELS = ("optimus", "universal_transformer", "mtdnn", "ernie2")  # the one list of the models


def modules_by_model_type(kind: str) -> dict[str, ModuleType]:
    """`{model_type: module}` over the models whose package has the optional module `kind` (`"app"`,
    `"export_onnx"`): each such module names the config model types it serves in `MODEL_TYPES`. Imported only when
    asked for, since these modules build on optional extras."""
    found = {}
    for name in MODELS:
        module_name = f"hf_ext.models.{name}.{kind}"
        if importlib.util.find_spec(module_name) is not None:
            module = importlib.import_module(module_name)
            found.update(dict.fromkeys(module.MODEL_TYPES, module))
    return found
