"""ACT's "frozen" halted positions cost only what they must: their queries and transition are not computed, and
their keys and values come from `FrozenKeyValues` (their projected state, folded with each step's signal) instead
of being projected again, and only the running positions go through the halting unit and the layer, packed across
the batch. These tests run each model twice on the same inputs: as the package computes it, and with the loop over
every position at every step and a layer that computes them all and then keeps the old state of the halted positions,
which is the definition of the semantics. Outputs agree to float32 rounding, the number of updates of
every position exactly, gradients too."""

import pytest
import torch

from hf_ext import UniversalTransformerConfig, UniversalTransformerForSeq2SeqLM, UniversalTransformerModel
from hf_ext.lora import add_lora
from hf_ext.models.universal_transformer import modeling_universal_transformer as modeling
from hf_ext.models.universal_transformer import modeling_universal_transformer_packed as fast_path

pytestmark = pytest.mark.slow

ATOL = 2e-5


def dense_layer_forward(self, states, self_attention_bias=None, running=None, nonpadding=None, cross_key_value=None,
                        cross_attention_bias=None, passthrough=None, packed=None):
    """The frozen semantics, naively: every position projected, attended and transformed, then the halted ones
    put back (their step input as a convolution's neighbour, their old state as output)."""
    assert packed is None
    normed = self.self_attn_layer_norm(states)
    hidden = states + self.dropout(self.self_attn(normed, *self.self_attn.project_key_value(normed),
                                                  self_attention_bias)[0])
    if cross_key_value is not None:
        hidden = hidden + self.dropout(self.cross_attn(self.cross_attn_layer_norm(hidden), *cross_key_value,
                                                       cross_attention_bias)[0])
    if running is not None:
        hidden = torch.where(running.unsqueeze(-1), hidden, states)
    hidden = hidden + self.dropout(self.transition(self.transition_layer_norm(hidden), nonpadding))
    if running is not None:
        hidden = torch.where(running.unsqueeze(-1), hidden, states if passthrough is None else passthrough)
    return hidden, None, None


@pytest.fixture(autouse=True)
def seeded():
    """The same initial weights whatever ran before: how closely two summation orders agree depends on them."""
    torch.manual_seed(0)


def config(**overrides):
    values = dict(vocab_size=40, hidden_size=32, num_attention_heads=4, intermediate_size=48, act_max_steps=8,
                  hidden_dropout_prob=0.0, input_dropout=0.0, attention_dropout=0.0, relu_dropout=0.0,
                  label_smoothing=0.0, pad_token_id=0, decoder_start_token_id=1, eos_token_id=2)
    values.update(overrides)
    return UniversalTransformerConfig(**values)


def mixed_halting(model, seed=0):
    """Random weights everywhere the default initialisation leaves constants (norms, halting unit), so that
    positions halt at many different steps."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "layer_norm" in name or "halting" in name:
                scale = 1.5 if "halting" in name else 0.3
                parameter.add_(torch.randn(parameter.shape, generator=generator) * scale)
    return model


def inputs(batch=3, length=11, seed=1, padded=True):
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(3, 40, (batch, length), generator=generator)
    mask = torch.ones(batch, length, dtype=torch.long)
    if padded:
        for row, keep in enumerate(range(length, length - 2 * batch, -2)):
            mask[row, keep:] = 0
            input_ids[row, keep:] = 0
    return input_ids, mask


def both_ways(monkeypatch, run):
    """`run()` as the package computes it, then densely: the loop an exported graph takes (every position, every
    step) with the naive layer."""
    fast = run()
    with monkeypatch.context() as patch:
        patch.setattr(torch.compiler, "is_exporting", lambda: True)
        patch.setattr(modeling.UniversalTransformerLayer, "forward", dense_layer_forward)
        dense = run()
    return fast, dense


def assert_same_act(fast, dense):
    assert torch.equal(fast.n_updates, dense.n_updates)
    torch.testing.assert_close(fast.remainders, dense.remainders, atol=ATOL, rtol=0)
    torch.testing.assert_close(fast.last_hidden_state, dense.last_hidden_state, atol=ATOL, rtol=0)


@pytest.mark.parametrize("overrides", [
    {},
    {"transition": "sepconv", "step_signal": "sinusoid"},
    {"transition": "conv", "layer_norm_type": "unbiased_std", "step_signal": "none"},
    {"attention_key_depth": 48, "attention_value_depth": 16},
], ids=["fc-learned", "sepconv-sinusoid", "conv-unbiased-none", "other-depths"])
def test_encoder_outputs_and_updates_are_those_of_the_dense_computation(monkeypatch, overrides):
    model = mixed_halting(UniversalTransformerModel(config(**overrides))).eval()
    input_ids, mask = inputs()
    with torch.no_grad():
        fast, dense = both_ways(monkeypatch, lambda: model(input_ids=input_ids, attention_mask=mask))
    assert_same_act(fast, dense)
    steps = fast.n_updates[mask.bool()]
    assert steps.min() < steps.max() - 1, steps  # positions halted at different steps: the fast path ran
    torch.testing.assert_close(fast.ponder_cost, dense.ponder_cost, atol=ATOL, rtol=0)


def test_seq2seq_loss_logits_and_gradients_are_those_of_the_dense_computation(monkeypatch):
    model = mixed_halting(UniversalTransformerForSeq2SeqLM(config()))
    input_ids, mask = inputs()
    labels = inputs(length=9, seed=2, padded=False)[0]

    def run():
        model.zero_grad()
        output = model(input_ids=input_ids, attention_mask=mask, labels=labels)
        output.loss.backward()
        return output, {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}

    (fast, fast_grads), (dense, dense_grads) = both_ways(monkeypatch, run)
    torch.testing.assert_close(fast.logits, dense.logits, atol=ATOL, rtol=0)
    torch.testing.assert_close(fast.loss, dense.loss, atol=ATOL, rtol=0)
    for side in ("encoder", "decoder"):
        assert torch.equal(getattr(fast, f"{side}_n_updates"), getattr(dense, f"{side}_n_updates"))
    assert fast_grads.keys() == dense_grads.keys()
    for name, grad in fast_grads.items():
        torch.testing.assert_close(grad, dense_grads[name], atol=1e-4, rtol=1e-4, msg=name)


def test_seq2seq_trains_under_bfloat16_autocast_close_to_float32():
    """Trainer's `bf16=True` (`--dtype bfloat16`): autocast makes the projections bfloat16 while the states and the
    frozen terms stay float32; the hand-written backward of `KeysAndValuesWithHalted` takes both."""
    model = mixed_halting(UniversalTransformerForSeq2SeqLM(config()))
    input_ids, mask = inputs()
    labels = inputs(length=9, seed=2, padded=False)[0]

    def run(autocast):
        model.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            output = model(input_ids=input_ids, attention_mask=mask, labels=labels)
        output.loss.backward()
        return output.loss.item(), torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])

    (loss, grads), (half_loss, half_grads) = run(False), run(True)
    assert half_grads.dtype == torch.float32 and half_grads.isfinite().all()
    assert half_loss == pytest.approx(loss, rel=0.02)
    assert torch.nn.functional.cosine_similarity(half_grads, grads, dim=0) > 0.98


@pytest.mark.parametrize("layer_norm_type", ["layer_norm", "unbiased_std"])
def test_folded_keys_and_values_equal_the_projected_ones(layer_norm_type):
    model = mixed_halting(UniversalTransformerModel(config(layer_norm_type=layer_norm_type)))
    layer = model.encoder.layer
    generator = torch.Generator().manual_seed(3)
    states = torch.randn(2, 5, 32, generator=generator) * 2 + 0.5
    signals = torch.randn(3, 32, generator=generator)
    halted = torch.rand(2, 5, generator=generator) < 0.6
    frozen = fast_path.FrozenKeyValues(layer.self_attn, layer.self_attn_layer_norm, signals, states)
    frozen.freeze(fast_path.flat_indices(halted), states[halted])
    running_index = fast_path.flat_indices(~halted)
    for step in range(len(signals)):
        normed = layer.self_attn_layer_norm(states + signals[step])
        rows = torch.cat([layer.self_attn.k_proj(normed), layer.self_attn.v_proj(normed)], -1)[~halted]
        key, value = fast_path.KeysAndValuesWithHalted.apply(*frozen(step), ~halted, running_index, rows, 32)
        for computed, projection in ((key, layer.self_attn.k_proj), (value, layer.self_attn.v_proj)):
            torch.testing.assert_close(computed, projection(normed), atol=1e-5, rtol=0)


def test_gradients_of_keys_and_values_with_halted_positions():
    """The hand-written backward pass against numerical derivatives (float64), keys and values of different
    depths."""
    generator = torch.Generator().manual_seed(4)
    running = torch.rand(2, 5, generator=generator) < 0.4
    shapes = [(2, 5, 6), (2, 5, 1), (6,), (6,), (int(running.sum()), 6)]
    projected, scale, signal_term, bias, rows = (torch.randn(shape, generator=generator, dtype=torch.float64,
                                                             requires_grad=True) for shape in shapes)
    assert torch.autograd.gradcheck(
        lambda *tensors: fast_path.KeysAndValuesWithHalted.apply(*tensors[:4], running,
                                                                 fast_path.flat_indices(running), tensors[4], 2),
        (projected, scale, signal_term, bias, rows))


def test_adapters_on_the_projections_fall_back_to_projecting_every_position(monkeypatch):
    model = add_lora(mixed_halting(UniversalTransformerForSeq2SeqLM(config())), r=2)
    with torch.no_grad():  # nonzero adapters, so that ignoring them would show
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.5)
    layer = model.base_model.model.encoder.layer
    assert layer.self_attn.stacked_key_value_weight() is None
    input_ids, mask = inputs()
    labels = inputs(length=9, seed=2, padded=False)[0]
    with torch.no_grad():
        fast, dense = both_ways(monkeypatch, lambda: model(input_ids=input_ids, attention_mask=mask, labels=labels))
    torch.testing.assert_close(fast.logits, dense.logits, atol=ATOL, rtol=0)


@pytest.mark.parametrize("overrides", [
    {},
    {"transition": "conv", "step_signal": "sinusoid"},
    {"act_halted_state": "transformed"},
], ids=["frozen-fc", "frozen-conv", "transformed"])
def test_the_path_an_exported_graph_takes_gives_the_same_outputs(monkeypatch, overrides):
    """Under `torch.export` (ONNX export) the loop takes every step, dense, without its data-dependent exit."""
    model = mixed_halting(UniversalTransformerForSeq2SeqLM(config(**overrides))).eval()
    input_ids, mask = inputs()
    labels = torch.randint(3, 40, (3, 6), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        fast = model(input_ids=input_ids, attention_mask=mask, labels=labels)
        monkeypatch.setattr(torch.compiler, "is_exporting", lambda: True)
        exported = model(input_ids=input_ids, attention_mask=mask, labels=labels)
    for side in ("encoder", "decoder"):
        assert torch.equal(getattr(fast, f"{side}_n_updates"), getattr(exported, f"{side}_n_updates"))
        torch.testing.assert_close(getattr(fast, f"{side}_remainders"), getattr(exported, f"{side}_remainders"),
                                   atol=ATOL, rtol=0)
    torch.testing.assert_close(fast.logits, exported.logits, atol=ATOL, rtol=0)
    steps = fast.encoder_n_updates[mask.bool()]
    assert steps.min() < steps.max() - 1, steps  # positions halted at different steps: the halted were kept


def test_layer_compiled_with_inductor_gives_the_eager_outputs():
    """The shared layer compiled with inductor, the default backend, dense and packed steps alike, with the in-place
    writes of the running positions' keys and values (inductor's functionalization refuses such writes into two
    views of one tensor; the eager backend of the conformance tests, which compiles the whole loop, does not check
    that)."""
    model = mixed_halting(UniversalTransformerModel(config())).eval()
    input_ids, mask = inputs()
    torch._dynamo.reset()
    with torch.no_grad():
        eager = model(input_ids=input_ids, attention_mask=mask)
        model.encoder.layer.compile()
        compiled = model(input_ids=input_ids, attention_mask=mask)
    assert_same_act(compiled, eager)
    steps = eager.n_updates[mask.bool()]
    assert steps.min() < steps.max() - 1, steps
