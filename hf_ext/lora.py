"""LoRA through PEFT for every model: what a model type adapts is its entry's `LoraPlan` (`ModelEntry.lora`), and
one function each wraps a model, reloads a saved adapter and gets the model back out of its wrappers."""

from typing import TYPE_CHECKING, Any

import torch
from accelerate.utils import extract_model_from_parallel
from transformers import PreTrainedModel
from transformers.trainer_utils import unwrap_peft_model

from .models import MODELS
from .registration import LoraPlan
from .trainer import quiet_peft

if TYPE_CHECKING:  # peft is imported only when LoRA is used
    from peft import PeftModel


def lora_plan(model: PreTrainedModel) -> LoraPlan:
    """The `LoraPlan` of `model`'s type, from its model's entry."""
    plans = {entry.model_type: entry.lora for entry in MODELS if entry.lora is not None}
    if model.config.model_type not in plans:
        raise ValueError(f"no LoRA plan for model type {model.config.model_type!r} (known: {', '.join(plans)})")
    return plans[model.config.model_type]


def add_lora(model: PreTrainedModel, r: int = 8, lora_alpha: float = 16, lora_dropout: float = 0.0,
             target_modules: tuple[str, ...] | None = None,
             modules_to_save: list[str] | None = None,
             trainable_token_indices: list[int] | dict[str, list[int]] | None = None) -> "PeftModel":
    """Wrap `model` in LoRA adapters (`peft.get_peft_model`) on its type's targets (its entry's `LoraPlan`), or on
    `target_modules`; the type's `modules_to_save` (or the given ones) are trained in full and saved with the
    adapter; `trainable_token_indices` are rows of the input embeddings (a list; a tied LM head follows them) or of
    the named embedding layers (a dict) trained on their own."""
    from peft import LoraConfig, get_peft_model

    plan = lora_plan(model)
    targets = list(plan.target_modules if target_modules is None else target_modules)
    if not targets:
        raise ValueError("give at least one LoRA target module")
    saved = plan.modules_to_save(model) if modules_to_save is None else list(modules_to_save)
    # peft annotates lora_alpha as int, but scales by lora_alpha / r: a float alpha (hf-ext mtdnn --lora-alpha) works
    config = LoraConfig(task_type=plan.task_type(model), r=r, lora_alpha=lora_alpha,  # type: ignore[arg-type]
                        lora_dropout=lora_dropout, target_modules=targets, modules_to_save=saved or None,
                        fan_in_fan_out=plan.fan_in_fan_out, trainable_token_indices=trainable_token_indices)
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


__all__ = ["LoraPlan", "add_lora", "load_lora", "lora_plan", "unwrap"]
