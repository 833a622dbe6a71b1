"""MT-DNN: multi-task BERT with linear and SAN heads (Liu et al., ACL 2019)."""

from transformers import AutoConfig, AutoModel, AutoModelForSequenceClassification

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

AUTO_MAP = {
    "AutoConfig": "configuration_mtdnn.MTDNNConfig",
    "AutoModel": "modeling_mtdnn.MTDNNModel",
    "AutoModelForSequenceClassification": "modeling_mtdnn.MTDNNForSequenceClassification",
}


def register():
    AutoConfig.register(MTDNNConfig.model_type, MTDNNConfig, exist_ok=True)
    AutoModel.register(MTDNNConfig, MTDNNModel, exist_ok=True)
    AutoModelForSequenceClassification.register(MTDNNConfig, MTDNNForSequenceClassification, exist_ok=True)
    # saved folders carry the code and auto_map, so they load with trust_remote_code where hf_ext is not installed
    MTDNNConfig.register_for_auto_class()
    MTDNNModel.register_for_auto_class("AutoModel")
    MTDNNForSequenceClassification.register_for_auto_class("AutoModelForSequenceClassification")


__all__ = ["AUTO_MAP", "MTDNNConfig", "MTDNNForSequenceClassification", "MTDNNModel", "MTDNNOutput",
           "MTDNNPreTrainedModel", "MTDNNSANStates", "premise_hypothesis_masks", "register", "task_loss"]
