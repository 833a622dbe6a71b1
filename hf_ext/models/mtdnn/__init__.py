"""MT-DNN: one encoder (BERT or any other) with linear, SAN and token-level task heads (Liu et al., ACL 2019)."""

from ...registration import ENCODER_ATTENTION, CustomPipeline, LoraPlan, ModelEntry
from .configuration_mtdnn import MTDNNConfig
from .modeling_mtdnn import (
    MTDNNForQuestionAnswering,
    MTDNNForSequenceClassification,
    MTDNNForTokenClassification,
    MTDNNModel,
    MTDNNOutput,
    MTDNNPreTrainedModel,
    MTDNNSANStates,
    premise_hypothesis_masks,
    task_loss,
)
from .pipeline_mtdnn import FEATURE_TASK, PIPELINE_TASK, MTDNNFeatureExtractionPipeline, MTDNNPipeline

ENTRY = ModelEntry(
    package=__name__,
    display_name="MT-DNN",
    config_class=MTDNNConfig,
    auto_classes={"AutoModel": MTDNNModel, "AutoModelForSequenceClassification": MTDNNForSequenceClassification,
                  "AutoModelForTokenClassification": MTDNNForTokenClassification,
                  "AutoModelForQuestionAnswering": MTDNNForQuestionAnswering},
    top_level=("MTDNNConfig", "MTDNNForQuestionAnswering", "MTDNNForSequenceClassification",
               "MTDNNForTokenClassification", "MTDNNModel"),
    card_template="mtdnn",
    conversion_script="convert_mtdnn_original_checkpoint.py",
    # the shared encoder's self-attention; every task head in full
    lora=LoraPlan(ENCODER_ATTENTION, lambda model: [f"heads.{name}" for name in model.config.task_names]),
    app="app",
    app_summary="MT-DNN's predictions of every task head",
    export_onnx="export_onnx",
    pipelines={PIPELINE_TASK: CustomPipeline(MTDNNPipeline, ("AutoModel",), "text"),
               FEATURE_TASK: CustomPipeline(MTDNNFeatureExtractionPipeline, ("AutoModel",), "text")},
)

__all__ = ["ENTRY", "MTDNNConfig", "MTDNNForQuestionAnswering", "MTDNNForSequenceClassification",
           "MTDNNForTokenClassification", "MTDNNModel", "MTDNNOutput",
           "MTDNNFeatureExtractionPipeline", "MTDNNPipeline", "MTDNNPreTrainedModel", "MTDNNSANStates",
           "premise_hypothesis_masks", "task_loss"]
