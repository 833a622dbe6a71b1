"""Universal Transformer to ONNX (`hf-ext export onnx`): the classifier (`model.onnx`), the encoder alone
(`encoder.onnx`), or a seq2seq model's encoder and decoder (`encoder.onnx`, `decoder.onnx`; no decoding cache, as in
PyTorch: each new token re-runs the decoder over the prefix).

ACT survives export with its exact outputs (logits, states, `n_updates`, `remainders`) at any batch size and length,
but not its early exit: an exported graph takes all `act_max_steps` steps, computing every position and keeping the
halted ones (see `UniversalTransformerStack._dense_act_steps`), since the loop's exit and the packing of the running
positions depend on the data. Its cost is that of the fixed depth `act_max_steps`."""

import torch
from torch import nn
from transformers import PretrainedConfig

from ...errors import HfExtError
from ...loading import loading
from ...onnx_export import TEXT_AXES, ExportPlan, Inputs, OnnxGraph, text_inputs
from . import modeling_universal_transformer as modeling

MODEL_TYPES = ("universal-transformer",)
TEXT = ["input_ids", "attention_mask"]
EXPORT_DIMS = {"batch": 2, "sequence": 12, "target": 7}
CHECK_DIMS = [EXPORT_DIMS, {"batch": 3, "sequence": 7, "target": 4}]


def architecture(config: PretrainedConfig) -> str:
    return (config.architectures or ["UniversalTransformerModel"])[0]


def tasks(config: PretrainedConfig) -> list[str]:
    """The folder's own head first: `sequence-classification` or `seq2seq`; `feature-extraction` (the encoder)
    from any folder."""
    head = {"UniversalTransformerForSequenceClassification": ["sequence-classification"],
            "UniversalTransformerForSeq2SeqLM": ["seq2seq"]}.get(architecture(config), [])
    return [*head, "feature-extraction"]


class StackGraph(nn.Module):
    """One side of the model (`UniversalTransformerStack`): its last state and, with ACT, the number of updates and
    the remainder of each position; the decoder side also takes the encoder's states and returns logits."""

    def __init__(self, stack: modeling.UniversalTransformerStack, lm_head: nn.Linear | None = None):
        super().__init__()
        self.stack = stack
        self.lm_head = lm_head

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                encoder_hidden_states: torch.Tensor | None = None,
                encoder_attention_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        out = self.stack(input_ids=input_ids, attention_mask=attention_mask,
                         encoder_hidden_states=encoder_hidden_states, encoder_attention_mask=encoder_attention_mask)
        first = out.last_hidden_state if self.lm_head is None else self.lm_head(out.last_hidden_state)
        return (first,) if out.n_updates is None else (first, out.n_updates, out.remainders)


class ClassifierGraph(nn.Module):
    """The classifier: logits and, with ACT, the encoder's updates and remainders per position."""

    def __init__(self, model: modeling.UniversalTransformerForSequenceClassification):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = self.model(input_ids=input_ids, attention_mask=attention_mask)
        return (out.logits,) if out.n_updates is None else (out.logits, out.n_updates, out.remainders)


def plan(source: str, config: PretrainedConfig, task: str, trust_remote_code: bool) -> ExportPlan:
    model_class = getattr(modeling, architecture(config), None)
    if model_class is None:
        raise HfExtError(f"{source}: unknown Universal Transformer architecture {architecture(config)!r}")
    with loading("a Universal Transformer", source):
        model = model_class.from_pretrained(source, trust_remote_code=trust_remote_code).eval()
    act = ["n_updates", "remainders"] if config.use_act else []
    pad = config.pad_token_id or 0

    def encoder_inputs(dims: dict[str, int], generator: torch.Generator) -> Inputs:
        inputs = text_inputs(dims, generator, config.vocab_size, pad, pairs=False)
        return {name: inputs[name] for name in TEXT}

    def decoder_inputs(dims: dict[str, int], generator: torch.Generator) -> Inputs:
        encoder = encoder_inputs(dims, generator)
        decoder = text_inputs({"batch": dims["batch"], "sequence": dims["target"]}, generator, config.vocab_size, pad,
                              pairs=False)
        with torch.no_grad():
            states = model.encoder(**encoder).last_hidden_state
        return {"input_ids": decoder["input_ids"], "attention_mask": decoder["attention_mask"],
                "encoder_hidden_states": states, "encoder_attention_mask": encoder["attention_mask"]}

    def graph(name: str, module: nn.Module, outputs: list[str], labels: tuple[str, ...] = ()) -> OnnxGraph:
        return OnnxGraph(name=name, module=module, input_names=TEXT, output_names=outputs,
                         dynamic_axes=dict.fromkeys(TEXT, TEXT_AXES), make_inputs=encoder_inputs,
                         export_dims=EXPORT_DIMS, check_dims=CHECK_DIMS, label_outputs=labels)

    encoder = model.universal_transformer.encoder if hasattr(model, "universal_transformer") else model.encoder
    if task == "sequence-classification":
        graphs = [graph("model", ClassifierGraph(model), ["logits", *act], ("logits",))]
    else:
        graphs = [graph("encoder", StackGraph(encoder), ["last_hidden_state", *act])]
    if task == "seq2seq":
        target_axes = {0: "batch", 1: "target"}
        graphs.append(OnnxGraph(
            name="decoder", module=StackGraph(model.decoder, model.lm_head),
            input_names=[*TEXT, "encoder_hidden_states", "encoder_attention_mask"], output_names=["logits", *act],
            dynamic_axes={"input_ids": target_axes, "attention_mask": target_axes,
                          "encoder_hidden_states": TEXT_AXES, "encoder_attention_mask": TEXT_AXES},
            make_inputs=decoder_inputs, export_dims=EXPORT_DIMS, check_dims=CHECK_DIMS, label_outputs=("logits",)))
    notes = []
    if config.use_act:
        notes.append(f"ACT: the graphs take all {config.act_max_steps} steps (act_max_steps), computing every "
                     "position and keeping the halted ones, which gives PyTorch's outputs exactly; the early exit "
                     "and the packing of running positions depend on the data and stay in PyTorch")
    if task == "seq2seq":
        notes.append("decoder: the whole target prefix at every step (no decoding cache, as in PyTorch); its "
                     "input starts with decoder_start_token_id")
    return ExportPlan(model=model, task=task, graphs=graphs, notes=notes)
