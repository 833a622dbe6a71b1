"""Optimus: BERT encoder -> Gaussian latent -> GPT-2 decoder (Li et al., EMNLP 2020)."""

from ...registration import BERT_ATTENTION, LoraPlan, ModelEntry
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

ENTRY = ModelEntry(
    package=__name__,
    display_name="Optimus",
    config_class=OptimusConfig,
    auto_classes={
        "AutoModel": OptimusModel,
        "AutoModelForSequenceClassification": OptimusForSequenceClassification,
        "AutoProcessor": OptimusProcessor,
    },
    top_level=("OptimusConfig", "OptimusForSequenceClassification", "OptimusLatentSpace", "OptimusModel",
               "OptimusProcessor"),
    card_template="optimus",
    conversion_script="convert_optimus_original_checkpoint.py",
    # BERT's self-attention and GPT-2's attention and MLP projections; the latent projections define the latent
    # space and are trained in full
    lora=LoraPlan(BERT_ATTENTION + ("c_attn", "c_proj"),
                  lambda model: ["to_latent", "latent_to_memory", "latent_to_embedding"], fan_in_fan_out=True),
    app="app",
    app_summary="Optimus' latent space (reconstruct, interpolate, analogy, sample, a map of the posterior means)",
    export_onnx="export_onnx",
)

__all__ = ["ENTRY", "OptimusConfig",
           "OptimusForSequenceClassification", "OptimusLatentSpace", "OptimusModel", "OptimusOutput",
           "OptimusPreTrainedModel", "OptimusProcessor", "kl_divergence", "kl_per_dimension", "reconstruction_loss"]
