"""ERNIE to ONNX (`hf-ext export onnx`): the vanilla `ernie` folders that `hf-ext convert ernie2` writes and GLUE
fine-tuning saves. A sequence classifier exports as `model.onnx` (`logits`); any folder exports its encoder with
`--task feature-extraction` (`last_hidden_state`, `pooler_output`). With `use_task_id` the graph also takes
`task_type_ids`, the ids of ERNIE 2.0's task embedding."""

import torch
from torch import nn
from transformers import AutoModel, AutoModelForSequenceClassification, PretrainedConfig

from ...loading import loading
from ...onnx_export import TEXT_AXES, TEXT_INPUTS, ExportPlan, Inputs, OnnxGraph, text_inputs

MODEL_TYPES = ("ernie",)
TASK_CLASSES = {"sequence-classification": AutoModelForSequenceClassification, "feature-extraction": AutoModel}


def tasks(config: PretrainedConfig) -> list[str]:
    """A classifier's folder offers its head first; every folder offers its encoder."""
    classifier = any(name.endswith("ForSequenceClassification") for name in config.architectures or [])
    return ["sequence-classification", "feature-extraction"] if classifier else ["feature-extraction"]


class ErnieGraph(nn.Module):
    """The model on ids, mask, segment ids and (with `use_task_id`) task ids, returning `output_names`."""

    def __init__(self, model: nn.Module, output_names: list[str]):
        super().__init__()
        self.model = model
        self.output_names = output_names

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor,
                task_type_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                         task_type_ids=task_type_ids)
        return tuple(out[name] for name in self.output_names)


def plan(source: str, config: PretrainedConfig, task: str, trust_remote_code: bool) -> ExportPlan:
    with loading("an ERNIE model", source):
        model = TASK_CLASSES[task].from_pretrained(source, trust_remote_code=trust_remote_code).eval()
    input_names = [*TEXT_INPUTS, *(["task_type_ids"] if config.use_task_id else [])]
    output_names = ["logits"] if task == "sequence-classification" else ["last_hidden_state", "pooler_output"]

    def make_inputs(dims: dict[str, int], generator: torch.Generator) -> Inputs:
        inputs = text_inputs(dims, generator, config.vocab_size, config.pad_token_id or 0)
        if config.use_task_id:
            inputs["task_type_ids"] = torch.randint(config.task_type_vocab_size, inputs["input_ids"].shape,
                                                    generator=generator)
        return inputs

    notes = ["task_type_ids: the task embedding's ids (ERNIE 2.0), one per token"] if config.use_task_id else []
    return ExportPlan(model=model, task=task, notes=notes, graphs=[OnnxGraph(
        name="model", module=ErnieGraph(model, output_names), input_names=input_names, output_names=output_names,
        dynamic_axes=dict.fromkeys(input_names, TEXT_AXES), make_inputs=make_inputs,
        export_dims={"batch": 2, "sequence": 16},
        check_dims=[{"batch": 2, "sequence": 16}, {"batch": 3, "sequence": 9}],
        label_outputs=("logits",) if task == "sequence-classification" else ())])
