"""hf-ext: research models as first-class Hugging Face transformers models.

Importing the package registers every model with `AutoConfig`, the fitting `AutoModel*` classes and `AutoProcessor`.
"""

from .models import ernie2, mtdnn, optimus, universal_transformer
from .models.ernie2 import Ernie2ForPreTraining, Ernie2PreTrainingConfig
from .models.mtdnn import MTDNNConfig, MTDNNForSequenceClassification, MTDNNModel
from .models.optimus import (
    OptimusConfig,
    OptimusForSequenceClassification,
    OptimusLatentSpace,
    OptimusModel,
    OptimusProcessor,
)
from .models.universal_transformer import (
    UniversalTransformerConfig,
    UniversalTransformerForSeq2SeqLM,
    UniversalTransformerForSequenceClassification,
    UniversalTransformerModel,
)

for _model in (optimus, universal_transformer, mtdnn, ernie2):
    _model.register()

__version__ = "0.1.0"

__all__ = [
    "Ernie2ForPreTraining",
    "Ernie2PreTrainingConfig",
    "MTDNNConfig",
    "MTDNNForSequenceClassification",
    "MTDNNModel",
    "OptimusConfig",
    "OptimusForSequenceClassification",
    "OptimusLatentSpace",
    "OptimusModel",
    "OptimusProcessor",
    "UniversalTransformerConfig",
    "UniversalTransformerForSeq2SeqLM",
    "UniversalTransformerForSequenceClassification",
    "UniversalTransformerModel",
    "__version__",
]
