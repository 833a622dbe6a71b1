"""MT-DNN: multi-task BERT with linear and SAN heads (Liu et al., ACL 2019)."""

from ...registration import auto_map, register_auto_classes
from .configuration_mtdnn import MTDNNConfig
from .modeling_mtdnn import (
    MTDNNForSequenceClassification,
    MTDNNModel,
    MTDNNOutput,
    MTDNNPreTrainedModel,
    MTDNNSANStates,
    premise_hypothesis_masks,
    task_loss,
)

AUTO_CLASSES = {"AutoModel": MTDNNModel, "AutoModelForSequenceClassification": MTDNNForSequenceClassification}
AUTO_MAP = auto_map(MTDNNConfig, AUTO_CLASSES)

TOP_LEVEL = ["MTDNNConfig", "MTDNNForSequenceClassification", "MTDNNModel"]  # re-exported by hf_ext

def register() -> None:
    """Register the model with transformers' Auto classes (done by `import hf_ext`)."""
    register_auto_classes(MTDNNConfig, AUTO_CLASSES)


__all__ = ["AUTO_CLASSES", "AUTO_MAP", "TOP_LEVEL", "MTDNNConfig", "MTDNNForSequenceClassification",
           "MTDNNModel", "MTDNNOutput", "MTDNNPreTrainedModel", "MTDNNSANStates", "premise_hypothesis_masks",
           "register", "task_loss"]
