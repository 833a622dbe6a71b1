"""ERNIE 2.0 continual multi-task pre-training (Sun et al., AAAI 2020): transformers' ErnieModel with the heads of the
seven pre-training tasks. Converted checkpoints themselves are plain transformers `ernie` folders (`hf-ext convert
ernie2`); this model continues their pre-training."""

from ...registration import auto_map, register_auto_classes
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

AUTO_CLASSES = {"AutoModelForPreTraining": Ernie2ForPreTraining}
AUTO_MAP = auto_map(Ernie2PreTrainingConfig, AUTO_CLASSES)

TOP_LEVEL = ["Ernie2ForPreTraining", "Ernie2PreTrainingConfig"]  # re-exported by hf_ext

def register() -> None:
    """Register the model with transformers' Auto classes (done by `import hf_ext`)."""
    register_auto_classes(Ernie2PreTrainingConfig, AUTO_CLASSES)


__all__ = ["AUTO_CLASSES", "AUTO_MAP", "IGNORE_INDEX", "IR_RELEVANCE_CLASSES", "PRETRAINING_TASKS",
           "SENTENCE_DISTANCE_CLASSES", "TOKEN_LEVEL_TASKS", "TOP_LEVEL", "Ernie2ForPreTraining",
           "Ernie2PreTrainingConfig", "Ernie2PreTrainingOutput", "encoder_settings", "register",
           "sentence_reordering_classes", "sentence_reordering_label", "sentence_reordering_permutation", "task_loss"]
