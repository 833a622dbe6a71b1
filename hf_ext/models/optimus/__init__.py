"""Optimus: encoder -> Gaussian latent -> causal decoder (Li et al., EMNLP 2020: BERT -> GPT-2)."""

from ...registration import ENCODER_ATTENTION, CustomPipeline, LoraPlan, ModelEntry
from .configuration_optimus import DECODER_ATTENTION, OptimusConfig
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
from .pipeline_optimus import (
    FEATURE_TASK,
    GENERATION_TASK,
    OptimusFeatureExtractionPipeline,
    OptimusTextGenerationPipeline,
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
    # the encoder's self-attention, GPT-2's attention and MLP projections, the other decoders' attention projections
    # (Llama, Qwen, Mistral, Gemma); the latent projections define the latent space and are trained in full
    lora=LoraPlan(ENCODER_ATTENTION + DECODER_ATTENTION,
                  lambda model: ["to_latent", "latent_to_memory", "latent_to_embedding"], fan_in_fan_out=True),
    app="app",
    app_summary="Optimus' latent space (reconstruct, interpolate, analogy, sample, a map of the posterior means)",
    export_onnx="export_onnx",
    # the stock task names, served by Optimus' own pipelines in the folders of the model with a decoder (the
    # classifier's folders keep transformers' text-classification)
    pipelines={task: CustomPipeline(pipeline_class, ("AutoModel",), "text", model_classes=(OptimusModel,))
               for task, pipeline_class in ((GENERATION_TASK, OptimusTextGenerationPipeline),
                                            (FEATURE_TASK, OptimusFeatureExtractionPipeline))},
)

__all__ = ["ENTRY", "OptimusConfig",
           "OptimusFeatureExtractionPipeline", "OptimusForSequenceClassification", "OptimusLatentSpace", "OptimusModel",
           "OptimusOutput", "OptimusTextGenerationPipeline",
           "OptimusPreTrainedModel", "OptimusProcessor", "kl_divergence", "kl_per_dimension", "reconstruction_loss"]
