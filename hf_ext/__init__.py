"""hf-ext: research models as first-class Hugging Face transformers models.

Importing the package registers every model of `MODELS` with `AutoConfig`, the fitting `AutoModel*` classes and
`AutoProcessor`, and makes each model's main classes available here (`hf_ext.OptimusModel`, ...): those its entry
lists in `top_level`.
"""

import importlib

from .models import MODELS

__version__ = "0.1.0"

__all__ = ["MODELS", "__version__"]

for _entry in MODELS:
    _entry.register()
    _package = importlib.import_module(_entry.package)
    for _symbol in _entry.top_level:
        globals()[_symbol] = getattr(_package, _symbol)
    __all__ += _entry.top_level
