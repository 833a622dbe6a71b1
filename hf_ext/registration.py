"""Registering a model with transformers' Auto classes, from one table per model (its package's `AUTO_CLASSES`)."""

import transformers
from transformers import AutoConfig, PretrainedConfig, PreTrainedModel


def register_auto_classes(config_class: type[PretrainedConfig], auto_classes: dict[str, type]) -> None:
    """Register `config_class` with `AutoConfig` and each class with its Auto class (`{"AutoModel": Model, ...}`).
    The classes are also registered for remote code, so that the folders they save carry their code and an
    `auto_map`, and load with `trust_remote_code=True` where hf-ext is not installed."""
    AutoConfig.register(config_class.model_type, config_class, exist_ok=True)
    config_class.register_for_auto_class()
    for auto_name, model_class in auto_classes.items():
        getattr(transformers, auto_name).register(config_class, model_class, exist_ok=True)
        model_class.register_for_auto_class(auto_name)


def auto_map(config_class: type[PretrainedConfig], auto_classes: dict[str, type]) -> dict[str, str]:
    """The `auto_map` of a saved configuration: `{"AutoConfig": "configuration_x.XConfig", "AutoModel": ...}` for the
    configuration and the model classes (a processor records its own in its processor config)."""
    def reference(cls):
        return f"{cls.__module__.rsplit('.', 1)[-1]}.{cls.__name__}"

    models = {name: reference(cls) for name, cls in auto_classes.items() if issubclass(cls, PreTrainedModel)}
    return {"AutoConfig": reference(config_class), **models}
