"""Universal Transformer with Adaptive Computation Time (Dehghani et al., ICLR 2019), as tensor2tensor implements it."""

from transformers import PreTrainedModel

from ...registration import CustomPipeline, LoraPlan, ModelEntry
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
from .pipeline_universal_transformer import PIPELINE_TASK, UniversalTransformerText2TextPipeline


def _lora_task_type(model: PreTrainedModel) -> str | None:
    if model.can_generate():
        return "SEQ_2_SEQ_LM"  # PeftModelForSeq2SeqLM, which generates
    return "SEQ_CLS" if hasattr(model, "classifier") else "FEATURE_EXTRACTION"


ENTRY = ModelEntry(
    package=__name__,
    display_name="Universal Transformer",
    config_class=UniversalTransformerConfig,
    auto_classes={
        "AutoModel": UniversalTransformerModel,
        "AutoModelForSequenceClassification": UniversalTransformerForSequenceClassification,
        "AutoModelForSeq2SeqLM": UniversalTransformerForSeq2SeqLM,
    },
    top_level=("UniversalTransformerConfig", "UniversalTransformerForSeq2SeqLM",
               "UniversalTransformerForSequenceClassification", "UniversalTransformerModel"),
    card_template="universal_transformer",
    conversion_script="convert_universal_transformer_original_checkpoint.py",
    # attention and the transition function of any kind (fc, sepconv, conv); the halting units and the classifier
    # in full (the seq2seq output layer is the shared embedding and stays frozen)
    lora=LoraPlan(
        ("q_proj", "k_proj", "v_proj", "o_proj", "fc1", "fc2", "pointwise1", "pointwise2", "conv1", "conv2"),
        lambda model: (["halting"] if model.config.use_act else []) + (
            ["classifier"] if hasattr(model, "classifier") else []),
        task_type=_lora_task_type),
    app="app",
    app_summary="the Universal Transformer's halting map",
    export_onnx="export_onnx",
    # text to text through generate(): in the seq2seq model's folders only (the bAbI classifier reads embeddings)
    pipelines={PIPELINE_TASK: CustomPipeline(UniversalTransformerText2TextPipeline, ("AutoModelForSeq2SeqLM",), "text",
                                             model_classes=(UniversalTransformerForSeq2SeqLM,))},
)

__all__ = ["ENTRY", "UniversalTransformerConfig",
           "UniversalTransformerForSeq2SeqLM", "UniversalTransformerForSequenceClassification",
           "UniversalTransformerModel", "UniversalTransformerModelOutput", "UniversalTransformerPreTrainedModel",
           "UniversalTransformerSeq2SeqLMOutput", "UniversalTransformerSequenceClassifierOutput",
           "UniversalTransformerText2TextPipeline", "timing_signal"]
