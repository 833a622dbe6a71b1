"""What a model declares about itself, once: its `ModelEntry` (the `ENTRY` of its package's `__init__.py`), which
the shared layer reads through `hf_ext.models.MODELS` and nowhere else; and registering it with transformers' Auto
classes."""

import builtins
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import transformers
from transformers import AutoConfig, PretrainedConfig, PreTrainedModel, ProcessorMixin

# the classes a model registers with transformers' Auto classes: its models and, for AutoProcessor, its processor
AutoClass = type[PreTrainedModel] | type[ProcessorMixin]


def register_auto_classes(config_class: type[PretrainedConfig], auto_classes: Mapping[str, AutoClass]) -> None:
    """Register `config_class` with `AutoConfig` and each class with its Auto class (`{"AutoModel": Model, ...}`).
    The classes are also registered for remote code, so that the folders they save carry their code and an
    `auto_map`, and load with `trust_remote_code=True` where hf-ext is not installed."""
    AutoConfig.register(config_class.model_type, config_class, exist_ok=True)
    config_class.register_for_auto_class()
    for auto_name, model_class in auto_classes.items():
        getattr(transformers, auto_name).register(config_class, model_class, exist_ok=True)
        model_class.register_for_auto_class(auto_name)


def auto_map(config_class: type[PretrainedConfig], auto_classes: Mapping[str, AutoClass]) -> dict[str, str]:
    """The `auto_map` of a saved configuration: `{"AutoConfig": "configuration_x.XConfig", "AutoModel": ...}` for the
    configuration and the model classes (a processor records its own in its processor config)."""
    def reference(cls):
        return f"{cls.__module__.rsplit('.', 1)[-1]}.{cls.__name__}"

    models = {name: reference(cls) for name, cls in auto_classes.items() if issubclass(cls, PreTrainedModel)}
    return {"AutoConfig": reference(config_class), **models}


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


BERT_ATTENTION = ("query", "key", "value")  # BertSelfAttention's projections: the LoRA targets of a BERT encoder
# the self-attention projections of the encoders AutoModel builds: BERT, RoBERTa, ELECTRA (query, key, value),
# DeBERTa-v2/v3 (query_proj, key_proj, value_proj), DeBERTa (in_proj, all three in one), ModernBERT (Wqkv)
ENCODER_ATTENTION = BERT_ATTENTION + ("query_proj", "key_proj", "value_proj", "in_proj", "Wqkv")


@dataclass(frozen=True)
class CustomPipeline:
    """A custom pipeline a model declares (`ModelEntry.pipelines`, by task name): `pipeline_class` (a
    `transformers.Pipeline` subclass in a remote-code file of the model's folder, `pipeline_<name>.py`, so that
    folders carry it), `auto_classes` (the names of the transformers Auto classes the pipeline loads the model with)
    `type` (the pipeline's input type, as `PIPELINE_REGISTRY` takes it: "text" loads the folder's tokenizer) and
    `model_classes` (the model classes whose folders carry it, empty for every class of the model: a seq2seq pipeline
    is no use in a classifier's folder)."""

    pipeline_class: type
    auto_classes: tuple[str, ...] = ("AutoModel",)
    type: str = "text"
    model_classes: tuple[builtins.type, ...] = ()  # `type` is the field above in this class's body

    def fits(self, model_class: builtins.type | None) -> bool:
        """Whether folders of `model_class` carry the pipeline (None: a class not known, every pipeline fits)."""
        return not self.model_classes or model_class is None or issubclass(model_class, self.model_classes)

    def register(self, task: str) -> None:
        """Register the pipeline as `task` with transformers' `PIPELINE_REGISTRY` (`pipeline(task, model=...)`). A
        task already registered, as transformers' own (`feature-extraction`), is left alone: registering it would
        replace the stock pipeline for every model; the folders' `custom_pipelines` map it to this pipeline for
        their model."""
        from transformers.pipelines import PIPELINE_REGISTRY

        if task in PIPELINE_REGISTRY.get_supported_tasks():
            return
        PIPELINE_REGISTRY.register_pipeline(task, pipeline_class=self.pipeline_class, type=self.type,
                                            pt_model=tuple(getattr(transformers, name) for name in self.auto_classes))

    def config_entry(self) -> dict[str, Any]:
        """The pipeline's entry in a saved configuration's `custom_pipelines` (as `Pipeline.save_pretrained` writes
        it): the class as `module.Class` of the folder's files, the Auto classes by name."""
        cls = self.pipeline_class
        return {"impl": f"{cls.__module__.rsplit('.', 1)[-1]}.{cls.__name__}", "pt": list(self.auto_classes),
                "type": self.type}


def add_custom_pipelines(folder: str | Path, config: PretrainedConfig,
                         pipelines: Mapping[str, CustomPipeline], model_class: type | None = None) -> None:
    """Copy each pipeline's code (its file and the folder files it imports) into `folder` and record the pipelines
    in `config.custom_pipelines`, before the configuration is saved there: `pipeline(model=folder,
    trust_remote_code=True)` then runs them where hf-ext is not installed. With `model_class` (the class the folder
    holds), only the pipelines that fit it (`CustomPipeline.fits`)."""
    from transformers.dynamic_module_utils import custom_object_save

    pipelines = {task: declared for task, declared in pipelines.items() if declared.fits(model_class)}
    if not pipelines:
        return
    for declared in pipelines.values():
        custom_object_save(declared.pipeline_class, str(folder))  # a class has the __module__ it reads
    config.custom_pipelines = {**(getattr(config, "custom_pipelines", None) or {}),
                               **{task: declared.config_entry() for task, declared in pipelines.items()}}


@dataclass(frozen=True)
class ModelEntry:
    """One model of hf-ext as its package declares it (`ENTRY = ModelEntry(package=__name__, ...)` in its
    `__init__.py`). The shared layer knows a model only through its entry; docs/adding_a_model.md walks through
    the fields.

    - `package`: the package's module name (`__name__`); `name` is its last part (the folder).
    - `display_name`: the model's name in prose and help texts ("Universal Transformer").
    - `config_class`, `auto_classes` (`{"AutoModel": Model, ...}`): registered with transformers by `register()`
      (done by `import hf_ext`); `auto_map` is the `auto_map` of converted folders.
    - `top_level`: the names `hf_ext` re-exports from the package (`hf_ext.OptimusModel`).
    - `card_template`: the model card template, `model_cards/<card_template>.md`, that its converter renders.
    - `conversion_script`: the script in the repository's `conversion/` folder that runs its converter.
    - `lora`: its `LoraPlan` (None: `hf_ext.lora.add_lora` refuses the model).
    - module names inside the package, imported only when used: `conversion` (the converter: `CONVERT_NAME`,
      `CONVERT_SUMMARY`, `add_arguments(parser)`, `run(args)`), `commands` (`register(commands)`: its own
      command group; None for none), `app` (`MODEL_TYPES`, `build_app(source, trust_remote_code)`: its `hf-ext
      serve` app, built on the `app` extra; `app_summary` says what the app shows in `hf-ext serve --help`) and
      `export_onnx` (`MODEL_TYPES`, `tasks(config)`, `plan(...)`: what `hf-ext export onnx` writes, built on the
      `onnx` extra); None where the model has none.
    - `pipelines` (`{task: CustomPipeline}`): its custom pipelines, registered with transformers'
      `PIPELINE_REGISTRY` by `register()` and written, with their code, into the folders hf-ext writes
      (`custom_pipelines` of config.json, see `add_custom_pipelines`).
    """

    package: str
    display_name: str
    config_class: type[PretrainedConfig]
    auto_classes: Mapping[str, AutoClass]
    top_level: tuple[str, ...]
    card_template: str
    conversion_script: str
    lora: LoraPlan | None = None
    conversion: str = "conversion"
    commands: str | None = "commands"
    app: str | None = None
    app_summary: str | None = None
    export_onnx: str | None = None
    pipelines: Mapping[str, CustomPipeline] = field(default_factory=dict)

    @property
    def name(self) -> str:
        """The package's folder name (`universal_transformer`)."""
        return self.package.rsplit(".", 1)[-1]

    @property
    def model_type(self) -> str:
        """The `model_type` of its configuration (`universal-transformer`)."""
        return self.config_class.model_type

    @property
    def auto_map(self) -> dict[str, str]:
        """The `auto_map` a converted folder's configuration carries (see `auto_map`)."""
        return auto_map(self.config_class, self.auto_classes)

    def register(self) -> None:
        """Register the model with transformers' Auto classes (`register_auto_classes`) and its pipelines with
        `PIPELINE_REGISTRY`."""
        register_auto_classes(self.config_class, self.auto_classes)
        for task, declared in self.pipelines.items():
            declared.register(task)

    def module(self, name: str) -> ModuleType:
        """The package's module `name` (one of the module fields: `self.module(self.conversion)`), imported now."""
        return importlib.import_module(f"{self.package}.{name}")


__all__ = ["BERT_ATTENTION", "ENCODER_ATTENTION", "CustomPipeline", "LoraPlan", "ModelEntry", "add_custom_pipelines",
           "auto_map", "register_auto_classes"]
