"""Knowledge distillation of MT-DNN from teacher ensembles (Liu et al. 2019, "Improving Multi-Task Deep Neural
Networks via Knowledge Distillation for Natural Language Understanding"): the soft targets are the mean of the
ensemble's class probabilities, and the distillation term of a batch is the original's (`mt_dnn/model.py`,
`mt_dnn/loss.py` at namisan/mt-dnn HEAD 3228e7c).
"""

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch.nn import functional as F

from ...errors import HfExtError
from ...lora import unwrap
from .configuration_mtdnn import TOKEN_TASK_TYPES
from .data import MTDNNCollator, soft_label_width
from .modeling_mtdnn import MTDNNModel, MTDNNOutput

if TYPE_CHECKING:  # datasets and peft are imported only when used
    from datasets import Dataset
    from peft import PeftModel

KD_LOSSES = ("soft_ce", "mse")


def distillation_loss(spec: dict[str, Any], outputs: MTDNNOutput, soft_labels: torch.Tensor, kd_loss: str = "soft_ce",
                      ) -> torch.Tensor:
    """The distillation term of a batch of task `spec`: soft cross-entropy between the soft targets and the model's
    distribution (MT-DNN-KD), or the original's `MseCriterion` between the head's output and the soft targets.
    Ranking compares the candidate distribution of each group; regression is always the squared error to the
    teachers' mean score. (A SAN head outputs log-probabilities: their log-softmax is themselves.)"""
    logits = outputs.group_logits if spec["type"] == "ranking" else outputs.logits
    assert logits is not None  # MTDNNModel's output holds them (grouped for a ranking task)
    if spec["type"] == "regression":
        return F.mse_loss(logits.view(-1), soft_labels.view(-1).to(logits.dtype))
    soft_labels = soft_labels.to(logits.dtype)
    if kd_loss == "mse":
        return F.mse_loss(logits, soft_labels)
    return -(soft_labels * F.log_softmax(logits, -1)).sum(-1).mean()


@torch.no_grad()
def teacher_soft_labels(teachers: Sequence["MTDNNModel | PeftModel"], dataset: "Dataset", task: str,
                        batch_size: int = 32, collator: MTDNNCollator | None = None) -> list[list[float]]:
    """Soft targets of a task's rows from an ensemble (MT-DNN-KD): per row, the mean over the teachers of their class
    probabilities (softmax of the head's output; for ranking, of each group's candidate scores; for regression the
    mean predicted score). Teachers are `MTDNNModel`s holding `task` (a name) with the same type and label count."""
    if not teachers:
        raise HfExtError("give at least one teacher model")
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    specs = []
    for number, teacher in enumerate(teachers, 1):
        try:
            spec = unwrap(teacher).config.task(task)
        except ValueError as error:
            raise HfExtError(f"teacher {number}: {error}") from None
        specs.append(spec)
    if len({(spec["type"], soft_label_width(spec)) for spec in specs}) != 1:
        raise HfExtError(f"the teachers disagree on task {task}: " + "; ".join(
            f"teacher {n}: {s['type']} with {soft_label_width(s)} outputs" for n, s in enumerate(specs, 1)))
    task_type = specs[0]["type"]
    if task_type in TOKEN_TASK_TYPES:
        raise HfExtError(f"task {task} is a {task_type} task: distillation covers sentence-level tasks "
                         "(classification, regression, ranking), as the original's prepare_distillation_data.py (one "
                         "score per class and row)")
    collator = collator or MTDNNCollator(pad_token_id=unwrap(teachers[0]).config.encoder.pad_token_id or 0)
    modes = [teacher.training for teacher in teachers]
    soft_labels = []
    try:
        for teacher in teachers:
            teacher.eval()
        for start in range(0, len(dataset), batch_size):
            batch = collator([dataset[i] for i in range(start, min(start + batch_size, len(dataset)))])
            probabilities: torch.Tensor | int = 0  # the teachers' sum (there is at least one)
            for teacher in teachers:
                device = unwrap(teacher).device
                outputs = teacher(**{key: batch[key].to(device) for key in
                                     ("input_ids", "token_type_ids", "attention_mask")}, task=task)
                if task_type == "regression":
                    probabilities = probabilities + outputs.logits.view(-1, 1).float().cpu()
                else:
                    scores = outputs.group_logits if task_type == "ranking" else outputs.logits
                    probabilities = probabilities + F.softmax(scores.float(), -1).cpu()
            assert isinstance(probabilities, torch.Tensor)
            soft_labels += (probabilities / len(teachers)).tolist()
    finally:
        for teacher, mode in zip(teachers, modes, strict=True):
            teacher.train(mode)
    return soft_labels


def add_soft_labels(dataset: "Dataset", teachers: Sequence["MTDNNModel | PeftModel"], task: str, batch_size: int = 32,
                    collator: MTDNNCollator | None = None) -> "Dataset":
    """`dataset` with a `soft_labels` column from `teacher_soft_labels` (replacing one it had)."""
    soft_labels = teacher_soft_labels(teachers, dataset, task, batch_size, collator)
    if "soft_labels" in dataset.column_names:
        dataset = dataset.remove_columns("soft_labels")
    return dataset.add_column("soft_labels", soft_labels)


__all__ = ["KD_LOSSES", "add_soft_labels", "distillation_loss", "teacher_soft_labels"]
