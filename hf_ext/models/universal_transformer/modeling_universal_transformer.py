"""Universal Transformer (Dehghani et al., ICLR 2019) with Adaptive Computation Time, as tensor2tensor implements it.

One pre-norm layer (self-attention, in the decoder encoder-decoder attention, a transition function) is applied over
depth. Before every step the position sinusoid and the step signal are added to the running state. Without ACT the
loop takes `num_steps` steps. With ACT (t2t's `universal_transformer_act`, act_type "basic") every position carries a
halting probability computed from the state after the signals are added; a position halts when it would pass
`act_threshold`, receives the remainder R = 1 - (its summed probabilities) as the weight of its last step, and the
output is the running mix of the transformed states weighted by those probabilities. There is no forced halt at the
last step. The bookkeeping (halting probability, remainders, number of updates N) is kept in float32 (or the model's
dtype where wider). The ponder cost mean(N + R) over non-padding positions is returned and, times `act_loss_weight`,
added to the training loss with its gradient (which reaches the halting unit through R).

The loop stops as soon as every position has halted. With `act_halted_state="frozen"` a halted position is not
transformed again: later steps read it as key and value (and, for convolutional transitions, as a neighbour). This
module computes that readably (every position at every step, the halted ones kept: `_dense_act_steps` and the
layer's dense path, which exported graphs take); the model runs the fast path of
`modeling_universal_transformer_packed.py`, where the halting unit, queries, attention output and transition are
computed for the running positions only, packed across the batch, and the halted keys and values are kept up to date
in O(depth) per position. The dense computation is the fast path's test oracle: outputs, numbers of updates and
gradients agree.
"""

import math
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import nn
from torch.nn import functional as F
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.conversion_mapping import register_checkpoint_conversion_mapping
from transformers.core_model_loading import WeightRenaming
from transformers.generation import GenerationMixin
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.bart.modeling_bart import shift_tokens_right
from transformers.models.bert.modeling_bert import eager_attention_forward
from transformers.utils import ModelOutput
from transformers.utils.generic import can_return_tuple

from .configuration_universal_transformer import UniversalTransformerConfig
from .modeling_universal_transformer_packed import PackedStep, QueryLayout, packed_act_steps, packed_layer_forward

# The token embedding is the model's (`embed_tokens`); it was the encoder stack's (`encoder.embed_tokens`) until it
# moved out for FSDP2 (UniversalTransformerStack). Checkpoints keep that older name, which transformers renames on
# loading and back on saving, so that folders written before and after the move read alike.
register_checkpoint_conversion_mapping(
    "universal-transformer", [WeightRenaming(r"encoder\.embed_tokens\.", "embed_tokens.")], overwrite=True)


def take_the_embedding_under_its_saved_name(module: nn.Module, state_dict: dict[str, torch.Tensor], prefix: str,
                                            *args: Any) -> None:
    """A `load_state_dict` pre-hook of the modules that own `embed_tokens`: the embedding from its saved name
    `encoder.embed_tokens.`, for the loads that bypass transformers' renaming (Trainer resuming from a checkpoint
    loads the raw file)."""
    for key in [key for key in state_dict if key.startswith(f"{prefix}encoder.embed_tokens.")]:
        state_dict.setdefault(prefix + key[len(f"{prefix}encoder."):], state_dict.pop(key))


@dataclass
class UniversalTransformerModelOutput(ModelOutput):
    r"""
    last_hidden_state (`torch.FloatTensor` of shape `(batch_size, sequence_length, hidden_size)`): the encoder output
        (with ACT the weighted mix of the step outputs), after the final layer norm when the config has one.
    n_updates (`torch.FloatTensor` of shape `(batch_size, sequence_length)`): with ACT, the number of steps each
        position took (N); 0 at padding positions.
    remainders (`torch.FloatTensor` of shape `(batch_size, sequence_length)`): with ACT, the weight R of each
        position's halting step; 0 for positions that never halted and at padding positions.
    ponder_cost (`torch.FloatTensor` of shape `()`): with ACT, mean(N + R) over non-padding positions, differentiable.
    hidden_states (`tuple(torch.FloatTensor)`): with `output_hidden_states`, the state entering the loop and the state
        after every step taken.
    attentions (`tuple(torch.FloatTensor)`): with `output_attentions`, the self-attention weights of every step taken,
        each `(batch_size, num_heads, sequence_length, sequence_length)`; rows of halted (frozen) positions are zero.
    cross_attentions (`tuple(torch.FloatTensor)`): the decoder's, likewise, over the encoder positions.
    """

    last_hidden_state: torch.Tensor | None = None
    n_updates: torch.Tensor | None = None
    remainders: torch.Tensor | None = None
    ponder_cost: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None
    cross_attentions: tuple[torch.Tensor, ...] | None = None


@dataclass
class UniversalTransformerSequenceClassifierOutput(ModelOutput):
    r"""
    loss (`torch.FloatTensor` of shape `()`): classification loss plus `act_loss_weight` x `ponder_cost`.
    logits (`torch.FloatTensor` of shape `(batch_size, num_labels)`).
    ponder_cost, n_updates, remainders, hidden_states, attentions: the encoder's, see
        `UniversalTransformerModelOutput`.
    """

    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    ponder_cost: torch.Tensor | None = None
    n_updates: torch.Tensor | None = None
    remainders: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


@dataclass
class UniversalTransformerSeq2SeqLMOutput(ModelOutput):
    r"""
    loss (`torch.FloatTensor` of shape `()`): token cross-entropy (label-smoothed by `config.label_smoothing`) plus
        `act_loss_weight` x `ponder_cost`.
    logits (`torch.FloatTensor` of shape `(batch_size, target_length, vocab_size)`).
    ponder_cost (`torch.FloatTensor` of shape `()`): encoder plus decoder ponder cost (tensor2tensor's act loss before
        weighting).
    decoder_* / encoder_*: each side's `UniversalTransformerModelOutput` fields.
    """

    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    ponder_cost: torch.Tensor | None = None
    decoder_n_updates: torch.Tensor | None = None
    decoder_remainders: torch.Tensor | None = None
    decoder_ponder_cost: torch.Tensor | None = None
    decoder_hidden_states: tuple[torch.Tensor, ...] | None = None
    decoder_attentions: tuple[torch.Tensor, ...] | None = None
    cross_attentions: tuple[torch.Tensor, ...] | None = None
    encoder_last_hidden_state: torch.Tensor | None = None
    encoder_n_updates: torch.Tensor | None = None
    encoder_remainders: torch.Tensor | None = None
    encoder_ponder_cost: torch.Tensor | None = None
    encoder_hidden_states: tuple[torch.Tensor, ...] | None = None
    encoder_attentions: tuple[torch.Tensor, ...] | None = None


def timing_signal(length: int, channels: int, device: torch.device | str | None = None,
                  dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """tensor2tensor's sinusoid `[length, channels]`: `[sin(pos * inv) | cos(pos * inv)]` with
    `inv_i = exp(-i ln(1e4) / max(n - 1, 1))`, n = channels // 2 (halves concatenated, zero-padded if odd)."""
    num_timescales = channels // 2
    increment = math.log(1.0e4) / max(num_timescales - 1, 1)
    inverse = torch.exp(torch.arange(num_timescales, dtype=torch.float64) * -increment)
    scaled = torch.arange(length, dtype=torch.float64).unsqueeze(1) * inverse.unsqueeze(0)
    signal = torch.cat([torch.sin(scaled), torch.cos(scaled), scaled.new_zeros(length, channels % 2)], dim=1)
    return signal.to(device=device, dtype=dtype)


def at_least_float32(dtype: torch.dtype) -> torch.dtype:
    """The dtype for ACT bookkeeping and losses: float32, or wider if the model is."""
    return torch.promote_types(dtype, torch.float32)


def attention_bias(attention_mask: torch.Tensor | None, length: int, causal: bool, dtype: torch.dtype,
                   device: torch.device | str | None) -> torch.Tensor | None:
    """Additive mask `[batch or 1, 1, length or 1, length]`: 0 where a query may attend, the dtype's minimum elsewhere
    (a fully masked row then attends uniformly instead of producing NaN); None without a mask and not causal. A given
    mask is used even when it masks nothing: checking would be a data-dependent branch, which `torch.export` refuses."""
    allowed = None
    if attention_mask is not None:
        allowed = attention_mask.to(device=device, dtype=torch.bool)[:, None, None, :]
    if causal:
        lower = torch.ones(length, length, dtype=torch.bool, device=device).tril()[None, None]
        allowed = lower if allowed is None else allowed & lower
    if allowed is None:
        return None
    return torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill(~allowed, torch.finfo(dtype).min)


class UniversalTransformerLayerNorm(nn.Module):
    """tensor2tensor's layer norm (biased variance inside the square root), or the PyTorch re-implementation's
    `weight * (x - mean) / (unbiased std + eps) + bias`."""

    def __init__(self, size, eps, unbiased_std):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.bias = nn.Parameter(torch.zeros(size))
        self.eps = eps
        self.unbiased_std = unbiased_std

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.unbiased_std:
            mean = hidden.mean(-1, keepdim=True)
            return self.weight * (hidden - mean) / (hidden.std(-1, keepdim=True) + self.eps) + self.bias
        return F.layer_norm(hidden, self.weight.shape, self.weight, self.bias, self.eps)

    def inverse_scale(self, variance: torch.Tensor) -> torch.Tensor:
        """What this norm multiplies the centred input by, from its biased variance `variance`:
        `forward(x) = weight * (x - mean(x)) * inverse_scale(var(x)) + bias`."""
        if self.unbiased_std:
            size = self.weight.shape[0]
            return 1.0 / (torch.sqrt(variance * (size / (size - 1))) + self.eps)
        return torch.rsqrt(variance + self.eps)


class UniversalTransformerEmbedding(nn.Embedding):
    """Token embeddings as t2t's symbol bottom reads them: times sqrt(embedding_size) with `scale_embeddings`, zero
    for the padding id. Scaling here rather than in the stack makes `get_input_embeddings()(input_ids)` what the model
    reads, so `inputs_embeds` built that way give the outputs of `input_ids` (transformers' convention)."""

    def __init__(self, config: UniversalTransformerConfig):
        super().__init__(config.vocab_size, config.embedding_size)
        self.scale = math.sqrt(config.embedding_size) if config.scale_embeddings else 1.0
        self.pad_token_id = config.pad_token_id

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        embeds = super().forward(input_ids) * self.scale
        if self.pad_token_id is not None:
            embeds = embeds * (input_ids != self.pad_token_id).unsqueeze(-1).to(embeds.dtype)
        return embeds


def layer_norm(config: UniversalTransformerConfig) -> UniversalTransformerLayerNorm:
    return UniversalTransformerLayerNorm(config.hidden_size, config.layer_norm_eps,
                                         config.layer_norm_type == "unbiased_std")


class UniversalTransformerAttention(nn.Module):
    """Multi-head attention without biases (tensor2tensor's `multihead_attention`); key/query and value widths may
    differ from the hidden size. Keys and values are projected separately from queries, so that they can be computed
    once for positions that are only read."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.num_heads = config.num_attention_heads
        self.key_head_dim = config.attention_key_depth // self.num_heads
        self.value_head_dim = config.attention_value_depth // self.num_heads
        self.scaling = self.key_head_dim**-0.5
        self.is_causal = False  # masks are always given explicitly
        self.q_proj = nn.Linear(config.hidden_size, config.attention_key_depth, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, config.attention_key_depth, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, config.attention_value_depth, bias=False)
        self.o_proj = nn.Linear(config.attention_value_depth, config.hidden_size, bias=False)

    def _heads(self, states, head_dim):
        return states.view(*states.shape[:2], self.num_heads, head_dim).transpose(1, 2)

    def project_key_value(self, states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`[batch, length, hidden]` -> keys and values `[batch, heads, length, head_dim]`."""
        return self.split_heads(self.k_proj(states), self.v_proj(states))

    def split_heads(self, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Projected keys and values `[batch, length, depth]` -> `[batch, heads, length, head_dim]`."""
        return self._heads(key, self.key_head_dim), self._heads(value, self.value_head_dim)

    def stacked_key_value_weight(self) -> torch.Tensor | None:
        """The key and value projections stacked, `[key depth + value depth, hidden]`: one product gives keys and
        values side by side (`FrozenKeyValues`); None when the projections are not plain linear maps (adapters such
        as PEFT's LoRA wrap them)."""
        if type(self.k_proj) is not nn.Linear or type(self.v_proj) is not nn.Linear:
            return None
        return torch.cat([self.k_proj.weight, self.v_proj.weight])

    def forward(self, queries: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attention_bias: torch.Tensor | None = None, layout: QueryLayout | None = None,
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The attention output `[batch, queries, hidden]` and the weights `[batch, heads, queries, keys]` (None
        from attention functions that do not compute them, such as SDPA). With a `layout`, the queries come packed
        (`[running, hidden]`) and so does the output: they are projected packed and laid out in the layout's slots
        only for the attention itself."""
        projected = self.q_proj(queries)
        if layout is not None:
            projected = layout.pad(projected)
        attention = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, eager_attention_forward)
        output, weights = attention(self, self._heads(projected, self.key_head_dim), key, value, attention_bias,
                                    scaling=self.scaling,
                                    dropout=self.config.attention_dropout if self.training else 0.0)
        output = output.reshape(*projected.shape[:2], -1)
        return self.o_proj(output if layout is None else layout.unpad(output)), weights


def padded_conv(conv: nn.Module, hidden: torch.Tensor, causal: bool) -> torch.Tensor:
    """Apply a `Conv1d` along the sequence of `[batch, length, channels]`: SAME padding, or LEFT (causal)."""
    weight = conv.weight  # not kernel_size: adapter wrappers (PEFT LoRA) expose the weight only
    assert isinstance(weight, torch.Tensor)
    width = weight.shape[-1]
    padding = (width - 1, 0) if causal else (width // 2, (width - 1) // 2)
    return conv(F.pad(hidden.transpose(1, 2), padding)).transpose(1, 2)


def zero_padding(hidden: torch.Tensor, nonpadding: torch.Tensor | None) -> torch.Tensor:
    """Padding positions must not leak into convolutions (t2t's `maybe_zero_out_padding`)."""
    return hidden if nonpadding is None else hidden * nonpadding


class UniversalTransformerDenseTransition(nn.Module):
    """t2t's "fc" transition: dense + ReLU -> dense, both biased."""

    position_wise = True

    def __init__(self, config, causal):
        super().__init__()
        self.fc1 = nn.Linear(config.hidden_size, config.intermediate_size)
        self.fc2 = nn.Linear(config.intermediate_size, config.hidden_size)
        self.dropout = nn.Dropout(config.relu_dropout)

    def forward(self, hidden: torch.Tensor, nonpadding: torch.Tensor | None = None) -> torch.Tensor:
        return self.fc2(self.dropout(F.relu(self.fc1(hidden))))


class UniversalTransformerSepConvTransition(nn.Module):
    """t2t's "sepconv" transition: separable conv (kernel 3) + ReLU -> separable conv (kernel 5). A separable conv is
    a bias-free depthwise conv followed by a biased pointwise (1x1) conv."""

    position_wise = False

    def __init__(self, config, causal):
        super().__init__()
        hidden, inner = config.hidden_size, config.intermediate_size
        self.causal = causal
        self.depthwise1 = nn.Conv1d(hidden, hidden, 3, groups=hidden, bias=False)
        self.pointwise1 = nn.Linear(hidden, inner)
        self.depthwise2 = nn.Conv1d(inner, inner, 5, groups=inner, bias=False)
        self.pointwise2 = nn.Linear(inner, hidden)
        self.dropout = nn.Dropout(config.relu_dropout)

    def forward(self, hidden: torch.Tensor, nonpadding: torch.Tensor | None = None) -> torch.Tensor:
        hidden = padded_conv(self.depthwise1, zero_padding(hidden, nonpadding), self.causal)
        hidden = self.dropout(F.relu(self.pointwise1(hidden)))
        return self.pointwise2(padded_conv(self.depthwise2, zero_padding(hidden, nonpadding), self.causal))


class UniversalTransformerConvTransition(nn.Module):
    """The PyTorch re-implementation's transition: conv (kernel 3) + ReLU -> conv (kernel 3) + ReLU, dropout after
    each ReLU. The trailing ReLU is that code's (a bug there, kept for parity)."""

    position_wise = False

    def __init__(self, config, causal):
        super().__init__()
        self.causal = causal
        self.conv1 = nn.Conv1d(config.hidden_size, config.intermediate_size, 3)
        self.conv2 = nn.Conv1d(config.intermediate_size, config.hidden_size, 3)
        self.dropout = nn.Dropout(config.relu_dropout)

    def forward(self, hidden: torch.Tensor, nonpadding: torch.Tensor | None = None) -> torch.Tensor:
        hidden = self.dropout(F.relu(padded_conv(self.conv1, zero_padding(hidden, nonpadding), self.causal)))
        return self.dropout(F.relu(padded_conv(self.conv2, zero_padding(hidden, nonpadding), self.causal)))


TRANSITION_CLASSES = {
    "fc": UniversalTransformerDenseTransition,
    "sepconv": UniversalTransformerSepConvTransition,
    "conv": UniversalTransformerConvTransition,
}


class UniversalTransformerLayer(GradientCheckpointingLayer):
    """The shared pre-norm layer: `x + dropout(attention(LN(x)))` [then the same with encoder-decoder attention],
    then `x + dropout(transition(LN(x)))`. With gradient checkpointing every step it takes is recomputed in the
    backward pass."""

    def __init__(self, config, is_decoder):
        super().__init__()
        self.self_attn_layer_norm = layer_norm(config)
        self.self_attn = UniversalTransformerAttention(config)
        if is_decoder:
            self.cross_attn_layer_norm = layer_norm(config)
            self.cross_attn = UniversalTransformerAttention(config)
        self.transition_layer_norm = layer_norm(config)
        self.transition = TRANSITION_CLASSES[config.transition](config, causal=is_decoder)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, states: torch.Tensor, self_attention_bias: torch.Tensor | None = None,
                running: torch.Tensor | None = None, nonpadding: torch.Tensor | None = None,
                cross_key_value: tuple[torch.Tensor, torch.Tensor] | None = None,
                cross_attention_bias: torch.Tensor | None = None, passthrough: torch.Tensor | None = None,
                packed: PackedStep | None = None,
                ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """Transform one step's inputs; returns the new states and the self- and cross-attention weights over all
        positions (None where not computed).

        Dense: `states` `[batch, length, hidden]`, every position computed; with a `running` mask the others are
        read as their step input by a convolution and come back as `passthrough` (default: their step input): the
        definition of the "frozen" semantics, which an exported graph computes.
        Packed (`packed`): `states` are the step inputs of the running positions only, `[running, hidden]` in mask
        order, and so are the new states (`packed_layer_forward`)."""
        if packed is not None:
            return packed_layer_forward(self, states, self_attention_bias, nonpadding, cross_key_value,
                                        cross_attention_bias, packed)
        queries = self.self_attn_layer_norm(states)
        key, value = self.self_attn.project_key_value(queries)
        attention_output, self_weights = self.self_attn(queries, key, value, self_attention_bias)
        hidden = states + self.dropout(attention_output)
        cross_weights = None
        if cross_key_value is not None:
            attention_output, cross_weights = self.cross_attn(self.cross_attn_layer_norm(hidden), *cross_key_value,
                                                              cross_attention_bias)
            hidden = hidden + self.dropout(attention_output)
        if running is not None:
            hidden = torch.where(running.unsqueeze(-1), hidden, states)
        hidden = hidden + self.dropout(self.transition(self.transition_layer_norm(hidden), nonpadding))
        if running is not None:
            hidden = torch.where(running.unsqueeze(-1), hidden, states if passthrough is None else passthrough)
        return hidden, self_weights, cross_weights


class AdaptiveComputationTime:
    """tensor2tensor's ACT bookkeeping for one pass: halting probabilities, remainders and number of updates per
    position, in float32 (or the model's dtype where wider). Padding counts as halted from the start: no steps, no
    cost, no hold on the loop."""

    def __init__(self, config: UniversalTransformerConfig, state: torch.Tensor, nonpadding: torch.Tensor | None):
        self.threshold, self.max_steps = config.act_threshold, config.act_max_steps
        self.halting_probability = torch.zeros(state.shape[:2], dtype=at_least_float32(state.dtype),
                                               device=state.device)
        if nonpadding is not None:
            self.halting_probability = self.halting_probability.masked_fill(~nonpadding, 1.0)
        self.remainders = torch.zeros_like(self.halting_probability)
        self.n_updates = torch.zeros_like(self.halting_probability)

    @property
    def running(self) -> torch.Tensor:
        """`[batch, length]`: the positions still transformed (t2t's `halting_probability < 1`)."""
        return self.halting_probability < 1.0

    def continues(self) -> bool:
        """Whether the loop goes on: some position is below the threshold and below the step limit."""
        return bool(((self.halting_probability < self.threshold) & (self.n_updates < self.max_steps)).any())

    def update(self, p: torch.Tensor, running_index: torch.Tensor | None = None) -> torch.Tensor:
        """Account for one step with halting probabilities `p` `[batch, length]`, or of the running positions only
        (`[running]`, at flat indices `running_index` into `batch * length`); returns every position's weight
        `[batch, length]` of the step's new state in the output."""
        probability = self.halting_probability
        if running_index is not None:
            p = probability.new_zeros(probability.numel()).index_copy(0, running_index, p).view_as(probability)
        running = self.running
        accumulated = probability + p * running
        new_halted = (accumulated > self.threshold) & running
        still_running = (accumulated <= self.threshold) & running
        update = p * still_running
        probability = probability + update
        self.remainders = self.remainders + new_halted * (1 - probability)
        remainder = new_halted * self.remainders
        self.halting_probability = probability + remainder
        self.n_updates = self.n_updates + still_running + new_halted
        return update + remainder


def fill_steps_not_taken(recorded: dict[str, tuple | None], max_steps: int,
                         no_attention: dict[str, torch.Tensor]) -> None:
    """Complete the recorded outputs of an ACT loop that stopped before `max_steps` (every position had halted) to
    transformers' convention of `num_hidden_layers` (`max_steps`) steps: `hidden_states` gets `max_steps + 1` entries,
    the steps not taken repeating the last state (as every halted position's state repeats), and each attention
    tuple `max_steps` entries, `no_attention[name]` (zero weights: no position attended) for the steps not taken
    (None where the attention function returns no weights)."""
    states = recorded["hidden_states"]
    if states is not None:
        recorded["hidden_states"] = states + (states[-1],) * (max_steps + 1 - len(states))
    for name, zeros in no_attention.items():
        weights = recorded[name]
        if weights is not None and len(weights) < max_steps:
            filler = None if weights and weights[-1] is None else zeros
            recorded[name] = weights + (filler,) * (max_steps - len(weights))


class UniversalTransformerStack(nn.Module):
    """One side (encoder or decoder): embedding lookup, input dropout, the optional embedding projection, the shared
    layer applied over depth (fixed steps or ACT) and the final layer norm.

    The token embedding is the model's, not the stack's: `input_embeddings` is the model's `get_input_embeddings`,
    called at every lookup. A stack is one FSDP unit (`_no_split_modules`) and shards what it holds; the embedding the
    encoder, decoder and softmax share must lie outside both stacks, in the model's unit, to stay one parameter (as
    transformers' T5 and BART keep theirs outside their layers). Reading it through the model also follows a
    replaced embedding (`set_input_embeddings`, `resize_token_embeddings`)."""

    main_input_name = "input_ids"  # generate() calls the encoder side directly

    def __init__(self, config, is_decoder, input_embeddings):
        super().__init__()
        self.config = config
        self.is_decoder = is_decoder
        self.input_embeddings = input_embeddings
        self.dropout = nn.Dropout(config.input_dropout)
        self.embedding_proj = (nn.Linear(config.embedding_size, config.hidden_size, bias=False)
                               if config.project_embeddings else None)
        self.layer = UniversalTransformerLayer(config, is_decoder)
        self.halting = nn.Linear(config.hidden_size, 1) if config.use_act else None
        self.step_embeddings = (nn.Parameter(torch.empty(config.num_step_signals, config.hidden_size))
                                if config.step_signal == "learned" else None)
        self.final_layer_norm = layer_norm(config) if config.final_layer_norm else None

    def step_signals(self, device: torch.device | str | None, dtype: torch.dtype) -> torch.Tensor:
        """`[num_step_signals, hidden]`: the signal added before each step."""
        config = self.config
        if config.step_signal == "learned":
            return (self.step_embeddings * math.sqrt(config.hidden_size)).to(dtype)
        if config.step_signal == "sinusoid":
            return timing_signal(config.num_step_signals, config.hidden_size, device, dtype)
        return torch.zeros(config.num_step_signals, config.hidden_size, device=device, dtype=dtype)

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        **kwargs: Any,
    ) -> UniversalTransformerModelOutput:
        """One side's pass; `output_attentions` / `output_hidden_states` default to the config's."""
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("give exactly one of input_ids and inputs_embeds")
        config = self.config
        output_attentions = config.output_attentions if output_attentions is None else output_attentions
        output_hidden_states = config.output_hidden_states if output_hidden_states is None else output_hidden_states
        if inputs_embeds is None:
            inputs_embeds = self.input_embeddings()(input_ids)
        state = self.dropout(inputs_embeds)
        if self.embedding_proj is not None:
            state = self.embedding_proj(state)
        length, dtype, device = state.shape[1], state.dtype, state.device
        nonpadding = attention_mask.to(device=device, dtype=torch.bool) if attention_mask is not None else None
        self_bias = attention_bias(attention_mask, length, self.is_decoder, dtype, device)
        cross = {}
        if self.is_decoder:
            if encoder_hidden_states is None:
                raise ValueError("the decoder needs encoder_hidden_states")
            cross = {"cross_key_value": self.layer.cross_attn.project_key_value(encoder_hidden_states),
                     "cross_attention_bias": attention_bias(encoder_attention_mask, encoder_hidden_states.shape[1],
                                                            False, dtype, device)}
        conv_mask = nonpadding.unsqueeze(-1).to(dtype) if nonpadding is not None else None

        recorded = {"hidden_states": (state,) if output_hidden_states else None,
                    "attentions": () if output_attentions else None,
                    "cross_attentions": () if output_attentions and self.is_decoder else None}

        def transform(step_input, running=None, passthrough=None, packed=None):
            """The shared layer on one step's input; records the step's outputs that were asked for."""
            new_state, self_weights, cross_weights = self.layer(step_input, self_bias, running=running,
                                                                nonpadding=conv_mask, passthrough=passthrough,
                                                                packed=packed, **cross)
            for name, value in (("attentions", self_weights), ("cross_attentions", cross_weights)):
                if recorded[name] is not None:
                    recorded[name] += (value,)
            return new_state

        def record(new_state):
            if recorded["hidden_states"] is not None:
                recorded["hidden_states"] += (new_state,)

        position = timing_signal(length, config.hidden_size, device, dtype)
        steps = self.step_signals(device, dtype)
        n_updates = remainders = ponder_cost = None
        if config.use_act:
            act = AdaptiveComputationTime(config, state, nonpadding)
            # An exported graph cannot hold the loop's data-dependent exit nor the packing of the running positions:
            # it takes the dense loop (every position computed, the halted ones kept).
            if config.act_halted_state == "frozen" and not torch.compiler.is_exporting():
                output = packed_act_steps(self, act, state, position, steps, transform, record,
                                          output_hidden_states)
            else:
                output = self._dense_act_steps(act, state, position, steps, transform, record)
            n_updates, remainders = act.n_updates, act.remainders
            counted = nonpadding.to(n_updates.dtype) if nonpadding is not None else torch.ones_like(n_updates)
            ponder_cost = ((n_updates + remainders) * counted).sum() / counted.sum().clamp(min=1.0)
            keys = {"attentions": length}
            if self.is_decoder:
                assert encoder_hidden_states is not None  # a decoder without them was refused above
                keys["cross_attentions"] = encoder_hidden_states.shape[1]
            # zero maps are built only for what is recorded: an unrecorded forward allocates nothing here
            fill_steps_not_taken(recorded, act.max_steps,
                                 {name: state.new_zeros(state.shape[0], config.num_attention_heads, length, width)
                                  for name, width in keys.items() if recorded[name] is not None})
        else:
            for step in range(config.num_steps):
                state = transform(state + position + steps[step])
                record(state)
            output = state
        if self.final_layer_norm is not None:
            output = self.final_layer_norm(output)
        return UniversalTransformerModelOutput(last_hidden_state=output, n_updates=n_updates, remainders=remainders,
                                               ponder_cost=ponder_cost, **recorded)

    def halting_probabilities(self, step_inputs: torch.Tensor) -> torch.Tensor:
        """Each position's halting probability (`[batch, length]`, or `[running]` for packed step inputs), in
        float32 or wider."""
        return torch.sigmoid(self.halting(step_inputs).squeeze(-1).to(at_least_float32(step_inputs.dtype)))

    def _dense_act_steps(self, act, state, position, steps, transform, record):
        """The ACT loop over every position; returns the mixed state. With "frozen" semantics (the exported graph's
        path) the halted positions are computed and then kept; such a graph takes all `act_max_steps` steps, since
        a step after every position halted changes nothing."""
        frozen, exporting = self.config.act_halted_state == "frozen", torch.compiler.is_exporting()
        mixed = torch.zeros_like(state)
        for step in range(act.max_steps):
            if not exporting and not act.continues():
                break
            step_input = state + position + steps[step]
            running = act.running
            weights = act.update(self.halting_probabilities(step_input))
            state = transform(step_input, running if frozen else None, passthrough=state)
            mixed = torch.lerp(mixed, state, weights.unsqueeze(-1).to(state.dtype))  # in one pass
            record(state)
        return mixed

class UniversalTransformerPreTrainedModel(PreTrainedModel):
    config: UniversalTransformerConfig
    base_model_prefix = "universal_transformer"
    main_input_name = "input_ids"
    supports_gradient_checkpointing = True
    _no_split_modules = ["UniversalTransformerStack"]
    _supports_sdpa = True
    _supports_attention_backend = True
    # Trainer: the loss is a batch mean, not normalised across gradient-accumulation steps.
    accepts_loss_kwargs = False

    @torch.no_grad()
    def _init_weights(self, module):
        config = self.config
        if isinstance(module, (nn.Linear, nn.Conv1d)):
            # t2t's uniform_unit_scaling: U(-a, a) with a = sqrt(3 gain / fan_in)
            limit = math.sqrt(3.0 * config.initializer_gain / module.weight[0].numel())
            init.uniform_(module.weight, -limit, limit)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            init.normal_(module.weight, mean=0.0, std=config.hidden_size**-0.5)
        elif isinstance(module, UniversalTransformerLayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)
        elif isinstance(module, UniversalTransformerStack):
            if module.halting is not None:
                init.constant_(module.halting.bias, config.act_halting_bias_init)
            if module.step_embeddings is not None:
                init.normal_(module.step_embeddings, mean=0.0, std=config.hidden_size**-0.5)


class UniversalTransformerModel(UniversalTransformerPreTrainedModel):
    """The Universal Transformer encoder. Takes `input_ids` or `inputs_embeds` (used as given; those of ids are
    `get_input_embeddings()(input_ids)`, scaled) and an optional `attention_mask` (1 = token, 0 = padding)."""

    def __init__(self, config: UniversalTransformerConfig):
        super().__init__(config)
        self.embed_tokens: nn.Module = UniversalTransformerEmbedding(config)
        self.register_load_state_dict_pre_hook(take_the_embedding_under_its_saved_name)
        self.encoder = UniversalTransformerStack(config, False, self.get_input_embeddings)
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        return self.embed_tokens

    def set_input_embeddings(self, value: nn.Module) -> None:
        self.embed_tokens = value

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        **kwargs: Any,
    ) -> UniversalTransformerModelOutput:
        return self.encoder(input_ids=input_ids, attention_mask=attention_mask, inputs_embeds=inputs_embeds,
                            output_attentions=output_attentions, output_hidden_states=output_hidden_states)


def act_loss(config: UniversalTransformerConfig, *ponder_costs: torch.Tensor | None) -> torch.Tensor | float:
    """`act_loss_weight` x the summed ponder costs (0 without ACT)."""
    costs = [cost for cost in ponder_costs if cost is not None]
    return config.act_loss_weight * sum(costs) if costs else 0.0


class UniversalTransformerForSequenceClassification(UniversalTransformerPreTrainedModel):
    """Encoder, pooling (`config.classifier_pooling`: mean over tokens or first position), dropout, linear classifier.
    The loss is transformers' for `config.problem_type` (single-label: cross-entropy, multi-label: binary
    cross-entropy, regression: mean squared error; inferred from `num_labels` and the labels when unset) plus
    `act_loss_weight` x ponder cost."""

    def __init__(self, config: UniversalTransformerConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.universal_transformer = UniversalTransformerModel(config)
        dropout = config.classifier_dropout
        self.dropout = nn.Dropout(config.hidden_dropout_prob if dropout is None else dropout)
        assert config.num_labels is not None  # PretrainedConfig sets it (2 unless given)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        return self.universal_transformer.get_input_embeddings()

    def set_input_embeddings(self, value: nn.Module) -> None:
        self.universal_transformer.set_input_embeddings(value)

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        **kwargs: Any,
    ) -> UniversalTransformerSequenceClassifierOutput:
        outputs = self.universal_transformer(input_ids=input_ids, attention_mask=attention_mask,
                                             inputs_embeds=inputs_embeds, output_attentions=output_attentions,
                                             output_hidden_states=output_hidden_states, return_dict=True)
        hidden = outputs.last_hidden_state
        if self.config.classifier_pooling == "first":
            pooled = hidden[:, 0]
        elif attention_mask is None:
            pooled = hidden.mean(dim=1)
        else:
            weights = attention_mask.to(hidden.dtype).unsqueeze(-1)
            pooled = (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)
        logits = self.classifier(self.dropout(pooled))
        loss = None
        if labels is not None:
            # transformers' own choice of loss by `config.problem_type` (inferred from num_labels and the labels'
            # dtype when unset): cross-entropy, binary cross-entropy per label, or mean squared error
            loss = self.loss_function(labels=labels, pooled_logits=logits.to(at_least_float32(logits.dtype)),
                                      config=self.config)
            loss = loss + act_loss(self.config, outputs.ponder_cost)
        return UniversalTransformerSequenceClassifierOutput(
            loss=loss, logits=logits, ponder_cost=outputs.ponder_cost, n_updates=outputs.n_updates,
            remainders=outputs.remainders, hidden_states=outputs.hidden_states, attentions=outputs.attentions)


class UniversalTransformerForSeq2SeqLM(UniversalTransformerPreTrainedModel, GenerationMixin):
    """Encoder-decoder Universal Transformer, ACT on both sides, one embedding matrix shared by the encoder, the
    decoder and the output softmax (tensor2tensor's `shared_embedding_and_softmax_weights`): the decoder's embedding
    and the softmax are one parameter, the model's `embed_tokens.weight` (stored once, in checkpoints under its older
    name `encoder.embed_tokens.weight`).

    `labels` are the targets (-100 is ignored); the decoder input is the targets shifted right behind
    `decoder_start_token_id` (the pad id, whose embedding is zero: t2t's zero first input). There is no decoding cache,
    as in tensor2tensor: `generate()` re-runs the decoder over the whole prefix at every new token.
    """

    _tied_weights_keys = {"lm_head.weight": "embed_tokens.weight"}

    def __init__(self, config: UniversalTransformerConfig):
        super().__init__(config)
        if config.embedding_size != config.hidden_size:
            raise ValueError("the shared output softmax needs embedding_size == hidden_size")
        self.embed_tokens: nn.Module = UniversalTransformerEmbedding(config)
        self.register_load_state_dict_pre_hook(take_the_embedding_under_its_saved_name)
        self.encoder = UniversalTransformerStack(config, False, self.get_input_embeddings)
        self.decoder = UniversalTransformerStack(config, True, self.get_input_embeddings)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        return self.embed_tokens

    def set_input_embeddings(self, value: nn.Module) -> None:
        self.embed_tokens = value

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def set_output_embeddings(self, new_embeddings: nn.Module) -> None:
        self.lm_head = new_embeddings

    def save_pretrained(self, save_directory: Any, *args: Any, **kwargs: Any) -> None:
        """`PreTrainedModel.save_pretrained`, and where the config names the text-to-text pipeline in
        `custom_pipelines` (a model loaded from a folder hf-ext wrote), the pipeline's code beside the model's, so
        that the new folder runs it as remote code too."""
        super().save_pretrained(save_directory, *args, **kwargs)
        if getattr(self.config, "custom_pipelines", None):
            from transformers.dynamic_module_utils import custom_object_save

            from .pipeline_universal_transformer import UniversalTransformerText2TextPipeline

            custom_object_save(UniversalTransformerText2TextPipeline, str(save_directory))

    @classmethod
    def _supports_default_dynamic_cache(cls):
        return False  # no decoding cache: nothing for generate() to build

    def prepare_inputs_for_generation(self, input_ids: torch.Tensor, next_sequence_length: int | None = None,
                                      **kwargs: Any) -> dict[str, Any]:
        # without a cache every step re-reads the whole decoder prefix (the ACT loop runs over all of it); a cache
        # arrives under no name this model reads (`cache` since transformers 5.24, `past_key_values` before)
        for unused in ("use_cache", "cache", "past_key_values"):
            kwargs.pop(unused, None)
        return super().prepare_inputs_for_generation(input_ids, **kwargs)

    def _expand_inputs_for_generation(self, expand_size=1, is_encoder_decoder=False, input_ids=None, **model_kwargs):
        # beam search and num_return_sequences repeat every row of the encoder outputs; the encoder's ponder cost is
        # a batch mean (a scalar, which cannot be repeated by rows), and repeating every row leaves it unchanged
        encoder_outputs = model_kwargs.get("encoder_outputs")
        ponder_cost = getattr(encoder_outputs, "ponder_cost", None)
        if ponder_cost is not None:
            model_kwargs["encoder_outputs"] = UniversalTransformerModelOutput(
                **{name: value for name, value in encoder_outputs.items() if name != "ponder_cost"})
        input_ids, model_kwargs = super()._expand_inputs_for_generation(
            expand_size, is_encoder_decoder, input_ids, **model_kwargs)
        if ponder_cost is not None:
            model_kwargs["encoder_outputs"]["ponder_cost"] = ponder_cost
        return input_ids, model_kwargs

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.Tensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: UniversalTransformerModelOutput | tuple | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        **kwargs: Any,
    ) -> UniversalTransformerSeq2SeqLMOutput:
        r"""
        decoder_attention_mask: padding mask of the decoder input; derived from `labels != -100` when only labels
            are given.
        encoder_outputs: a `UniversalTransformerModelOutput` (or tuple) of an earlier encoder call.
        """
        config = self.config
        if encoder_outputs is None:
            encoder_outputs = self.encoder(input_ids=input_ids, attention_mask=attention_mask,
                                           inputs_embeds=inputs_embeds, output_attentions=output_attentions,
                                           output_hidden_states=output_hidden_states)
        if not isinstance(encoder_outputs, UniversalTransformerModelOutput):  # a tuple: its first item is the state
            encoder_outputs = UniversalTransformerModelOutput(last_hidden_state=encoder_outputs[0])
        if labels is not None and decoder_input_ids is None and decoder_inputs_embeds is None:
            decoder_input_ids = shift_tokens_right(labels, config.pad_token_id, config.decoder_start_token_id)
            if decoder_attention_mask is None:
                decoder_attention_mask = (labels != -100).long()
        decoder_outputs = self.decoder(
            input_ids=decoder_input_ids, attention_mask=decoder_attention_mask, inputs_embeds=decoder_inputs_embeds,
            encoder_hidden_states=encoder_outputs.last_hidden_state, encoder_attention_mask=attention_mask,
            output_attentions=output_attentions, output_hidden_states=output_hidden_states)
        logits = self.lm_head(decoder_outputs.last_hidden_state)
        ponder_costs = [c for c in (encoder_outputs.ponder_cost, decoder_outputs.ponder_cost) if c is not None]
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).to(at_least_float32(logits.dtype)),
                                   labels.reshape(-1),
                                   ignore_index=-100, label_smoothing=config.label_smoothing)
            loss = loss + act_loss(config, *ponder_costs)
        return UniversalTransformerSeq2SeqLMOutput(
            # a sum of tensors: `ponder_costs` is not empty here (typeshed's sum also allows its start value, 0)
            loss=loss, logits=logits, ponder_cost=cast(torch.Tensor, sum(ponder_costs)) if ponder_costs else None,
            decoder_n_updates=decoder_outputs.n_updates, decoder_remainders=decoder_outputs.remainders,
            decoder_ponder_cost=decoder_outputs.ponder_cost, decoder_hidden_states=decoder_outputs.hidden_states,
            decoder_attentions=decoder_outputs.attentions, cross_attentions=decoder_outputs.cross_attentions,
            encoder_last_hidden_state=encoder_outputs.last_hidden_state, encoder_n_updates=encoder_outputs.n_updates,
            encoder_remainders=encoder_outputs.remainders, encoder_ponder_cost=encoder_outputs.ponder_cost,
            encoder_hidden_states=encoder_outputs.hidden_states, encoder_attentions=encoder_outputs.attentions)


__all__ = ["UniversalTransformerForSeq2SeqLM", "UniversalTransformerForSequenceClassification",
           "UniversalTransformerModel", "UniversalTransformerModelOutput", "UniversalTransformerPreTrainedModel",
           "UniversalTransformerSeq2SeqLMOutput", "UniversalTransformerSequenceClassifierOutput", "timing_signal"]
