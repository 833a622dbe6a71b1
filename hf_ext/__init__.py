"""hf-ext: research models as first-class Hugging Face transformers models.

Importing the package registers every model with `AutoConfig`, the fitting `AutoModel*` classes and `AutoProcessor`.
"""

from .models import optimus
from .models.optimus import (
    OptimusConfig,
    OptimusForSequenceClassification,
    OptimusLatentSpace,
    OptimusModel,
    OptimusProcessor,
)

optimus.register()

__version__ = "0.1.0"

__all__ = ["OptimusConfig", "OptimusForSequenceClassification", "OptimusLatentSpace", "OptimusModel", "OptimusProcessor", "__version__"]
