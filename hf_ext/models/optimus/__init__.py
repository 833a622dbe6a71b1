"""Optimus: BERT encoder -> Gaussian latent -> GPT-2 decoder (Li et al., EMNLP 2020)."""

from ...registration import auto_map, register_auto_classes
from .configuration_optimus import OptimusConfig
from .latent_space import OptimusLatentSpace
from .modeling_optimus import (
    OptimusForSequenceClassification,
    OptimusModel,
    OptimusOutput,
    OptimusPreTrainedModel,
    kl_divergence,
    kl_per_dimension,
    reconstruction_loss,
)
from .processing_optimus import OptimusProcessor

AUTO_CLASSES = {
    "AutoModel": OptimusModel,
    "AutoModelForSequenceClassification": OptimusForSequenceClassification,
    "AutoProcessor": OptimusProcessor,
}
AUTO_MAP = auto_map(OptimusConfig, AUTO_CLASSES)

TOP_LEVEL = ["OptimusConfig", "OptimusForSequenceClassification", "OptimusLatentSpace", "OptimusModel",
             "OptimusProcessor"]  # re-exported by hf_ext

def register() -> None:
    """Register the model with transformers' Auto classes (done by `import hf_ext`)."""
    register_auto_classes(OptimusConfig, AUTO_CLASSES)


__all__ = ["AUTO_CLASSES", "AUTO_MAP", "TOP_LEVEL", "OptimusConfig",
           "OptimusForSequenceClassification", "OptimusLatentSpace", "OptimusModel", "OptimusOutput",
           "OptimusPreTrainedModel", "OptimusProcessor", "kl_divergence", "kl_per_dimension", "reconstruction_loss",
           "register"]
