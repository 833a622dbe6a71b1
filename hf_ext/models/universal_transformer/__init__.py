"""Universal Transformer with Adaptive Computation Time (Dehghani et al., ICLR 2019), as tensor2tensor implements it."""

from ...registration import auto_map, register_auto_classes
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

AUTO_CLASSES = {
    "AutoModel": UniversalTransformerModel,
    "AutoModelForSequenceClassification": UniversalTransformerForSequenceClassification,
    "AutoModelForSeq2SeqLM": UniversalTransformerForSeq2SeqLM,
}
AUTO_MAP = auto_map(UniversalTransformerConfig, AUTO_CLASSES)

TOP_LEVEL = ["UniversalTransformerConfig", "UniversalTransformerForSeq2SeqLM",
             "UniversalTransformerForSequenceClassification", "UniversalTransformerModel"]  # re-exported by hf_ext

def register() -> None:
    """Register the model with transformers' Auto classes (done by `import hf_ext`)."""
    register_auto_classes(UniversalTransformerConfig, AUTO_CLASSES)


__all__ = ["AUTO_CLASSES", "AUTO_MAP", "TOP_LEVEL", "UniversalTransformerConfig",
           "UniversalTransformerForSeq2SeqLM", "UniversalTransformerForSequenceClassification",
           "UniversalTransformerModel", "UniversalTransformerModelOutput", "UniversalTransformerPreTrainedModel",
           "UniversalTransformerSeq2SeqLMOutput", "UniversalTransformerSequenceClassifierOutput", "register",
           "timing_signal"]
