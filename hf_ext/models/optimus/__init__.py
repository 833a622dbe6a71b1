"""Optimus: BERT encoder -> Gaussian latent -> GPT-2 decoder (Li et al., EMNLP 2020)."""

from transformers import AutoConfig, AutoModel, AutoModelForSequenceClassification, AutoProcessor

from .configuration_optimus import OptimusConfig
from .modeling_optimus import (
    OptimusForSequenceClassification,
    OptimusModel,
    OptimusOutput,
    OptimusPreTrainedModel,
    kl_divergence,
    kl_per_dimension,
    reconstruction_loss,
)
from .latent_space import OptimusLatentSpace
from .processing_optimus import OptimusProcessor

AUTO_MAP = {
    "AutoConfig": "configuration_optimus.OptimusConfig",
    "AutoModel": "modeling_optimus.OptimusModel",
    "AutoModelForSequenceClassification": "modeling_optimus.OptimusForSequenceClassification",
}


def register():
    AutoConfig.register(OptimusConfig.model_type, OptimusConfig, exist_ok=True)
    AutoModel.register(OptimusConfig, OptimusModel, exist_ok=True)
    AutoModelForSequenceClassification.register(OptimusConfig, OptimusForSequenceClassification, exist_ok=True)
    AutoProcessor.register(OptimusConfig, OptimusProcessor, exist_ok=True)
    # saved folders carry the code and auto_map, so they load with trust_remote_code where hf_ext is not installed
    OptimusConfig.register_for_auto_class()
    OptimusModel.register_for_auto_class("AutoModel")
    OptimusForSequenceClassification.register_for_auto_class("AutoModelForSequenceClassification")
    OptimusProcessor.register_for_auto_class("AutoProcessor")


__all__ = ["AUTO_MAP", "OptimusConfig", "OptimusForSequenceClassification", "OptimusLatentSpace", "OptimusModel", "OptimusOutput",
           "OptimusPreTrainedModel", "OptimusProcessor", "kl_divergence", "kl_per_dimension", "reconstruction_loss",
           "register"]
