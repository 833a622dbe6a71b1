"""ERNIE 2.0 continual multi-task pre-training (Sun et al., AAAI 2020): transformers' ErnieModel with the heads of the
seven pre-training tasks. Converted checkpoints themselves are plain transformers `ernie` folders (`hf-ext convert
ernie2`); this model continues their pre-training."""

from ...registration import ModelEntry
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

# Converted checkpoints are transformers' own `ernie` folders, which `hf-ext export onnx` exports; the pre-training
# model registered here takes no LoRA and has no app.
ENTRY = ModelEntry(
    package=__name__,
    display_name="ERNIE 2.0",
    config_class=Ernie2PreTrainingConfig,
    auto_classes={"AutoModelForPreTraining": Ernie2ForPreTraining},
    top_level=("Ernie2ForPreTraining", "Ernie2PreTrainingConfig"),
    card_template="ernie2",
    conversion_script="convert_ernie2_paddle_checkpoint.py",
    export_onnx="export_onnx",
)

__all__ = ["ENTRY", "IGNORE_INDEX", "IR_RELEVANCE_CLASSES", "PRETRAINING_TASKS", "SENTENCE_DISTANCE_CLASSES",
           "TOKEN_LEVEL_TASKS", "Ernie2ForPreTraining", "Ernie2PreTrainingConfig", "Ernie2PreTrainingOutput",
           "encoder_settings", "sentence_reordering_classes", "sentence_reordering_label",
           "sentence_reordering_permutation", "task_loss"]
