"""UniversalTransformer models: ACT and fixed depth against a plain re-statement of tensor2tensor's loop (many
configurations), the cost of halted positions, padding, the ponder-cost gradient, seq2seq generation, saving."""

import math
import shutil
from pathlib import Path

import pytest
import torch
from torch.nn import functional as F
from torch.overrides import TorchFunctionMode
from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM, AutoModelForSequenceClassification
from universal_transformer_reference import encoder as reference_encoder
from universal_transformer_reference import model_weights, sinusoid

from hf_ext import (
    UniversalTransformerConfig,
    UniversalTransformerForSeq2SeqLM,
    UniversalTransformerForSequenceClassification,
    UniversalTransformerModel,
)


def tiny_config(**overrides):
    values = dict(vocab_size=30, hidden_size=16, num_attention_heads=2, intermediate_size=24, num_steps=3,
                  act_max_steps=6, hidden_dropout_prob=0.0, input_dropout=0.0, attention_dropout=0.0,
                  relu_dropout=0.0, label_smoothing=0.0)
    values.update(overrides)
    return UniversalTransformerConfig(**values)


def build(model_class, config, halting=(0.1, 0.0)):
    """A seeded model whose layer norms and halting unit (weights `halting[0]` x N(0, 1), bias `halting[1]`) are
    moved off their initial values, so that positions halt at different steps."""
    torch.manual_seed(0)
    model = model_class(config)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator)
            if "layer_norm" in name:
                parameter.add_(0.2 * noise)
            elif name.endswith("halting.weight"):
                parameter.copy_(halting[0] * noise)
            elif name.endswith("halting.bias"):
                parameter.fill_(halting[1])
    return model.eval()


def step_table(model):
    config = model.config
    if config.step_signal == "learned":
        return model.encoder.step_embeddings.detach() * math.sqrt(config.hidden_size)
    if config.step_signal == "sinusoid":
        return sinusoid(config.num_step_signals, config.hidden_size)
    return torch.zeros(config.num_step_signals, config.hidden_size)


def run_reference(model, inputs, attention_mask=None):
    config = model.config
    return reference_encoder(
        inputs, model_weights(model), heads=config.num_attention_heads, kind=config.transition,
        unbiased_std=config.layer_norm_type == "unbiased_std", eps=config.layer_norm_eps,
        steps_signal=step_table(model), use_act=config.use_act, threshold=config.act_threshold,
        max_steps=config.act_max_steps if config.use_act else config.num_steps, halted=config.act_halted_state,
        attention_mask=attention_mask)


def random_inputs(batch=3, length=7, hidden=16, seed=1):
    return torch.randn(batch, length, hidden, generator=torch.Generator().manual_seed(seed))


def right_padding_mask(lengths, length):
    return (torch.arange(length)[None] < torch.tensor(lengths)[:, None]).long()


# name: (config values, halting unit (weight scale, bias) that makes positions halt at different steps)
CONFIGURATIONS = {
    "t2t-fc-transformed": (dict(act_halted_state="transformed"), (0.3, 0.0)),
    "kv-depths-masked": (dict(attention_key_depth=8, attention_value_depth=24, num_attention_heads=4,
                              act_threshold=0.6, act_max_steps=4), (0.3, 0.0)),
    "conv-reimplementation-transformed-masked": (
        dict(transition="conv", layer_norm_type="unbiased_std", step_signal="sinusoid", project_embeddings=True,
             final_layer_norm=False, attention_key_depth=12, attention_value_depth=8, act_threshold=0.9,
             act_max_steps=5, act_halted_state="transformed"), (0.1, -2.0)),
    "sepconv-no-step-signal-masked": (dict(transition="sepconv", step_signal="none", act_threshold=0.8,
                                           act_max_steps=4), (0.3, 0.0)),
    "conv-sinusoid": (dict(transition="conv", step_signal="sinusoid", act_max_steps=8), (0.1, -2.0)),
    "fc-long": (dict(act_threshold=0.999, act_max_steps=10), (0.05, -2.0)),
}


@pytest.mark.parametrize("name", CONFIGURATIONS)
def test_act_matches_the_reference_loop(name):
    values, halting = CONFIGURATIONS[name]
    model = build(UniversalTransformerModel, tiny_config(**values), halting)
    inputs = random_inputs()
    mask = right_padding_mask([7, 5, 3], 7) if "masked" in name else None
    with torch.no_grad():
        output = model(inputs_embeds=inputs, attention_mask=mask)
    expected, n_updates, remainders = run_reference(model, inputs, mask)
    assert torch.equal(output.n_updates, n_updates)
    real = n_updates if mask is None else n_updates[mask.bool()]
    assert len(real.unique()) >= 3, "the configuration should make positions halt at different steps"
    torch.testing.assert_close(output.remainders, remainders, atol=1e-6, rtol=0)
    torch.testing.assert_close(output.last_hidden_state, expected, atol=1e-5, rtol=1e-5)
    counted = mask.float() if mask is not None else torch.ones_like(n_updates)
    torch.testing.assert_close(output.ponder_cost, ((n_updates + remainders) * counted).sum() / counted.sum())


@pytest.mark.parametrize("transition", ["fc", "conv"])
def test_fixed_depth_matches_the_reference(transition):
    model = build(UniversalTransformerModel, tiny_config(use_act=False, num_steps=4, transition=transition))
    inputs, mask = random_inputs(), right_padding_mask([7, 6, 2], 7)
    with torch.no_grad():
        output = model(inputs_embeds=inputs, attention_mask=mask)
    expected, _, _ = run_reference(model, inputs, mask)
    torch.testing.assert_close(output.last_hidden_state, expected, atol=1e-5, rtol=1e-5)
    assert output.n_updates is None and output.ponder_cost is None


def count_rows(module, counts, key):
    def hook(_, args):
        counts[key] = counts.get(key, 0) + args[0].numel() // args[0].shape[-1]
    return module.register_forward_pre_hook(hook)


class StackedProjectionRows(TorchFunctionMode):
    """Counts the rows `F.linear` projects with a weight that is none of `parameters`: the stacked key/value
    projection (`stacked_key_value_weight()`) the packed ACT loop applies to the running positions."""

    def __init__(self, parameters):
        super().__init__()
        self.parameters = {parameter.data_ptr() for parameter in parameters}
        self.rows = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is F.linear and args[1].data_ptr() not in self.parameters:
            self.rows += args[0].numel() // args[0].shape[-1]
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("halted_state", ["frozen", "transformed"])
def test_halted_positions_are_only_read(halted_state):
    model = build(UniversalTransformerModel, tiny_config(act_halted_state=halted_state, act_max_steps=8), (0.1, -2.0))
    layer = model.encoder.layer
    counts = {}
    hooks = [count_rows(layer.transition.fc1, counts, "transition"),
             count_rows(layer.self_attn.q_proj, counts, "query"), count_rows(layer.self_attn.k_proj, counts, "key"),
             count_rows(model.encoder.halting, counts, "halting"), count_rows(layer, counts, "layer")]
    calls = []
    hooks.append(layer.register_forward_pre_hook(lambda *_: calls.append(1)))
    inputs = random_inputs(batch=1, length=9)
    with torch.no_grad(), StackedProjectionRows(model.parameters()) as stacked:
        n_updates = model(inputs_embeds=inputs).n_updates
    for hook in hooks:
        hook.remove()
    steps = int(n_updates.max())
    assert len(calls) == steps  # the loop ends with the last position to halt
    rows = {name: counts[name] for name in ("layer", "halting", "query", "transition")}
    rows["key"] = counts["key"] + stacked.rows  # while every position runs, the layer's own projections
    if halted_state == "frozen":
        # the halting unit and the layer (queries, transition, the projection of keys and values) only for the
        # positions that take the step: the halted ones are still read as keys and values (FrozenKeyValues)
        assert set(rows.values()) == {int(n_updates.sum())} and int(n_updates.sum()) < steps * 9, rows
    else:
        assert set(rows.values()) == {steps * 9}, rows


@pytest.mark.parametrize("bias, steps", [(30.0, 1), (-30.0, 6)])
def test_loop_stops_when_every_position_has_halted(bias, steps):
    model = build(UniversalTransformerModel, tiny_config(act_max_steps=6))
    with torch.no_grad():
        model.encoder.halting.bias.fill_(bias)
    calls = []
    model.encoder.layer.register_forward_pre_hook(lambda *_: calls.append(1))
    with torch.no_grad():
        output = model(inputs_embeds=random_inputs())
    assert len(calls) == steps
    assert torch.all(output.n_updates == steps)
    # bias 30: every position halts at its first step with remainder 1; bias -30: none halts (no forced halt)
    assert torch.all(output.remainders == (1.0 if bias > 0 else 0.0))


@pytest.mark.parametrize("transition, halted_state", [("conv", "frozen"), ("sepconv", "transformed"),
                                                      ("fc", "frozen")])
def test_padding_does_not_change_the_real_positions(transition, halted_state):
    model = build(UniversalTransformerModel, tiny_config(transition=transition, act_halted_state=halted_state),
                  (0.1, -1.0))
    lengths = [7, 4, 2]
    inputs, mask = random_inputs(), right_padding_mask(lengths, 7)
    with torch.no_grad():
        padded = model(inputs_embeds=inputs, attention_mask=mask)
        for row, length in enumerate(lengths):
            alone = model(inputs_embeds=inputs[row:row + 1, :length])
            torch.testing.assert_close(padded.last_hidden_state[row, :length], alone.last_hidden_state[0],
                                       atol=1e-5, rtol=1e-5)
            assert torch.equal(padded.n_updates[row, :length], alone.n_updates[0])
    assert torch.all(padded.n_updates[mask == 0] == 0) and torch.all(padded.remainders[mask == 0] == 0)


def test_input_ids_are_scaled_embeddings_with_zero_padding():
    model = build(UniversalTransformerModel, tiny_config())
    ids = torch.tensor([[5, 7, 9, 0]])
    embeds = model.get_input_embeddings().weight[ids] * math.sqrt(16) * (ids != 0).unsqueeze(-1)
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).last_hidden_state,
                                   model(inputs_embeds=embeds).last_hidden_state)
    with pytest.raises(ValueError, match="exactly one of input_ids and inputs_embeds"):
        model(input_ids=ids, inputs_embeds=embeds)


def test_ponder_cost_reaches_the_halting_unit_with_its_gradient():
    config = tiny_config(num_labels=3, act_loss_weight=0.05, classifier_dropout=0.0)
    model = build(UniversalTransformerForSequenceClassification, config, (0.1, -1.0)).double()
    inputs, labels = random_inputs().double(), torch.tensor([0, 2, 1])
    output = model(inputs_embeds=inputs, labels=labels)
    cross_entropy = F.cross_entropy(output.logits, labels)
    torch.testing.assert_close(output.loss, cross_entropy + 0.05 * output.ponder_cost)
    bias = model.universal_transformer.encoder.halting.bias
    (grad_loss,) = torch.autograd.grad(output.loss, bias, retain_graph=True)
    (grad_ce,) = torch.autograd.grad(cross_entropy, bias, retain_graph=True)
    (grad_ponder,) = torch.autograd.grad(output.ponder_cost, bias)
    assert grad_ponder.abs().item() > 1e-3
    torch.testing.assert_close(grad_loss, grad_ce + 0.05 * grad_ponder)
    # the analytic gradient of the ponder cost matches a central difference (same halting pattern on both sides)
    epsilon, costs = 1e-6, []
    for sign in (1, -1):
        with torch.no_grad():
            bias.add_(sign * epsilon)
            shifted = model(inputs_embeds=inputs)
            bias.sub_(sign * epsilon)
        assert torch.equal(shifted.n_updates, output.n_updates)
        costs.append(shifted.ponder_cost)
    torch.testing.assert_close(grad_ponder, ((costs[0] - costs[1]) / (2 * epsilon)).reshape(1), rtol=1e-5, atol=1e-8)


@pytest.mark.slow
def test_training_on_the_ponder_cost_shortens_the_computation():
    model = build(UniversalTransformerForSequenceClassification, tiny_config(num_labels=2, act_loss_weight=1.0),
                  (0.1, -1.0)).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.03)
    inputs, labels = random_inputs(batch=8, seed=3), torch.randint(0, 2, (8,))
    costs = []
    for _ in range(15):
        output = model(inputs_embeds=inputs, labels=labels)
        optimizer.zero_grad()
        output.loss.backward()
        optimizer.step()
        costs.append(output.ponder_cost.item())
    assert costs[-1] < 0.8 * costs[0]


def seq2seq_model(**overrides):
    return build(UniversalTransformerForSeq2SeqLM, tiny_config(**overrides), (0.1, -1.0))


@pytest.mark.parametrize("transition, halted_state", [("sepconv", "frozen"), ("fc", "transformed")])
def test_decoder_is_causal(transition, halted_state):
    model = seq2seq_model(transition=transition, act_halted_state=halted_state)
    source = torch.randint(2, 30, (2, 6), generator=torch.Generator().manual_seed(4))
    target = torch.randint(2, 30, (2, 8), generator=torch.Generator().manual_seed(5))
    changed = target.clone()
    changed[:, 5:] = (changed[:, 5:] + 3) % 28 + 2
    with torch.no_grad():
        first = model(input_ids=source, decoder_input_ids=target)
        second = model(input_ids=source, decoder_input_ids=changed)
    torch.testing.assert_close(first.logits[:, :5], second.logits[:, :5])
    assert torch.equal(first.decoder_n_updates[:, :5], second.decoder_n_updates[:, :5])
    assert not torch.allclose(first.logits[:, 5:], second.logits[:, 5:])


def test_seq2seq_padding_and_loss():
    model = seq2seq_model(transition="conv")
    source = torch.randint(2, 30, (2, 6), generator=torch.Generator().manual_seed(6))
    labels = torch.randint(2, 30, (2, 5), generator=torch.Generator().manual_seed(7))
    source_mask = right_padding_mask([6, 4], 6)
    labels[1, 3:] = -100
    with torch.no_grad():
        padded = model(input_ids=source, attention_mask=source_mask, labels=labels)
        alone = model(input_ids=source[1:, :4], labels=labels[1:, :3])
    torch.testing.assert_close(padded.logits[1, :3], alone.logits[0], atol=1e-5, rtol=1e-5)
    assert torch.equal(padded.encoder_n_updates[1, :4], alone.encoder_n_updates[0])
    assert torch.all(padded.decoder_n_updates[1, 3:] == 0)
    expected = F.cross_entropy(padded.logits.reshape(-1, 30), labels.reshape(-1), ignore_index=-100)
    torch.testing.assert_close(padded.loss, expected + 0.01 * (padded.encoder_ponder_cost + padded.decoder_ponder_cost))


@pytest.mark.slow
def test_generate_equals_a_greedy_loop_over_the_whole_prefix():
    model = seq2seq_model()
    source = torch.randint(2, 30, (3, 6), generator=torch.Generator().manual_seed(8))
    mask = right_padding_mask([6, 3, 5], 6)
    with torch.no_grad():
        generated = model.generate(input_ids=source, attention_mask=mask, max_new_tokens=6, min_new_tokens=6,
                                   do_sample=False)
        tokens = torch.zeros(3, 1, dtype=torch.long)  # decoder_start_token_id
        for _ in range(6):
            logits = model(input_ids=source, attention_mask=mask, decoder_input_ids=tokens).logits[:, -1]
            logits[:, model.config.eos_token_id] = float("-inf")  # as min_new_tokens does
            tokens = torch.cat([tokens, logits.argmax(-1, keepdim=True)], dim=1)
        alone = model.generate(input_ids=source[1:2, :3], max_new_tokens=6, min_new_tokens=6, do_sample=False)
    assert torch.equal(generated, tokens)
    assert torch.equal(generated[1:2], alone)


def test_save_and_reload_through_the_auto_classes(tmp_path):
    model = seq2seq_model()
    assert model.lm_head.weight is model.embed_tokens.weight
    model.save_pretrained(tmp_path)
    reloaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path).eval()
    assert type(reloaded) is UniversalTransformerForSeq2SeqLM
    assert reloaded.lm_head.weight is reloaded.embed_tokens.weight
    source, labels = torch.tensor([[4, 5, 6]]), torch.tensor([[7, 8]])
    with torch.no_grad():
        before, after = model(input_ids=source, labels=labels), reloaded(input_ids=source, labels=labels)
        as_tuple = reloaded(input_ids=source, labels=labels, return_dict=False)
    # float rounding only: weights read from the file need not share the alignment (so the SIMD paths) of the originals
    torch.testing.assert_close(before.logits, after.logits, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(as_tuple[0], after.loss)
    config = AutoConfig.for_model("universal-transformer", vocab_size=30, hidden_size=16, num_attention_heads=2)
    assert type(AutoModel.from_config(config)) is UniversalTransformerModel
    assert type(AutoModelForSequenceClassification.from_config(config)) is UniversalTransformerForSequenceClassification


def test_defaults_follow_tensor2tensor_adaptive_base():
    config = UniversalTransformerConfig()
    assert (config.hidden_size, config.intermediate_size, config.num_attention_heads) == (1024, 4096, 16)
    assert (config.use_act, config.act_max_steps, config.act_threshold, config.act_loss_weight) == \
        (True, 12, 0.99, 0.01)
    assert (config.num_steps, config.hidden_dropout_prob, config.transition, config.step_signal) == \
        (6, 0.3, "fc", "learned")
    assert torch.all(UniversalTransformerModel(tiny_config()).encoder.halting.bias == 1.0)  # act_halting_bias_init


@pytest.mark.parametrize("overrides, field", [
    (dict(act_threshold=1.0), "act_threshold"), (dict(act_threshold=0.0), "act_threshold"),
    (dict(act_threshold=1.5), "act_threshold"), (dict(act_max_steps=0), "act_max_steps"),
    (dict(num_steps=0), "num_steps"), (dict(num_attention_heads=3), "attention_key_depth"),
    (dict(attention_value_depth=10, num_attention_heads=4), "attention_value_depth"),
    (dict(transition="lstm"), "transition"), (dict(step_signal="random"), "step_signal"),
    (dict(act_halted_state="copied"), "act_halted_state"), (dict(embedding_size=8), "embedding_size"),
    (dict(input_dropout=1.0), "input_dropout"), (dict(act_loss_weight=-1), "act_loss_weight"),
])
def test_bad_config_values_are_refused(overrides, field):
    with pytest.raises(ValueError, match=field):
        tiny_config(**overrides)


SAVED_BEFORE = Path(__file__).parent / "saved_before_shared_embedding"


@pytest.mark.parametrize("name, model_class, output", [
    ("seq2seq", UniversalTransformerForSeq2SeqLM, "logits"),
    ("classification", UniversalTransformerForSequenceClassification, "logits"),
    ("encoder", UniversalTransformerModel, "last_hidden_state")])
def test_folders_saved_before_the_embedding_moved_load_and_save_alike(tmp_path, name, model_class, output):
    """Folders written before the token embedding moved from the encoder stack to the model (`make_folders.py` at
    a4e7e56: `encoder.embed_tokens.weight`) load completely, with the outputs that code computed, and save again
    under the same names (transformers' checkpoint renaming, registered by the model)."""
    from safetensors.torch import load_file

    from hf_ext.models.universal_transformer.modeling_universal_transformer import UniversalTransformerEmbedding

    stored = load_file(SAVED_BEFORE / name / "model.safetensors")
    assert any(key.endswith("encoder.embed_tokens.weight") for key in stored)
    model, info = model_class.from_pretrained(SAVED_BEFORE / name, output_loading_info=True)
    assert not any(info.values()), info  # nothing missing, unexpected, mismatched or failing
    assert isinstance(model.get_input_embeddings(), UniversalTransformerEmbedding)
    inputs = {"input_ids": torch.tensor([[5, 9, 3, 17, 2], [8, 4, 11, 0, 0]]),
              "attention_mask": torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])}
    if name == "seq2seq":
        inputs["labels"] = torch.tensor([[6, 12, 7], [3, 3, 9]])
    expected = load_file(SAVED_BEFORE / "outputs.safetensors")
    with torch.no_grad():
        outputs = model.eval()(**inputs)
    torch.testing.assert_close(getattr(outputs, output), expected[f"{name}.{output}"], atol=1e-6, rtol=1e-6)
    if name == "seq2seq":
        assert model.lm_head.weight is model.embed_tokens.weight
        torch.testing.assert_close(outputs.loss, expected["seq2seq.loss"], atol=1e-6, rtol=1e-6)
    model.save_pretrained(tmp_path)
    resaved = load_file(tmp_path / "model.safetensors")
    assert resaved.keys() == stored.keys()
    assert all(torch.equal(resaved[key], stored[key]) for key in stored)


@pytest.mark.slow
@pytest.mark.parametrize("name, model_class", [
    ("seq2seq", UniversalTransformerForSeq2SeqLM), ("classification", UniversalTransformerForSequenceClassification),
    ("encoder", UniversalTransformerModel)])
def test_a_checkpoint_file_loads_raw_under_its_saved_names(name, model_class):
    """`load_state_dict` of a saved file as it is (how Trainer resumes from a checkpoint, bypassing transformers'
    renaming) takes the embedding from its saved name `encoder.embed_tokens.weight`."""
    from safetensors.torch import load_file

    stored = load_file(SAVED_BEFORE / name / "model.safetensors")
    model = model_class(UniversalTransformerConfig.from_pretrained(SAVED_BEFORE / name))
    result = model.load_state_dict(stored, strict=False)
    tied = {"lm_head.weight"} if name == "seq2seq" else set()  # saved once, as the embedding
    assert set(result.missing_keys) == tied and not result.unexpected_keys, result
    embedding = next(value for key, value in stored.items() if key.endswith("encoder.embed_tokens.weight"))
    torch.testing.assert_close(model.get_input_embeddings().weight, embedding, atol=0, rtol=0)


def test_a_folder_saved_before_the_embedding_moved_loads_with_the_current_code_as_remote_code(tmp_path):
    """The renaming of the older checkpoint name is registered by the model file itself, so that the current model
    code, copied into an older folder and run as remote code in a process without hf_ext, loads it as well."""
    import subprocess
    import sys
    import textwrap

    from safetensors.torch import load_file
    from transformers.dynamic_module_utils import custom_object_save

    folder = tmp_path / "seq2seq"
    shutil.copytree(SAVED_BEFORE / "seq2seq", folder)
    custom_object_save(UniversalTransformerForSeq2SeqLM(UniversalTransformerConfig.from_pretrained(folder)), folder)
    script = textwrap.dedent(f"""
        import sys, torch
        sys.modules["hf_ext"] = None  # hf_ext must not be needed
        from transformers import AutoModelForSeq2SeqLM
        model, info = AutoModelForSeq2SeqLM.from_pretrained({str(folder)!r}, trust_remote_code=True,
                                                            output_loading_info=True)
        assert type(model).__module__.startswith("transformers_modules."), type(model).__module__
        assert not any(info.values()), info
        inputs = {{"input_ids": torch.tensor([[5, 9, 3, 17, 2], [8, 4, 11, 0, 0]]),
                   "attention_mask": torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]),
                   "labels": torch.tensor([[6, 12, 7], [3, 3, 9]])}}
        with torch.no_grad():
            torch.save(model.eval()(**inputs).logits, {str(tmp_path / "logits.pt")!r})
        """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    torch.testing.assert_close(torch.load(tmp_path / "logits.pt"),
                               load_file(SAVED_BEFORE / "outputs.safetensors")["seq2seq.logits"], atol=1e-6, rtol=1e-6)
