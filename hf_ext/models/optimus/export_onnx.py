"""Optimus to ONNX (`hf-ext export onnx`) as two graphs, and generation on ONNX Runtime.

- `encoder.onnx`: the encoder's ids, mask and, for encoders with segment embeddings (BERT's, not ModernBERT's),
  segment ids -> the posterior's `mean` and `logvar`.
- `decoder.onnx`: one decoding step. Decoder ids (the prompt, then one new token per step), `latent_z` and the
  key/value cache of the tokens so far (`past_key_<i>`, `past_value_<i>` per layer, `[batch, key/value heads, past,
  head_dim]`: fewer heads than the attention's with grouped-query attention; empty at the first step) -> `logits` of
  every given position and the grown cache (`present_key_<i>`, `present_value_<i>`). The latent memory slot is
  computed from `latent_z` inside the graph at every step (one small projection), so the cache holds tokens only;
  positions follow the cache's length, the memory slot taking position 0 as in PyTorch (rotary decoders rotate the
  tokens' keys by their positions 1, 2, ...). The cache keeps every token: a decoder with sliding windows masks what
  lies outside its window instead of dropping it, which gives the same logits.

`OptimusOnnx` runs them: encode text, and greedy or sampled decoding from latents, as `OptimusLatentSpace` does in
PyTorch."""

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn
from transformers import AutoModel, PretrainedConfig
from transformers.cache_utils import DynamicCache

from ...errors import HfExtError
from ...loading import load_config, loading
from ...onnx_export import (
    QUANTIZATIONS,
    TEXT_AXES,
    TEXT_INPUTS,
    ExportPlan,
    Inputs,
    OnnxGraph,
    quantized_file,
    session,
    text_inputs,
)
from .configuration_optimus import decoder_head_dim, decoder_heads
from .modeling_optimus import CACHE_NAME, OptimusModel

if TYPE_CHECKING:
    from .processing_optimus import OptimusProcessor

MODEL_TYPES = ("optimus",)


def tasks(config: PretrainedConfig) -> list[str]:
    return ["generation"]


def cache_names(prefix: str, num_layers: int) -> list[str]:
    """`<prefix>_key_0, <prefix>_value_0, <prefix>_key_1, ...`: one key and one value per decoder layer."""
    return [f"{prefix}_{kind}_{layer}" for layer in range(num_layers) for kind in ("key", "value")]


def cache_shape(decoder: PretrainedConfig) -> tuple[int, int, int]:
    """(layers, key/value heads, head size) of the decoder's cache."""
    return decoder.num_hidden_layers, decoder_heads(decoder)[1], decoder_head_dim(decoder)


def encoder_input_names(model: OptimusModel) -> list[str]:
    """The encoder graph's inputs: segment ids only for an encoder that reads them (the model drops them otherwise,
    and a graph input nothing reads would be no input of the exported graph)."""
    return TEXT_INPUTS if model.encoder_reads_segments else TEXT_INPUTS[:2]


class OptimusEncoderGraph(nn.Module):
    """Text -> the posterior's mean and log-variance."""

    def __init__(self, model: OptimusModel):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        mean, logvar, _ = self.model.encode(input_ids, attention_mask, token_type_ids)
        return mean, logvar


class OptimusDecoderStep(nn.Module):
    """One decoding step: `(input_ids, latent_z, *past)` -> `(logits, *present)`, the caches without the memory
    slot (see the module docstring)."""

    def __init__(self, model: OptimusModel):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, latent_z: torch.Tensor, *past: torch.Tensor) -> tuple[torch.Tensor, ...]:
        model = self.model
        memory = model.config.latent_as_gpt_memory
        # a cache of full layers whatever the decoder's: a sliding-window layer would drop the oldest slot (the
        # memory first), and this graph's present would lose its layout; the decoder's sliding mask still applies
        cache = DynamicCache()
        if memory:
            model.memory_cache(latent_z, cache)
        for layer in range(model.config.decoder.num_hidden_layers):
            cache.update(past[2 * layer], past[2 * layer + 1], layer)
        out = model(decoder_input_ids=input_ids, latent_z=latent_z, cache=cache, use_cache=True)
        cache = getattr(out, CACHE_NAME)
        first = int(memory)  # the memory slot is rebuilt from latent_z at every step
        present = []
        for layer in cache.layers:
            present += [layer.keys[:, :, first:], layer.values[:, :, first:]]
        return (out.logits, *present)


def plan(source: str, config: PretrainedConfig, task: str, trust_remote_code: bool) -> ExportPlan:
    with loading("an Optimus model", source):
        model = AutoModel.from_pretrained(source, trust_remote_code=trust_remote_code).eval()
    encoder, decoder = config.encoder, config.decoder
    num_layers, key_value_heads, head_dim = cache_shape(decoder)
    past_names = cache_names("past", num_layers)
    encoder_graph_inputs = encoder_input_names(model)

    def encoder_inputs(dims: dict[str, int], generator: torch.Generator) -> Inputs:
        return text_inputs(dims, generator, encoder.vocab_size, encoder.pad_token_id or 0, pairs=False)

    def decoder_inputs(dims: dict[str, int], generator: torch.Generator) -> Inputs:
        batch = dims["batch"]
        inputs = {"input_ids": torch.randint(decoder.vocab_size, (batch, dims["sequence"]), generator=generator),
                  "latent_z": torch.randn(batch, config.latent_size, generator=generator)}
        for name in past_names:
            inputs[name] = torch.randn(batch, key_value_heads, dims["past"], head_dim, generator=generator)
        return inputs

    cache_axes = {0: "batch", 2: "past"}
    return ExportPlan(model=model, task=task, graphs=[
        OnnxGraph(name="encoder", module=OptimusEncoderGraph(model), input_names=encoder_graph_inputs,
                  output_names=["mean", "logvar"], dynamic_axes=dict.fromkeys(encoder_graph_inputs, TEXT_AXES),
                  make_inputs=encoder_inputs, export_dims={"batch": 2, "sequence": 12},
                  check_dims=[{"batch": 2, "sequence": 12}, {"batch": 3, "sequence": 7}]),
        OnnxGraph(name="decoder", module=OptimusDecoderStep(model), input_names=["input_ids", "latent_z", *past_names],
                  output_names=["logits", *cache_names("present", num_layers)],
                  dynamic_axes={"input_ids": TEXT_AXES, "latent_z": {0: "batch"},
                                **dict.fromkeys(past_names, cache_axes)},
                  make_inputs=decoder_inputs, export_dims={"batch": 2, "sequence": 3, "past": 4},
                  # the first step (an empty cache), a prompt, and one token on a longer cache
                  check_dims=[{"batch": 2, "sequence": 1, "past": 0}, {"batch": 3, "sequence": 4, "past": 0},
                              {"batch": 2, "sequence": 1, "past": 6}],
                  label_outputs=("logits",)),
    ], notes=["decoder.onnx is one decoding step with a key/value cache of the tokens (empty at the first step); "
              "the latent memory is rebuilt from latent_z inside the graph; `hf_ext.models.optimus.export_onnx."
              "OptimusOnnx` runs greedy or sampled decoding on ONNX Runtime"])


def graph_file(name: str, quantization: str | None) -> str:
    """The file of graph `name`, quantized with `quantization` (a scheme of `hf-ext export onnx --quantize`) or
    float."""
    if quantization is None:
        return f"{name}.onnx"
    if quantization not in QUANTIZATIONS:
        raise HfExtError(f"unknown quantization {quantization!r} (choose from {', '.join(QUANTIZATIONS)})")
    return quantized_file(name, quantization)


class OptimusOnnx:
    """An exported Optimus folder on ONNX Runtime: `encode` text to posterior means, `generate` token ids from latents
    (greedy, or sampling with a temperature), `decode`/`reconstruct` text with the folder's processor. With
    `quantization`, the graphs that `hf-ext export onnx --quantize <quantization>` wrote beside the float ones."""

    def __init__(self, folder: str | Path, quantization: str | None = None):
        folder = Path(folder)
        self.encoder = session(folder / graph_file("encoder", quantization))
        self.decoder = session(folder / graph_file("decoder", quantization))
        self.encoder_inputs = [node.name for node in self.encoder.get_inputs()]
        config = load_config(str(folder), "optimus", "an Optimus model")
        decoder = config.decoder
        self.num_layers, self.key_value_heads, self.head_dim = cache_shape(decoder)
        self.bos_token_id, self.eos_token_id = decoder.bos_token_id, decoder.eos_token_id
        self.pad_token_id = decoder.pad_token_id
        self.max_positions = config.max_decoder_tokens
        self.folder = folder
        self._processor: OptimusProcessor | None = None

    @property
    def processor(self) -> "OptimusProcessor":
        if self._processor is None:
            from transformers import AutoProcessor

            with loading("an Optimus processor", self.folder):
                self._processor = AutoProcessor.from_pretrained(self.folder, trust_remote_code=False)
        return self._processor

    def encode(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """(mean, logvar) of each text's posterior."""
        batch = self.processor(list(texts), return_tensors="np")
        ids = batch["input_ids"].astype(np.int64)
        inputs = {"input_ids": ids, "attention_mask": batch["attention_mask"].astype(np.int64),
                  "token_type_ids": np.zeros_like(ids)}
        mean, logvar = self.encoder.run(None, {name: inputs[name] for name in self.encoder_inputs})
        return mean, logvar

    def generate(self, latent_z: np.ndarray, max_new_tokens: int = 32, do_sample: bool = False,
                 temperature: float = 1.0, seed: int | None = None, min_new_tokens: int = 0) -> np.ndarray:
        """Token ids `[batch, 1 + generated]` (BOS first) decoded from each latent row: greedy, or sampled from the
        softmax at `temperature`; a row stops at EOS (later positions hold the pad id, or EOS without one), which
        is banned for the first `min_new_tokens` tokens, as `generate(min_new_tokens=...)` does."""
        if max_new_tokens > self.max_positions:
            raise HfExtError(f"max_new_tokens {max_new_tokens} exceeds the decoder's positions ({self.max_positions})")
        latent_z = np.asarray(latent_z, dtype=np.float32)
        batch = latent_z.shape[0]
        rng = np.random.default_rng(seed)
        tokens = np.full((batch, 1), self.bos_token_id, dtype=np.int64)
        past = {name: np.zeros((batch, self.key_value_heads, 0, self.head_dim), dtype=np.float32)
                for name in cache_names("past", self.num_layers)}
        finished = np.zeros(batch, dtype=bool)
        filler = self.eos_token_id if self.pad_token_id is None else self.pad_token_id
        step_input = tokens
        for step in range(max_new_tokens):
            logits, *present = self.decoder.run(None, {"input_ids": step_input, "latent_z": latent_z, **past})
            scores = logits[:, -1].astype(np.float64)
            if step < min_new_tokens:
                scores[:, self.eos_token_id] = -np.inf
            if do_sample:
                scores = scores / temperature
                probabilities = np.exp(scores - scores.max(-1, keepdims=True))
                probabilities /= probabilities.sum(-1, keepdims=True)
                next_tokens = np.array([rng.choice(len(row), p=row) for row in probabilities])
            else:
                next_tokens = scores.argmax(-1)
            next_tokens = np.where(finished, filler, next_tokens)
            finished |= next_tokens == self.eos_token_id
            tokens = np.concatenate([tokens, next_tokens[:, None]], axis=1)
            if finished.all():
                break
            past = dict(zip(past, present, strict=True))
            step_input = next_tokens[:, None].astype(np.int64)
        return tokens

    def decode(self, latent_z: np.ndarray, **generation_kwargs: Any) -> list[str]:
        return self.processor.batch_decode(torch.from_numpy(self.generate(latent_z, **generation_kwargs)))

    def reconstruct(self, texts: list[str], **generation_kwargs: Any) -> list[str]:
        return self.decode(self.encode(texts)[0], **generation_kwargs)
