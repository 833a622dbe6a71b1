"""LoRA through PEFT for every model: one table of what each model type adapts, and one function each to wrap a
model, reload a saved adapter and get the model back out of its wrappers."""

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from accelerate.utils import extract_model_from_parallel
from transformers import PreTrainedModel
from transformers.trainer_utils import unwrap_peft_model

from .trainer import quiet_peft

if TYPE_CHECKING:  # peft is imported only when LoRA is used
    from peft import PeftModel


def _no_modules(model: PreTrainedModel) -> list[str]:
    return []


@dataclass(frozen=True)
class LoraPlan:
    """What LoRA adapts in one model type: `target_modules` (module names; PEFT adapts those the model has),
    `modules_to_save(model)` (modules trained in full and saved with the adapter), `fan_in_fan_out` (targets that
    include GPT-2's `Conv1D`, which stores its weight as [in, out]: PEFT then picks the value per layer from its
    type) and `task_type(model)` (the PEFT task type, None for a plain `PeftModel`)."""

    target_modules: tuple[str, ...]
    modules_to_save: Callable[[PreTrainedModel], list[str]] = field(default=_no_modules)
    fan_in_fan_out: bool = False
    task_type: Callable[[PreTrainedModel], str | None] = field(default=lambda model: None)


BERT_ATTENTION = ("query", "key", "value")  # BertSelfAttention's projections


def _universal_transformer_task_type(model: PreTrainedModel) -> str | None:
    if model.can_generate():
        return "SEQ_2_SEQ_LM"  # PeftModelForSeq2SeqLM, which generates
    return "SEQ_CLS" if hasattr(model, "classifier") else "FEATURE_EXTRACTION"


LORA_PLANS = {
    # BERT's self-attention and GPT-2's attention and MLP projections; the latent projections define the latent
    # space and are trained in full
    "optimus": LoraPlan(BERT_ATTENTION + ("c_attn", "c_proj"),
                        lambda model: ["to_latent", "latent_to_memory", "latent_to_embedding"], fan_in_fan_out=True),
    # the shared encoder's self-attention; every task head in full
    "mt-dnn": LoraPlan(BERT_ATTENTION, lambda model: [f"heads.{name}" for name in model.config.task_names]),
    # attention and the transition function of any kind (fc, sepconv, conv); the halting units and the classifier
    # in full (the seq2seq output layer is the shared embedding and stays frozen)
    "universal-transformer": LoraPlan(
        ("q_proj", "k_proj", "v_proj", "o_proj", "fc1", "fc2", "pointwise1", "pointwise2", "conv1", "conv2"),
        lambda model: (["halting"] if model.config.use_act else []) + (
            ["classifier"] if hasattr(model, "classifier") else []),
        task_type=_universal_transformer_task_type),
}


def lora_plan(model: PreTrainedModel) -> LoraPlan:
    plan = LORA_PLANS.get(model.config.model_type)
    if plan is None:
        raise ValueError(f"no LoRA plan for model type {model.config.model_type!r} (known: {', '.join(LORA_PLANS)})")
    return plan


def add_lora(model: PreTrainedModel, r: int = 8, lora_alpha: float = 16, lora_dropout: float = 0.0,
             target_modules: tuple[str, ...] | None = None,
             modules_to_save: list[str] | None = None) -> "PeftModel":
    """Wrap `model` in LoRA adapters (`peft.get_peft_model`) on its type's targets (`LORA_PLANS`), or on
    `target_modules`; the type's `modules_to_save` (or the given ones) are trained in full and saved with the
    adapter."""
    from peft import LoraConfig, get_peft_model

    plan = lora_plan(model)
    targets = list(plan.target_modules if target_modules is None else target_modules)
    if not targets:
        raise ValueError("give at least one LoRA target module")
    saved = plan.modules_to_save(model) if modules_to_save is None else list(modules_to_save)
    config = LoraConfig(task_type=plan.task_type(model), r=r, lora_alpha=lora_alpha, lora_dropout=lora_dropout,
                        target_modules=targets, modules_to_save=saved or None, fan_in_fan_out=plan.fan_in_fan_out)
    with quiet_peft():
        return get_peft_model(model, config)


def load_lora(model: PreTrainedModel, adapter: str, **kwargs: Any) -> "PeftModel":
    """`PeftModel.from_pretrained(model, adapter)` for an adapter saved from a model wrapped by `add_lora`."""
    from peft import PeftModel

    with quiet_peft():
        return PeftModel.from_pretrained(model, adapter, **kwargs)


def unwrap(model: torch.nn.Module) -> PreTrainedModel:
    """The transformers model inside `model`: out of DDP/FSDP/compile wrappers, then out of a PEFT wrapper."""
    return unwrap_peft_model(extract_model_from_parallel(model))


__all__ = ["LORA_PLANS", "LoraPlan", "add_lora", "load_lora", "lora_plan", "unwrap"]
