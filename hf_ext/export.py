"""Writing a converted model folder that loads with `from_pretrained`, locally or from the Hub as remote code."""

from pathlib import Path

import torch
from huggingface_hub.utils.sha import sha_fileobj
from safetensors.torch import save_file
from transformers import (
    GenerationConfig,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    ProcessorMixin,
)
from transformers.core_model_loading import revert_weight_conversion
from transformers.dynamic_module_utils import custom_object_save
from transformers.initialization import no_init_weights

from .errors import HfExtError


def empty_model(model_class: type[PreTrainedModel], config: PretrainedConfig) -> PreTrainedModel:
    """The model's structure without allocating or initialising weights (used to check keys and shapes)."""
    with torch.device("meta"), no_init_weights():
        return model_class(config)


def expected_tensors(model: PreTrainedModel) -> dict[str, tuple[int, ...]]:
    """`{name: shape}` of what a checkpoint of `model` holds (tied copies excluded)."""
    tied = set(getattr(model, "all_tied_weights_keys", {}) or {}) if model.config.tie_word_embeddings else set()
    return {name: tuple(t.shape) for name, t in model.state_dict().items() if name not in tied}


def check_state_dict(model: PreTrainedModel, state_dict: dict[str, torch.Tensor], source: str) -> None:
    """One clear error for missing keys, unexpected keys, shapes that disagree with the config, integer or boolean
    values where the model has floating-point weights, and NaN or infinite weights (every converter checks here)."""
    expected = expected_tensors(model)
    missing = sorted(set(expected) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(expected))
    if missing:
        raise HfExtError(f"{source}: missing {len(missing)} weight(s): {_some(missing)}")
    if unexpected:
        raise HfExtError(f"{source}: unexpected {len(unexpected)} weight(s): {_some(unexpected)}")
    for name, shape in expected.items():
        if tuple(state_dict[name].shape) != shape:
            raise HfExtError(f"{source}: {name} has shape {tuple(state_dict[name].shape)}, the config expects {shape}")
    model_tensors = model.state_dict()
    for name in expected:
        tensor = state_dict[name]
        if model_tensors[name].is_floating_point() and not tensor.is_floating_point():
            raise HfExtError(f"{source}: {name} holds {str(tensor.dtype).removeprefix('torch.')} values, not "
                             "floating-point weights")
        if tensor.is_floating_point() and tensor.numel() and not _all_finite(tensor):
            raise HfExtError(f"{source}: {name} holds NaN or infinite values")


def _all_finite(tensor: torch.Tensor) -> bool:
    """Whether no element is NaN or infinite: exactly when both extremes are finite, since NaN propagates through
    them. One reduction, without the mask `isfinite` allocates: about 15x faster on a GPT-2 embedding, where the
    mask made this check the largest part of a conversion."""
    low, high = torch.aminmax(tensor)
    return bool(torch.isfinite(low)) and bool(torch.isfinite(high))


def _some(names, limit=4):
    return ", ".join(names[:limit]) + (f" (and {len(names) - limit} more)" if len(names) > limit else "")


def write_model_folder(folder: str | Path, model_class: type[PreTrainedModel], config: PretrainedConfig,
                       state_dict: dict[str, torch.Tensor], auto_map: dict[str, str] | None = None,
                       processor: ProcessorMixin | PreTrainedTokenizerBase | None = None,
                       source: str = "checkpoint") -> PreTrainedModel:
    """Write config.json (with `auto_map`), the model code, generation_config.json, model.safetensors and the
    processor into `folder`. `state_dict` is checked against the model built from `config` first. With
    `auto_map=None` (a class transformers itself provides) no code is copied and no auto_map written; otherwise the
    custom pipelines hf-ext declares for the model type (those that fit `model_class`) are written too
    (`custom_pipelines`, with their code)."""
    from .models import model_entry
    from .registration import add_custom_pipelines

    folder = Path(folder)
    model = empty_model(model_class, config)
    if config.tie_word_embeddings:  # tied copies are re-tied on load, not stored
        state_dict = {k: v for k, v in state_dict.items() if k not in model.all_tied_weights_keys}
    check_state_dict(model, state_dict, source)
    if auto_map is not None:
        # copies the defining files (and their sibling imports) so that trust_remote_code loading works
        # transformers annotates `config` as a dict, but takes a configuration object too (its docstring's first type)
        custom_object_save(model, folder, config=config)  # type: ignore[arg-type]
        config.auto_map = dict(auto_map)
        entry = model_entry(config.model_type)
        add_custom_pipelines(folder, config, entry.pipelines if entry is not None else {}, model_class)
    config.architectures = [model_class.__name__]
    config.save_pretrained(folder)
    if model.can_generate():
        generation_config = GenerationConfig.from_model_config(config)
        generation_config.save_pretrained(folder)
    tensors = {name: state_dict[name].contiguous() for name in expected_tensors(model)}
    # under the checkpoint names `save_pretrained` writes, where a model registers renamed ones with transformers
    save_file(revert_weight_conversion(model, tensors), folder / "model.safetensors", metadata={"format": "pt"})
    if processor is not None:
        processor.save_pretrained(folder)
    return model


def sha256(path: str | Path) -> str:
    """Hex SHA-256 of a file, read in chunks (checkpoints can be large)."""
    with open(path, "rb") as handle:
        return sha_fileobj(handle).hex()


def file_record(path: Path, name: str | None = None) -> dict:
    """A provenance row for a model card: the file's name (`name`, or its own), size and sha256."""
    path = Path(path)
    return {"name": name or path.name, "bytes": path.stat().st_size, "sha256": sha256(path)}
