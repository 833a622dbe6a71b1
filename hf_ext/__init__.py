"""hf-ext: research models as first-class Hugging Face transformers models.

Importing the package registers every model with `AutoConfig`, the fitting `AutoModel*` classes and `AutoProcessor`,
and makes each model's main classes available here (`hf_ext.OptimusModel`, ...): those its package lists in
`TOP_LEVEL`.
"""

import importlib

from .models import MODELS

__version__ = "0.1.0"

__all__ = ["MODELS", "__version__"]

for _name in MODELS:
    _package = importlib.import_module(f".models.{_name}", __name__)
    _package.register()
    for _symbol in _package.TOP_LEVEL:
        globals()[_symbol] = getattr(_package, _symbol)
    __all__ += _package.TOP_LEVEL
