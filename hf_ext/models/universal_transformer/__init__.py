"""Universal Transformer with Adaptive Computation Time (Dehghani et al., ICLR 2019), as tensor2tensor implements it."""

from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM, AutoModelForSequenceClassification

from .configuration_universal_transformer import UniversalTransformerConfig
from .modeling_universal_transformer import (
    UniversalTransformerForSeq2SeqLM,
    UniversalTransformerForSequenceClassification,
    UniversalTransformerModel,
    UniversalTransformerModelOutput,
    UniversalTransformerPreTrainedModel,
    UniversalTransformerSeq2SeqLMOutput,
    UniversalTransformerSequenceClassifierOutput,
    timing_signal,
)

AUTO_MAP = {
    "AutoConfig": "configuration_universal_transformer.UniversalTransformerConfig",
    "AutoModel": "modeling_universal_transformer.UniversalTransformerModel",
    "AutoModelForSequenceClassification":
        "modeling_universal_transformer.UniversalTransformerForSequenceClassification",
    "AutoModelForSeq2SeqLM": "modeling_universal_transformer.UniversalTransformerForSeq2SeqLM",
}


def register():
    AutoConfig.register(UniversalTransformerConfig.model_type, UniversalTransformerConfig, exist_ok=True)
    AutoModel.register(UniversalTransformerConfig, UniversalTransformerModel, exist_ok=True)
    AutoModelForSequenceClassification.register(UniversalTransformerConfig,
                                                UniversalTransformerForSequenceClassification, exist_ok=True)
    AutoModelForSeq2SeqLM.register(UniversalTransformerConfig, UniversalTransformerForSeq2SeqLM, exist_ok=True)
    # saved folders carry the code and auto_map, so they load with trust_remote_code where hf_ext is not installed
    UniversalTransformerConfig.register_for_auto_class()
    UniversalTransformerModel.register_for_auto_class("AutoModel")
    UniversalTransformerForSequenceClassification.register_for_auto_class("AutoModelForSequenceClassification")
    UniversalTransformerForSeq2SeqLM.register_for_auto_class("AutoModelForSeq2SeqLM")


__all__ = ["AUTO_MAP", "UniversalTransformerConfig", "UniversalTransformerForSeq2SeqLM",
           "UniversalTransformerForSequenceClassification", "UniversalTransformerModel",
           "UniversalTransformerModelOutput", "UniversalTransformerPreTrainedModel",
           "UniversalTransformerSeq2SeqLMOutput", "UniversalTransformerSequenceClassifierOutput", "register",
           "timing_signal"]
