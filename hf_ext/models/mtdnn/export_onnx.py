"""MT-DNN to ONNX (`hf-ext export onnx`): one graph, `model.onnx`, that runs the shared encoder once and every task
head on its output (`logits_<task>` each; a head costs little beside the encoder), or one head with `--task NAME`
(output `logits`). Ranking heads score each row; the rows of a group are compared after the graph, as in PyTorch."""

import torch
from torch import nn
from transformers import AutoModel, PretrainedConfig

from ...loading import loading
from ...onnx_export import TEXT_AXES, TEXT_INPUTS, ExportPlan, Inputs, OnnxGraph, text_inputs
from .modeling_mtdnn import MTDNNModel

MODEL_TYPES = ("mt-dnn",)
ALL_HEADS = "heads"


def tasks(config: PretrainedConfig) -> list[str]:
    """Every head in one graph (the default), or one task by name."""
    return [ALL_HEADS, *config.task_names]


class MTDNNHeads(nn.Module):
    """The encoder and the chosen heads: `(input_ids, attention_mask, token_type_ids) -> logits of each task`."""

    def __init__(self, model: MTDNNModel, task_names: list[str]):
        super().__init__()
        self.model = model
        self.task_names = task_names

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
        sequence_output = self.model.encode(input_ids=input_ids, attention_mask=attention_mask,
                                            token_type_ids=token_type_ids).last_hidden_state
        assert sequence_output is not None  # an encoder's output always holds it
        return tuple(self.model.head_logits(name, sequence_output, token_type_ids, attention_mask)[0]
                     for name in self.task_names)


def plan(source: str, config: PretrainedConfig, task: str, trust_remote_code: bool) -> ExportPlan:
    with loading("an MT-DNN model", source):
        model = AutoModel.from_pretrained(source, trust_remote_code=trust_remote_code).eval()
    names = config.task_names if task == ALL_HEADS else [task]
    output_names = [f"logits_{name}" for name in names] if task == ALL_HEADS else ["logits"]
    labels = tuple(output for output, name in zip(output_names, names, strict=True)
                   if config.task(name)["type"] == "classification")

    def make_inputs(dims: dict[str, int], generator: torch.Generator) -> Inputs:
        return text_inputs(dims, generator, config.encoder.vocab_size, config.encoder.pad_token_id or 0)

    return ExportPlan(
        model=model, task=task,
        graphs=[OnnxGraph(
            name="model", module=MTDNNHeads(model, names),
            input_names=TEXT_INPUTS, output_names=output_names,
            dynamic_axes=dict.fromkeys(TEXT_INPUTS, TEXT_AXES),
            make_inputs=make_inputs, export_dims={"batch": 2, "sequence": 16},
            check_dims=[{"batch": 2, "sequence": 16}, {"batch": 3, "sequence": 9}], label_outputs=labels)],
        notes=[f"heads: {', '.join(names)}; inputs are `[CLS] premise [SEP] hypothesis [SEP]` ids with segment ids, "
               "padded on the right; ranking logits are one score per row (compare the rows of a group)"],
    )
