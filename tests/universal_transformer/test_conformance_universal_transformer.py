"""The Universal Transformer's three classes against the common model checks (`conformance.py`), and the regressions
of issue #17 that concern them."""

import pytest
import torch
from conformance import GenerationConformance, ModelConformance

from hf_ext import (
    UniversalTransformerConfig,
    UniversalTransformerForSeq2SeqLM,
    UniversalTransformerForSequenceClassification,
    UniversalTransformerModel,
)

BATCH, LENGTH, TARGET_LENGTH = 2, 7, 5


class UniversalTransformerTester(ModelConformance):
    # with ACT the loop's exit depends on the data: torch.export takes every step instead (test_act_exports), and
    # torch.compile breaks the graph at the exit's test, so that `fullgraph=True` needs fixed depth
    static_graph_overrides = {"use_act": False}
    no_dropout = dict(hidden_dropout_prob=0.0, input_dropout=0.0, attention_dropout=0.0, relu_dropout=0.0)

    def config(self, **overrides):
        # a halting bias of 0 lets positions halt after different numbers of steps
        values = dict(vocab_size=40, hidden_size=16, num_attention_heads=2, intermediate_size=24, num_steps=3,
                      act_max_steps=5, act_halting_bias_init=0.0, act_halted_state="frozen", label_smoothing=0.0,
                      num_labels=3)
        return UniversalTransformerConfig(**{**values, **overrides})

    def model(self, config=None, seed=0, **kwargs):
        model = super().model(config, seed, **kwargs)
        with torch.no_grad():  # a random halting unit, so that positions halt at different steps
            generator = torch.Generator().manual_seed(seed)
            for name, parameter in model.named_parameters():
                if name.endswith("halting.weight"):
                    parameter.copy_(0.5 * torch.randn(parameter.shape, generator=generator))
        return model

    def source(self, config):
        generator = torch.Generator().manual_seed(0)
        input_ids = torch.randint(2, config.vocab_size, (BATCH, LENGTH), generator=generator)
        attention_mask = torch.ones(BATCH, LENGTH, dtype=torch.long)
        attention_mask[1, -2:] = 0  # one padded row
        return {"input_ids": input_ids.masked_fill(attention_mask == 0, config.pad_token_id),
                "attention_mask": attention_mask}

    # t2t's initialisation, which the converted checkpoints' training started from
    init_not_from_config = {r"embed_tokens\.weight$": "t2t: token embeddings start N(0, 1/hidden_size), whatever "
                                                       "initializer_gain",
                            r"step_embeddings$": "t2t: learned step embeddings start N(0, 1/hidden_size), whatever "
                                                 "initializer_gain"}

    def auxiliary_loss(self, outputs):
        return self.config().act_loss_weight * outputs.ponder_cost

    def encoder_shapes(self, config, kind, prefix=""):
        # one item per step the loop can take (num_hidden_layers), however many the input needed
        if kind == "hidden_states":
            count, shape = config.num_hidden_layers + 1, (BATCH, LENGTH, config.hidden_size)
        else:
            count, shape = config.num_hidden_layers, (BATCH, config.num_attention_heads, LENGTH, LENGTH)
        return {f"{prefix}{kind}": [shape] * count}


class TestUniversalTransformerModel(UniversalTransformerTester):
    model_class = UniversalTransformerModel
    not_applicable = {"test_loss_comes_first": "the encoder has no loss (it returns the ponder cost)"}

    def inputs(self, config, labels=False):
        return self.source(config)

    def output_shapes(self, config, inputs, outputs, kind):
        return self.encoder_shapes(config, kind)

    def training_objective(self, outputs):
        # the encoder has no loss: its ponder cost (reaching the halting unit) and a function of its output
        return outputs.ponder_cost + outputs.last_hidden_state.pow(2).mean()

    @pytest.mark.slow
    def test_act_exports_and_compiles(self):
        """torch.export takes all `act_max_steps` steps with the halted positions kept (the loop's exit and the
        packing of running positions depend on the data), with the eager outputs; torch.compile runs the eager
        loop, breaking the graph at the exit's test."""
        model = self.model()
        inputs = self.inputs(model.config)
        exported = torch.export.export(model, args=(), kwargs=inputs, strict=False)
        expected = self.run(model, inputs)
        for name in ("last_hidden_state", "n_updates", "remainders"):
            torch.testing.assert_close(getattr(self.run(exported.module(), inputs), name), getattr(expected, name))
        torch._dynamo.reset()
        compiled = torch.compile(model, backend="eager")
        torch.testing.assert_close(self.run(compiled, inputs).last_hidden_state, expected.last_hidden_state)


class TestUniversalTransformerForSequenceClassification(UniversalTransformerTester):
    model_class = UniversalTransformerForSequenceClassification

    def inputs(self, config, labels=False):
        inputs = self.source(config)
        if labels:
            inputs["labels"] = torch.tensor([0, 2])
        return inputs

    def output_shapes(self, config, inputs, outputs, kind):
        return self.encoder_shapes(config, kind)

    def test_get_output_embeddings_is_none(self):
        assert self.model().get_output_embeddings() is None


class TestUniversalTransformerForSeq2SeqLM(UniversalTransformerTester, GenerationConformance):
    model_class = UniversalTransformerForSeq2SeqLM

    def inputs(self, config, labels=False):
        inputs = self.source(config)
        target = torch.randint(2, config.vocab_size, (BATCH, TARGET_LENGTH), generator=torch.Generator().manual_seed(1))
        if labels:
            inputs["labels"] = target
        else:
            inputs["decoder_input_ids"] = torch.cat(
                [torch.full((BATCH, 1), config.decoder_start_token_id), target[:, :-1]], dim=1)
        return inputs

    def output_shapes(self, config, inputs, outputs, kind):
        shapes = self.encoder_shapes(config, kind, prefix="encoder_")
        steps = config.num_hidden_layers
        if kind == "hidden_states":
            shapes["decoder_hidden_states"] = [(BATCH, TARGET_LENGTH, config.hidden_size)] * (steps + 1)
        else:
            heads = config.num_attention_heads
            shapes["decoder_attentions"] = [(BATCH, heads, TARGET_LENGTH, TARGET_LENGTH)] * steps
            shapes["cross_attentions"] = [(BATCH, heads, TARGET_LENGTH, LENGTH)] * steps
        return shapes

    def generation_inputs(self, model):
        return self.source(model.config)

    def next_token_logits(self, model, generation_inputs, sequences):
        return model(**generation_inputs, decoder_input_ids=sequences).logits[:, -1]

    def test_encoder_decoder_and_softmax_share_the_model_embeddings(self):
        model = self.model()
        shared = model.embed_tokens
        assert model.encoder.input_embeddings() is shared and model.decoder.input_embeddings() is shared
        assert model.lm_head.weight is shared.weight
        # the stacks (FSDP units) hold no copy of it
        assert not any("embed_tokens" in name for name, _ in model.named_parameters(remove_duplicate=False)
                       if not name.startswith("embed_tokens."))


# ----- regressions of issue #17 -----

def test_output_switches_are_read_from_the_config():
    """#17.5: `config.output_hidden_states` (not only the keyword) returns the per-step states."""
    config = UniversalTransformerTester().config(output_hidden_states=True)
    model = UniversalTransformerModel(config).eval()
    with torch.no_grad():
        outputs = model(input_ids=torch.tensor([[3, 4, 5]]))
    assert outputs.hidden_states is not None and len(outputs.hidden_states) == config.num_hidden_layers + 1


@pytest.mark.parametrize("halted_state", ["frozen", "transformed"])
def test_act_returns_num_hidden_layers_steps_however_early_the_loop_stops(halted_state):
    """#24.3: with ACT `num_hidden_layers` is `act_max_steps`, and the outputs hold one hidden state more and as many
    attention maps, also when every position halts early: the steps not taken repeat the last state (each halted
    position's own) and attend nowhere."""
    tester = TestUniversalTransformerForSeq2SeqLM()
    config = tester.config(act_halted_state=halted_state)
    assert config.num_hidden_layers == config.act_max_steps == 5
    model = tester.model(config, attn_implementation="eager")
    with torch.no_grad():
        model.encoder.halting.bias.fill_(30.0)  # every encoder position halts at its first step
        outputs = model(**tester.inputs(model.config), output_hidden_states=True, output_attentions=True)
    assert int(outputs.encoder_n_updates.max()) == 1
    states, attentions = outputs.encoder_hidden_states, outputs.encoder_attentions
    assert len(states) == 6 and len(attentions) == 5
    for step in range(2, 6):
        torch.testing.assert_close(states[step], states[1], atol=0, rtol=0)
        assert bool((attentions[step - 1] == 0).all())
    first = attentions[0].sum(-1)  # (batch, heads, length): 1 in the rows of the positions that took the step
    took_it = (outputs.encoder_n_updates > 0)[:, None].expand_as(first)
    torch.testing.assert_close(first[took_it], torch.ones_like(first[took_it]))
    assert len(outputs.decoder_hidden_states) == 6 and len(outputs.cross_attentions) == 5
    # a row alone has as many as the batch, whatever the other rows need
    with torch.no_grad():
        alone = model(**{name: value[:1] for name, value in tester.inputs(model.config).items()},
                      output_hidden_states=True)
    assert len(alone.encoder_hidden_states) == len(alone.decoder_hidden_states) == 6


def test_attention_weights_are_returned_and_frozen_rows_are_zero():
    """#17.6: `output_attentions` returns the weights of every step; a halted position's row is zero afterwards."""
    tester = TestUniversalTransformerModel()
    model = tester.model(attn_implementation="eager")
    with torch.no_grad():
        outputs = model(input_ids=torch.randint(2, 40, (1, 9), generator=torch.Generator().manual_seed(3)),
                        output_attentions=True)
    n_updates = outputs.n_updates[0]
    assert int(n_updates.min()) < int(n_updates.max()), "positions should halt at different steps"
    for step, weights in enumerate(outputs.attentions):
        rows = weights[0].sum(-1)  # (heads, positions)
        running = n_updates > step
        torch.testing.assert_close(rows[:, running], torch.ones_like(rows[:, running]))
        assert bool((rows[:, ~running] == 0).all())


@pytest.mark.slow
def test_seq2seq_exports_without_a_data_dependent_mask_check():
    """#17.3: a fixed-depth seq2seq model with an attention mask exports (the mask is no longer checked for
    `all()`), and the default `get_encoder(modality=...)` of transformers finds no modal encoder."""
    tester = TestUniversalTransformerForSeq2SeqLM()
    model = tester.model(tester.config(use_act=False))
    inputs = tester.inputs(model.config)
    exported = torch.export.export(model, args=(), kwargs=inputs, strict=False)
    with torch.no_grad():
        torch.testing.assert_close(exported.module()(**inputs).logits, model(**inputs).logits)
    assert model.get_encoder(modality="image") is model and model.get_encoder() is model.encoder


def test_a_missing_shared_embedding_is_reported(tmp_path):
    """#17.7: the embedding is the source of the tied weights; a checkpoint without it (stored under its older name
    `encoder.embed_tokens.weight`) is incomplete."""
    from safetensors.torch import load_file, save_file

    model = TestUniversalTransformerForSeq2SeqLM().model()
    model.save_pretrained(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    del state["encoder.embed_tokens.weight"]
    save_file(state, tmp_path / "model.safetensors", metadata={"format": "pt"})
    _, info = UniversalTransformerForSeq2SeqLM.from_pretrained(tmp_path, output_loading_info=True)
    assert "embed_tokens.weight" in info["missing_keys"]
