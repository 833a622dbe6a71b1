# What `hf_ext/__init__.py` exports, for type checkers: written from MODELS by `package_stub` in
# tests/model_layout.py; tests/test_layout.py prints the text when it no longer matches.
from hf_ext.models import MODELS as MODELS
from hf_ext.models.ernie2 import Ernie2ForPreTraining as Ernie2ForPreTraining
from hf_ext.models.ernie2 import Ernie2PreTrainingConfig as Ernie2PreTrainingConfig
from hf_ext.models.mtdnn import MTDNNConfig as MTDNNConfig
from hf_ext.models.mtdnn import MTDNNForQuestionAnswering as MTDNNForQuestionAnswering
from hf_ext.models.mtdnn import MTDNNForSequenceClassification as MTDNNForSequenceClassification
from hf_ext.models.mtdnn import MTDNNForTokenClassification as MTDNNForTokenClassification
from hf_ext.models.mtdnn import MTDNNModel as MTDNNModel
from hf_ext.models.optimus import OptimusConfig as OptimusConfig
from hf_ext.models.optimus import OptimusForSequenceClassification as OptimusForSequenceClassification
from hf_ext.models.optimus import OptimusLatentSpace as OptimusLatentSpace
from hf_ext.models.optimus import OptimusModel as OptimusModel
from hf_ext.models.optimus import OptimusProcessor as OptimusProcessor
from hf_ext.models.universal_transformer import UniversalTransformerConfig as UniversalTransformerConfig
from hf_ext.models.universal_transformer import UniversalTransformerForSeq2SeqLM as UniversalTransformerForSeq2SeqLM
from hf_ext.models.universal_transformer import (
    UniversalTransformerForSequenceClassification as UniversalTransformerForSequenceClassification,
)
from hf_ext.models.universal_transformer import UniversalTransformerModel as UniversalTransformerModel

__version__: str

__all__ = [
    "MODELS",
    "__version__",
    "OptimusConfig",
    "OptimusForSequenceClassification",
    "OptimusLatentSpace",
    "OptimusModel",
    "OptimusProcessor",
    "UniversalTransformerConfig",
    "UniversalTransformerForSeq2SeqLM",
    "UniversalTransformerForSequenceClassification",
    "UniversalTransformerModel",
    "MTDNNConfig",
    "MTDNNForQuestionAnswering",
    "MTDNNForSequenceClassification",
    "MTDNNForTokenClassification",
    "MTDNNModel",
    "Ernie2ForPreTraining",
    "Ernie2PreTrainingConfig",
]
