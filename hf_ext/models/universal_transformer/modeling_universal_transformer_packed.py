"""The Universal Transformer's fast path of ACT with "frozen" halted positions: each step computes the halting unit,
queries, attention output and transition for the running positions only, packed across the batch (`[running,
hidden]`, kept with their flat indices into `batch * length`), while the halted positions are only read, as keys and
values, whose terms are kept up to date in O(depth) per position (`FrozenKeyValues`, `KeysAndValuesWithHalted`).

`modeling_universal_transformer.py` holds the model and the readable dense computation (every position at every
step, the halted ones kept), which is this path's definition and test oracle: outputs, numbers of updates and
gradients agree (tests/universal_transformer/test_act_running_positions.py). Remote code like it: it imports only
torch, and `save_pretrained` copies it beside it (a single-dot relative import of that module).
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeAlias

import torch
from torch.nn import functional as F

# a module of the dense file (its stack, layer, attention or layer norm), which this file cannot name: that file
# imports this one, and the package has no import loop, type hints included. Read through its attributes, as `Any`.
DenseModule: TypeAlias = Any


def flat_indices(mask: torch.Tensor) -> torch.Tensor:
    """The indices of `mask`'s True entries in the flattened mask, in order (the packed ACT loop's row order)."""
    return mask.flatten().nonzero().squeeze(1)


@dataclass
class QueryLayout:
    """The running positions' queries laid out for attention, `[batch, width]` slots: each batch row's running
    positions first, in order, then padding (width: the most running positions of a row)."""

    slots: torch.Tensor  # [running] the flat slot of each running position, in mask order
    row: torch.Tensor  # [running] the batch row of each running position
    batch: int
    width: int

    @classmethod
    def of(cls, running: torch.Tensor, running_index: torch.Tensor) -> "QueryLayout":
        """The layout of the positions `running` (`[batch, length]`) holds, whose flat indices (into `batch *
        length`, in mask order) are `running_index`."""
        counts = running.sum(dim=1)
        width = int(counts.max())
        row = torch.div(running_index, running.shape[1], rounding_mode="floor")
        first = counts.cumsum(0) - counts  # each batch row's first running position, in mask order
        slots = torch.arange(len(running_index), device=running_index.device) - first[row] + row * width
        return cls(slots, row, running.shape[0], width)

    def pad(self, packed: torch.Tensor) -> torch.Tensor:
        """`[running, ...]` -> `[batch, width, ...]`, zero in the padding slots."""
        padded = packed.new_zeros(self.batch * self.width, *packed.shape[1:]).index_copy(0, self.slots, packed)
        return padded.view(self.batch, self.width, *packed.shape[1:])

    def unpad(self, padded: torch.Tensor) -> torch.Tensor:
        """`[batch, width, ...]` -> `[running, ...]`."""
        return padded.reshape(self.batch * self.width, *padded.shape[2:]).index_select(0, self.slots)


def scatter_query_rows(weights: torch.Tensor, layout: QueryLayout, running_index: torch.Tensor,
                       length: int) -> torch.Tensor:
    """Attention weights `[batch, heads, width, keys]` of the running queries as `[batch, heads, length, keys]`, zero
    in the rows of the other positions."""
    per_query = layout.unpad(weights.transpose(1, 2))  # [running, heads, keys]
    full = per_query.new_zeros(layout.batch * length, *per_query.shape[1:]).index_copy(0, running_index, per_query)
    return full.view(layout.batch, length, *per_query.shape[1:]).transpose(1, 2)


def fill_rows(base: torch.Tensor, index: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """`base` (`[batch, length, ...]`, zero at the positions of flat indices `index` into `batch * length`) with
    `rows` there: in place unless autograd is recording, where an earlier step may have saved `base` for the backward
    pass. The rows are added onto the zeros: the backward pass of an addition hands the gradient on to `base` as it
    is, where that of a copy would clear the rows in a copy of it."""
    flat = base.flatten(0, 1)
    if torch.is_grad_enabled() and (base.requires_grad or rows.requires_grad):
        return flat.index_add(0, index, rows).view_as(base)
    flat.index_copy_(0, index, rows)
    return base


class KeysAndValuesWithHalted(torch.autograd.Function):
    """The keys `[batch, length, key_depth]` and values of every position: `rows` (`[running, depth]`, keys and values
    side by side, projected from the running positions' step inputs) at the running positions (mask `running`, flat
    indices `running_index`), `bias + scale * (projected + signal_term)` at the halted ones (`FrozenKeyValues`).
    Written by hand for its backward pass, which runs at every step of a training pass: it reads the incoming
    gradients in four passes, where autograd's for `addcmul`, `index_copy_` and `split` takes about twice as many and
    copies them twice (keys and values come out as two views of one tensor, and their gradients stay apart)."""

    @staticmethod
    def forward(ctx: Any, projected: torch.Tensor, scale: torch.Tensor, signal_term: torch.Tensor,
                bias: torch.Tensor, running: torch.Tensor, running_index: torch.Tensor, rows: torch.Tensor,
                key_depth: int) -> tuple[torch.Tensor, torch.Tensor]:
        ctx.save_for_backward(projected, scale, signal_term, running, running_index)
        ctx.key_depth = key_depth
        keys_values = torch.addcmul(bias, projected, scale).addcmul_(scale, signal_term)
        # rows in the frozen terms' dtype: autocast makes them bfloat16 or float16 (their gradient is cast back)
        keys_values.view(-1, rows.shape[-1]).index_copy_(0, running_index, rows.to(keys_values.dtype))
        return keys_values[..., :key_depth], keys_values[..., key_depth:]

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad_keys: torch.Tensor, grad_values: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        projected, scale, signal_term, running, running_index = ctx.saved_tensors
        halted = (~running).unsqueeze(-1).to(grad_keys.dtype)  # the running positions' formula values were overwritten
        halted_scale = scale * halted
        # the signal term's and the bias's gradients in one product: a single pass over each gradient
        position_weights = torch.stack([halted_scale, halted]).flatten(1)
        grad_projected = torch.empty_like(projected)
        grad_scale, grad_terms, grad_rows = grad_keys.new_zeros(()), [], []
        for grad, part in ((grad_keys, slice(None, ctx.key_depth)), (grad_values, slice(ctx.key_depth, None))):
            torch.mul(grad, halted_scale, out=grad_projected[..., part])
            grad_scale = grad_scale + torch.linalg.vecdot(grad, projected[..., part]) + grad @ signal_term[part]
            grad = grad.reshape(-1, grad.shape[-1])
            grad_terms.append(position_weights @ grad)
            grad_rows.append(grad.index_select(0, running_index))
        grad_signal_term, grad_bias = torch.cat(grad_terms, -1)
        return (grad_projected, grad_scale.unsqueeze(-1) * halted, grad_signal_term, grad_bias, None, None,
                torch.cat(grad_rows, -1), None)


class FrozenKeyValues:
    """The keys and values of the positions ACT has halted ("frozen" semantics), at every step, without projecting
    or normalising their states again.

    A halted position keeps its state h; its step input is x = u + s, with u = h + its position signal and s the
    step's signal. The pre-norm gives LN(x) = w * (x - mean(x)) * r + b with r the norm's inverse scale of var(x), so
    its key is K LN(x) = r * (A c + A c_s) + K b, with A = K diag(w), c = u - mean(u) and c_s = s - mean(s). When a
    position halts, `A c` is projected once and r is kept for every step to come, from var(x) = var(u) +
    2 mean(c * c_s) + var(s) (O(1) per position and step); a step then writes the key in O(depth). The same holds
    for values. This is the same function as projecting LN(x), computed in another order (float32
    results differ by rounding only)."""

    def __init__(self, attention: DenseModule, norm: DenseModule, signals: torch.Tensor, state: torch.Tensor):
        """`attention`: the layer's `UniversalTransformerAttention`; `norm`: its `UniversalTransformerLayerNorm`
        before attention; `signals`: the step signals `[steps, hidden]`; `state`: the `[batch, length, hidden]`
        states (for the shapes)."""
        self.norm = norm
        self.weight = attention.stacked_key_value_weight()
        statistics_dtype = torch.promote_types(state.dtype, torch.float32)  # as ACT's bookkeeping
        centred = signals - signals.mean(-1, keepdim=True)
        self.signals = centred.to(statistics_dtype)
        self.signal_variance = self.signals.square().mean(-1)
        self.any_frozen = False
        if self.weight is None:
            return
        # keys and values side by side, each product done once for both: A, K b and A c_s of every step
        # in the states' dtype: autocast makes the products bfloat16 or float16, which the hand-written backward of
        # KeysAndValuesWithHalted does not mix with its float32 gradients
        self.folded, self.bias = self.weight * norm.weight, (self.weight @ norm.bias).to(state.dtype)
        self.signal_terms = (centred @ self.folded.T).to(state.dtype)
        self.projected = state.new_zeros(*state.shape[:2], self.weight.shape[0])
        self.scales = state.new_zeros(*state.shape[:2], len(signals))  # r of every position and step

    @property
    def usable(self) -> bool:
        return self.weight is not None

    def freeze(self, halted_index: torch.Tensor, states: torch.Tensor) -> None:
        """Keep what later steps need of the positions that have just halted (flat indices `halted_index` into `batch
        * length`), from their `states` u (`[halted, hidden]`, in the same order). A position halts once: its rows
        are still zero."""
        centred = states - states.mean(-1, keepdim=True)
        wide = centred.to(self.signals.dtype)
        covariance = wide @ self.signals.T / centred.shape[-1]
        variance = (wide.square().mean(-1, keepdim=True) + 2 * covariance + self.signal_variance).clamp(min=0)
        self.scales = fill_rows(self.scales, halted_index, self.norm.inverse_scale(variance).to(self.scales.dtype))
        self.projected = fill_rows(self.projected, halted_index, (centred @ self.folded.T).to(self.projected.dtype))
        self.any_frozen = True

    def __call__(self, step: int) -> tuple[torch.Tensor, ...] | None:
        """What `KeysAndValuesWithHalted` needs of the frozen positions at `step`: `(A c, r, A c_s, K b)` for keys and
        values side by side (None while there are none, as where adapters wrap the projections)."""
        if not self.any_frozen:
            return None
        return self.projected, self.scales[..., step, None], self.signal_terms[step], self.bias


@dataclass
class PackedStep:
    """What the shared layer needs to transform only the running positions of an ACT step ("frozen" semantics)."""

    running: torch.Tensor  # [batch, length] mask of the running positions
    running_index: torch.Tensor  # their flat indices into batch * length, in mask order
    layout: QueryLayout  # their queries' layout for attention
    # the halted positions' terms of their keys and values (`FrozenKeyValues`), and the stacked projection that
    # gives the running positions' (`KeysAndValuesWithHalted` joins them). None where adapters wrap the
    # projections: every step input is projected.
    halted_key_value: tuple[torch.Tensor, ...] | None
    key_value_weight: torch.Tensor | None
    step_inputs: torch.Tensor | None  # [batch, length, hidden] step inputs of every position, where needed


def packed_layer_forward(layer: DenseModule, states: torch.Tensor, self_attention_bias: torch.Tensor | None,
                         nonpadding: torch.Tensor | None,
                         cross_key_value: tuple[torch.Tensor, torch.Tensor] | None,
                         cross_attention_bias: torch.Tensor | None, packed: PackedStep,
                         ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """`UniversalTransformerLayer.forward` on the running positions only: `states` are their step inputs,
    `[running, hidden]` in mask order, and so are the new states; only they are normalised, queried and transformed,
    while every position is read as key and value. Returns the new states and the self- and cross-attention weights
    over all positions (None where not computed)."""
    bias, layout = self_attention_bias, packed.layout
    if bias is not None and bias.shape[2] > 1:  # per-query rows (causal): the running queries' rows
        batch, length = packed.running.shape
        bias = bias.expand(batch, -1, -1, -1)[layout.row, 0, packed.running_index % length]
        bias = layout.pad(bias).unsqueeze(1)
    queries = layer.self_attn_layer_norm(states)
    if packed.halted_key_value is None or packed.key_value_weight is None:  # None together, but for the checker
        key, value = layer.self_attn.project_key_value(layer.self_attn_layer_norm(packed.step_inputs))
    else:
        key, value = layer.self_attn.split_heads(*KeysAndValuesWithHalted.apply(
            *packed.halted_key_value, packed.running, packed.running_index,
            F.linear(queries, packed.key_value_weight), layer.self_attn.k_proj.out_features))
    attention_output, self_weights = layer.self_attn(queries, key, value, bias, layout)
    hidden = states + layer.dropout(attention_output)
    cross_weights = None
    if cross_key_value is not None:
        attention_output, cross_weights = layer.cross_attn(layer.cross_attn_layer_norm(hidden), *cross_key_value,
                                                           cross_attention_bias, layout)
        hidden = hidden + layer.dropout(attention_output)
    self_weights, cross_weights = (
        None if weights is None
        else scatter_query_rows(weights, layout, packed.running_index, packed.running.shape[1])
        for weights in (self_weights, cross_weights))
    if layer.transition.position_wise:
        return hidden + layer.dropout(layer.transition(layer.transition_layer_norm(hidden))), self_weights, \
            cross_weights
    # a convolution reads neighbours: positions not transformed are read as their step input
    step_inputs = packed.step_inputs
    assert step_inputs is not None, "packed_act_steps keeps every step input for a convolution"
    every_position = step_inputs.flatten(0, 1).index_copy(0, packed.running_index, hidden)
    every_position = every_position.view_as(step_inputs)
    transformed = layer.transition(layer.transition_layer_norm(every_position), nonpadding)
    every_position = every_position + layer.dropout(transformed)
    return every_position.flatten(0, 1).index_select(0, packed.running_index), self_weights, cross_weights


def packed_act_steps(stack: DenseModule, act: Any, state: torch.Tensor, position: torch.Tensor, steps: torch.Tensor,
                 transform: Callable[..., torch.Tensor], record: Callable[[torch.Tensor], None],
                 record_states: bool) -> torch.Tensor:
    """`UniversalTransformerStack`'s ACT loop with "frozen" semantics (`act`: its `AdaptiveComputationTime`;
    `transform` and `record` as in its forward), each step computed for the running positions only (packed across
    the batch, `[running, hidden]`, kept with their flat indices into `batch * length`): their halting unit,
    layer and share of the output; halted positions are only read, as keys and values (`FrozenKeyValues`).
    Returns the mixed state."""
    layer = stack.layer
    batch, length, hidden = state.shape
    running = act.running
    frozen = FrozenKeyValues(layer.self_attn, layer.self_attn_layer_norm, steps[:act.max_steps], state)
    # every position's step input is built only where something reads it: a convolution's neighbours, adapters
    # on the key/value projections, the recorded hidden states
    keep_every_state = record_states or not layer.transition.position_wise or not frozen.usable
    running_index = flat_indices(running)
    every_running = len(running_index) == batch * length
    if frozen.usable and not every_running:
        halted_index = flat_indices(~running)
        frozen.freeze(halted_index, (state + position).flatten(0, 1).index_select(0, halted_index))
    states = state.flatten(0, 1).index_select(0, running_index)
    positions = position.index_select(0, running_index % length)
    # the running positions' share of the output, packed like their states; a position's is final when it
    # halts (its weight is 0 from then on) and moves to `mixed` (only ever written: in place, also for autograd)
    mixed = state.new_zeros(batch * length, hidden)
    mixing = torch.zeros_like(states)
    layout = None  # of the running queries, while they are the same
    step, going_on = 0, act.continues()
    while going_on:
        step_inputs = states + positions + steps[step]
        weights = act.update(stack.halting_probabilities(step_inputs), running_index)
        if every_running:  # in mask order, the packed states are the whole tensor: the dense layer, no layout
            states = transform(step_inputs.view_as(state)).flatten(0, 1)
        else:
            if layout is None:
                layout = QueryLayout.of(running, running_index)
            packed = PackedStep(running, running_index, layout, frozen(step), frozen.weight,
                                state + position + steps[step] if keep_every_state else None)
            states = transform(step_inputs, packed=packed)
        weights = weights.flatten().index_select(0, running_index).unsqueeze(-1).to(states.dtype)
        mixing = torch.lerp(mixing, states, weights)
        if keep_every_state:
            state = state.flatten(0, 1).index_copy(0, running_index, states).view_as(state)
            record(state)
        step += 1
        going_on = step < act.max_steps and act.continues()
        running = act.running
        still_running = running.flatten().index_select(0, running_index)
        if not bool(still_running.all()):
            # the packed rows of the positions that have just halted and of those that go on
            halted, kept = flat_indices(~still_running), flat_indices(still_running)
            halted_index = running_index.index_select(0, halted)
            mixed.index_copy_(0, halted_index, mixing.index_select(0, halted))
            if frozen.usable and going_on:  # read by the steps to come only
                frozen.freeze(halted_index, states.index_select(0, halted) + positions.index_select(0, halted))
            states, positions, mixing, running_index = (
                packed_rows.index_select(0, kept) for packed_rows in (states, positions, mixing, running_index))
            every_running, layout = False, None
    if len(mixing):  # positions that never halted
        mixed.index_copy_(0, running_index, mixing)
    return mixed.view_as(state)
