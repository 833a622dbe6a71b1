"""ERNIE 2.0 continual multi-task pre-training (Sun et al., AAAI 2020): transformers' ErnieModel with the heads of the
seven pre-training tasks. Converted checkpoints themselves are plain transformers `ernie` folders (`hf-ext convert
ernie2`); this model continues their pre-training."""

from transformers import AutoConfig, AutoModelForPreTraining

from .configuration_ernie2 import (
    IR_RELEVANCE_CLASSES,
    PRETRAINING_TASKS,
    SENTENCE_DISTANCE_CLASSES,
    TOKEN_LEVEL_TASKS,
    Ernie2PreTrainingConfig,
    sentence_reordering_classes,
)
from .modeling_ernie2 import (
    IGNORE_INDEX,
    Ernie2ForPreTraining,
    Ernie2PreTrainingOutput,
    encoder_settings,
    sentence_reordering_label,
    sentence_reordering_permutation,
    task_loss,
)

AUTO_MAP = {
    "AutoConfig": "configuration_ernie2.Ernie2PreTrainingConfig",
    "AutoModelForPreTraining": "modeling_ernie2.Ernie2ForPreTraining",
}


def register():
    AutoConfig.register(Ernie2PreTrainingConfig.model_type, Ernie2PreTrainingConfig, exist_ok=True)
    AutoModelForPreTraining.register(Ernie2PreTrainingConfig, Ernie2ForPreTraining, exist_ok=True)
    # saved folders carry the code and auto_map, so they load with trust_remote_code where hf_ext is not installed
    Ernie2PreTrainingConfig.register_for_auto_class()
    Ernie2ForPreTraining.register_for_auto_class("AutoModelForPreTraining")


__all__ = ["AUTO_MAP", "Ernie2ForPreTraining", "Ernie2PreTrainingConfig", "Ernie2PreTrainingOutput", "IGNORE_INDEX",
           "IR_RELEVANCE_CLASSES", "PRETRAINING_TASKS", "SENTENCE_DISTANCE_CLASSES", "TOKEN_LEVEL_TASKS",
           "encoder_settings", "register", "sentence_reordering_classes", "sentence_reordering_label",
           "sentence_reordering_permutation", "task_loss"]
