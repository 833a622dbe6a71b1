"""What transformers' common tests (`tests/test_modeling_common.py`, `tests/test_configuration_common.py` and
`tests/generation/test_utils.py` in its sdist, which the wheel does not ship) expect of every model, checked here in
this repository's own words against the installed transformers, offline.

A model's test class mixes in `ModelConformance` (and `GenerationConformance` for generative models) and says how to
build a tiny config and inputs and what outputs to expect; one piece of code then serves every model class. A check
that does not apply to an architecture is named in `not_applicable` with the reason, which becomes the skip message.
"""

import copy
import inspect
import json

import pytest
import torch
from torch import nn
from transformers import AttentionInterface, PretrainedConfig, PreTrainedModel
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

ATOL = 1e-5
# transformers 5.24 renamed gradient checkpointing to activation checkpointing
CHECKPOINTING_ENABLE = ("activation_checkpointing_enable" if hasattr(PreTrainedModel, "activation_checkpointing_enable")
                        else "gradient_checkpointing_enable")


def tensors_of(value, path="output"):
    """`{path: tensor}` of every tensor in a (nested) `ModelOutput`, tuple or list."""
    if isinstance(value, torch.Tensor):
        return {path: value}
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, (tuple, list)):
        items = enumerate(value)
    else:
        return {}
    return {name: tensor for key, item in items for name, tensor in tensors_of(item, f"{path}.{key}").items()}


def assert_outputs_close(expected, actual, atol=ATOL):
    expected, actual = tensors_of(expected), tensors_of(actual)
    assert expected.keys() == actual.keys()
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], atol=atol, rtol=atol, msg=name)


def settings(config):
    """A config's values, without the bookkeeping that saving adds (transformers version, where it was read from, the
    remote-code `auto_map`)."""
    return {key: value for key, value in config.to_dict().items()
            if key not in ("transformers_version", "_name_or_path", "auto_map")}


def same_weights(model, model_class, **kwargs):
    """A second instance of `model_class` (default attention unless `attn_implementation` is given) with `model`'s
    weights, in eval mode."""
    other = model_class._from_config(copy.deepcopy(model.config), **kwargs)
    other.load_state_dict(model.state_dict())
    return other.eval()


class ModelConformance:
    """Checks for one model class. Subclasses set `model_class` and define `config`, `inputs` and `output_shapes`."""

    model_class = None
    # check name -> why it does not apply to this architecture (the skip message)
    not_applicable: dict = {}
    # config changes under which the model has a fixed computation graph (torch.export, torch.compile fullgraph);
    # a model tester that needs them shows what happens without them
    static_graph_overrides: dict = {}
    # config changes that turn dropout off, so that training runs compare
    no_dropout: dict = {}

    def config(self, **overrides) -> PretrainedConfig:
        raise NotImplementedError

    def inputs(self, config, labels=False) -> dict:
        raise NotImplementedError

    def output_shapes(self, config, inputs, outputs, kind) -> dict:
        """`{output field: [shape of each item]}` for `kind` "hidden_states" or "attentions"."""
        raise NotImplementedError

    def training_objective(self, outputs) -> torch.Tensor:
        """The scalar a training step differentiates: the loss, for models that have one."""
        return outputs.loss

    @pytest.fixture(autouse=True)
    def skip_what_does_not_apply(self, request):
        reason = self.not_applicable.get(request.function.__name__)
        if reason:
            pytest.skip(reason)

    def model(self, config=None, seed=0, **kwargs):
        torch.manual_seed(seed)
        config = self.config() if config is None else config
        return self.model_class._from_config(config, **kwargs).eval()

    def run(self, model, inputs, **kwargs):
        with torch.no_grad():
            return model(**inputs, **kwargs)

    # ----- configuration (test_configuration_common.py) -----

    def test_config_round_trips(self, tmp_path):
        config = self.config()
        config_class = type(config)
        expected = settings(config)
        assert settings(config_class.from_dict(config.to_dict())) == expected
        assert json.loads(config.to_json_string())["model_type"] == config.model_type
        config.to_json_file(tmp_path / "config.json")
        assert settings(config_class.from_json_file(tmp_path / "config.json")) == expected
        config.save_pretrained(tmp_path / "saved")
        assert settings(config_class.from_pretrained(tmp_path / "saved")) == expected
        config.save_pretrained(tmp_path / "repo" / "sub")
        assert settings(config_class.from_pretrained(tmp_path / "repo", subfolder="sub")) == expected

    def test_config_defaults_and_common_arguments(self):
        config_class = type(self.config())
        config_class()  # every argument has a default
        common = dict(return_dict=False, output_hidden_states=True, output_attentions=True,
                      id2label={0: "no", 1: "yes", 2: "maybe"}, problem_type="single_label_classification")
        config = self.config(**common)
        for name, value in common.items():
            assert getattr(config, name) == value, name
        assert config.num_labels == 3
        config.num_labels = 5
        assert len(config.id2label) == len(config.label2id) == 5

    def test_config_common_properties(self):
        text_config = self.config().get_text_config()
        for name in ("vocab_size", "hidden_size", "num_attention_heads", "num_hidden_layers"):
            value = getattr(text_config, name)
            assert isinstance(value, int) and value > 0, name
            setattr(text_config, name, value + 1)  # settable, through attribute maps too
            assert getattr(text_config, name) == value + 1, name

    # ----- modeling (test_modeling_common.py) -----

    def test_save_load_round_trip(self, tmp_path):
        model = self.model()
        inputs = self.inputs(model.config, labels=True)
        model.save_pretrained(tmp_path)
        reloaded, info = self.model_class.from_pretrained(tmp_path, output_loading_info=True)
        assert {key: value for key, value in info.items() if value} == {}
        assert_outputs_close(self.run(model, inputs), self.run(reloaded.eval(), inputs))

    def test_missing_embeddings_are_reported_on_load(self, tmp_path):
        from safetensors.torch import load_file, save_file

        model = self.model()
        model.save_pretrained(tmp_path)
        state = load_file(tmp_path / "model.safetensors")
        # the stored embeddings (sources of tied weights among them) are real weights: none may go missing silently
        embedding = model.get_input_embeddings().weight
        names = {name for name, parameter in model.named_parameters() if parameter is embedding}
        names = (names | set(model.all_tied_weights_keys.values())) & set(state)
        assert names
        for name in names:
            reduced = {key: value for key, value in state.items() if key != name}
            save_file(reduced, tmp_path / "model.safetensors", metadata={"format": "pt"})
            _, info = self.model_class.from_pretrained(tmp_path, output_loading_info=True)
            assert name in info["missing_keys"], name

    def test_tied_weights_are_tied_and_declared(self, tmp_path):
        model = self.model()
        tied = model.all_tied_weights_keys
        for target, source in tied.items():
            assert model.get_parameter(target) is model.get_parameter(source), target
        model.save_pretrained(tmp_path)
        reloaded = self.model_class.from_pretrained(tmp_path)
        for target, source in tied.items():
            assert reloaded.get_parameter(target) is reloaded.get_parameter(source), target

    def test_return_dict_false_gives_the_same_values(self):
        model = self.model()
        inputs = self.inputs(model.config, labels=True)
        as_dict = self.run(model, inputs)
        as_tuple = self.run(model, inputs, return_dict=False)
        assert isinstance(as_tuple, tuple)
        assert_outputs_close(as_dict.to_tuple(), as_tuple, atol=0)
        model.config.return_dict = False
        assert_outputs_close(as_dict.to_tuple(), self.run(model, inputs), atol=0)

    def test_loss_comes_first(self):
        model = self.model()
        outputs = self.run(model, self.inputs(model.config, labels=True))
        assert next(iter(outputs.keys())) == "loss"
        assert outputs.loss.dim() == 0 and torch.isfinite(outputs.loss)

    @pytest.mark.parametrize("kind", ["hidden_states", "attentions"])
    def test_hidden_states_and_attentions_by_keyword_and_by_config(self, kind):
        model = self.model(attn_implementation="eager")  # SDPA computes no attention weights
        inputs = self.inputs(model.config)
        switch = f"output_{kind}"
        plain = self.run(model, inputs)
        by_keyword = self.run(model, inputs, **{switch: True})
        expected = self.output_shapes(model.config, inputs, by_keyword, kind)
        assert expected
        for field, shapes in expected.items():
            assert getattr(plain, field, None) is None, field
            assert [tuple(item.shape) for item in getattr(by_keyword, field)] == shapes, field
        setattr(model.config, switch, True)
        by_config = self.run(model, inputs)
        for field in expected:
            assert_outputs_close(getattr(by_keyword, field), getattr(by_config, field), atol=0)

    def test_eager_matches_sdpa(self):
        sdpa = self.model(attn_implementation="sdpa")
        eager = same_weights(sdpa, self.model_class, attn_implementation="eager")
        assert eager.config._attn_implementation == "eager" and sdpa.config._attn_implementation == "sdpa"
        inputs = self.inputs(sdpa.config, labels=True)
        assert_outputs_close(self.run(eager, inputs), self.run(sdpa, inputs))

    def test_a_registered_attention_function_is_used(self):
        calls = []

        def counting_sdpa(*args, **kwargs):
            calls.append(1)
            return ALL_ATTENTION_FUNCTIONS["sdpa"](*args, **kwargs)

        AttentionInterface.register("hf_ext_counting", counting_sdpa)
        # models that build their masks with transformers' masking utilities need the mask format named too
        AttentionMaskInterface.register("hf_ext_counting", sdpa_mask)
        model = self.model(attn_implementation="hf_ext_counting")
        assert type(model)._supports_attention_backend
        eager = same_weights(model, self.model_class, attn_implementation="eager")
        inputs = self.inputs(model.config)
        assert_outputs_close(self.run(eager, inputs), self.run(model, inputs))
        assert calls

    def test_embedding_accessors(self):
        model = self.model()
        embeddings = model.get_input_embeddings()
        assert isinstance(embeddings, nn.Embedding)
        replacement = nn.Embedding(*embeddings.weight.shape)
        model.set_input_embeddings(replacement)
        assert model.get_input_embeddings() is replacement
        # transformers' exporter asks for modal encoders; a text model has none
        for modality in ("image", "audio"):
            assert model.get_encoder(modality=modality) is model
        assert isinstance(model.get_encoder(), nn.Module)

    def test_resize_token_embeddings_then_save_and_load(self, tmp_path):
        model = self.model()
        vocab_size = model.get_input_embeddings().weight.shape[0]
        model.resize_token_embeddings(vocab_size + 4)
        assert model.get_input_embeddings().weight.shape[0] == vocab_size + 4
        # the config records the size the embeddings are rebuilt with
        rebuilt = self.model_class._from_config(copy.deepcopy(model.config))
        assert rebuilt.get_input_embeddings().weight.shape[0] == vocab_size + 4
        output_embeddings = model.get_output_embeddings()
        if output_embeddings is not None:
            assert output_embeddings.weight.shape[0] == vocab_size + 4
        inputs = self.inputs(model.config, labels=True)
        before = self.run(model, inputs)
        model.save_pretrained(tmp_path)
        reloaded, info = self.model_class.from_pretrained(tmp_path, output_loading_info=True)
        assert {key: value for key, value in info.items() if value} == {}
        assert_outputs_close(before, self.run(reloaded.eval(), inputs))
        model.resize_token_embeddings(vocab_size - 2)
        assert model.get_input_embeddings().weight.shape[0] == vocab_size - 2

    def test_training_step_reaches_the_weights(self):
        model = self.model().train()
        self.training_objective(model(**self.inputs(model.config, labels=True))).backward()
        with_grad = [name for name, parameter in model.named_parameters() if parameter.grad is not None]
        assert with_grad and all(torch.isfinite(model.get_parameter(name).grad).all() for name in with_grad)

    def test_gradient_checkpointing_gives_the_same_gradients(self):
        if not self.model_class.supports_gradient_checkpointing:
            with pytest.raises(ValueError):
                getattr(self.model(), CHECKPOINTING_ENABLE)()
            pytest.skip(f"{self.model_class.__name__} declares no gradient checkpointing support")
        gradients = []
        for checkpointing in (False, True):
            model = self.model(self.config(**self.no_dropout)).train()
            if checkpointing:
                getattr(model, CHECKPOINTING_ENABLE)()
                assert any(getattr(module, "gradient_checkpointing", False) for module in model.modules())
            self.training_objective(model(**self.inputs(model.config, labels=True))).backward()
            gradients.append({name: parameter.grad for name, parameter in model.named_parameters()
                              if parameter.grad is not None})
        assert gradients[0].keys() == gradients[1].keys()
        assert_outputs_close(gradients[0], gradients[1])

    def test_torch_export(self):
        model = self.model(self.config(**self.static_graph_overrides))
        inputs = self.inputs(model.config)
        if "use_cache" in inspect.signature(model.forward).parameters:
            inputs["use_cache"] = False  # a cache object is no graph output (transformers' own export tests alike)
        exported = torch.export.export(model, args=(), kwargs=inputs, strict=False)
        assert_outputs_close(self.run(model, inputs), self.run(exported.module(), inputs))

    def test_torch_compile(self):
        model = self.model(self.config(**self.static_graph_overrides))
        inputs = self.inputs(model.config)
        torch._dynamo.reset()
        compiled = torch.compile(model, backend="eager", fullgraph=True)  # tracing is the check; no code generation
        assert_outputs_close(self.run(model, inputs), self.run(compiled, inputs))


class GenerationConformance:
    """Generation checks (generation/test_utils.py) for a model whose tester defines `generation_inputs` and
    `next_token_logits`."""

    max_new_tokens = 4

    def generation_inputs(self, model) -> dict:
        raise NotImplementedError

    def next_token_logits(self, model, generation_inputs, sequences) -> torch.Tensor:
        """The model's logits for the token after `sequences`, computed without generate()."""
        raise NotImplementedError

    def generate(self, model, rows=None, **kwargs):
        """generate() on the tester's inputs (their first `rows` rows when given)."""
        # no early end: every row runs max_new_tokens steps, so that outputs line up
        settings = dict(max_new_tokens=self.max_new_tokens, min_new_tokens=self.max_new_tokens, do_sample=False)
        settings.update(kwargs)
        inputs = {name: value[:rows] for name, value in self.generation_inputs(model).items()}
        with torch.no_grad():
            return model.generate(**inputs, **settings)

    def test_greedy_search_matches_an_argmax_loop(self):
        model = self.model()
        generated = self.generate(model, return_dict_in_generate=True, output_scores=True, output_logits=True)
        gen_inputs = self.generation_inputs(model)
        prompt_length = generated.sequences.shape[1] - self.max_new_tokens
        sequences = generated.sequences[:, :prompt_length]
        eos = model.generation_config.eos_token_id
        for step in range(self.max_new_tokens):
            with torch.no_grad():
                logits = self.next_token_logits(model, gen_inputs, sequences)
            torch.testing.assert_close(generated.logits[step], logits, atol=ATOL, rtol=ATOL)
            if eos is not None:  # min_new_tokens holds EOS back
                logits[:, eos] = -torch.inf
            sequences = torch.cat([sequences, logits.argmax(-1, keepdim=True)], dim=1)
        torch.testing.assert_close(generated.sequences, sequences)
        assert len(generated.scores) == self.max_new_tokens

    def test_sampling_is_reproducible_and_top_k_1_is_greedy(self):
        model = self.model()
        greedy = self.generate(model)
        torch.manual_seed(0)
        first = self.generate(model, do_sample=True, top_k=0, temperature=1.5)
        torch.manual_seed(0)
        torch.testing.assert_close(first, self.generate(model, do_sample=True, top_k=0, temperature=1.5))
        torch.testing.assert_close(greedy, self.generate(model, do_sample=True, top_k=1))

    def test_beam_search_returns_scores_and_sequences(self):
        model = self.model()
        batch = self.generate(model).shape[0]
        beams = self.generate(model, num_beams=3, num_return_sequences=2, return_dict_in_generate=True,
                              output_scores=True)
        assert beams.sequences.shape[0] == 2 * batch
        assert beams.sequences_scores.shape == (2 * batch,)
        assert len(beams.scores) == self.max_new_tokens
        assert beams.beam_indices.shape[0] == 2 * batch
        # one beam is greedy search
        torch.testing.assert_close(self.generate(model, num_beams=1), self.generate(model))

    def test_generate_dict_outputs_have_one_entry_per_step(self):
        model = self.model(attn_implementation="eager")
        generated = self.generate(model, return_dict_in_generate=True, output_scores=True, output_logits=True,
                                  output_hidden_states=True, output_attentions=True)
        batch = generated.sequences.shape[0]
        vocab_size = model.config.get_text_config(decoder=True).vocab_size
        for name in ("scores", "logits"):
            steps = getattr(generated, name)
            assert len(steps) == self.max_new_tokens and all(s.shape == (batch, vocab_size) for s in steps), name
        decoder_fields = ("decoder_hidden_states", "decoder_attentions") if model.config.is_encoder_decoder \
            else ("hidden_states", "attentions")
        for name in decoder_fields:
            steps = getattr(generated, name)
            assert len(steps) == self.max_new_tokens and all(len(step) > 0 for step in steps), name

    def test_cache_gives_the_outputs_of_recomputation(self):
        model = self.model()
        with_cache = self.generate(model, use_cache=True, return_dict_in_generate=True, output_logits=True)
        without = self.generate(model, use_cache=False, return_dict_in_generate=True, output_logits=True)
        torch.testing.assert_close(with_cache.sequences, without.sequences)
        assert_outputs_close(with_cache.logits, without.logits)

    def test_assisted_decoding_gives_greedy_output(self):
        model = self.model()
        assistant = self.model(seed=1)
        # transformers' assisted decoding takes one row at a time
        torch.testing.assert_close(self.generate(model, rows=1, assistant_model=assistant),
                                   self.generate(model, rows=1))

    def test_prompt_lookup_decoding_gives_greedy_output(self):
        model = self.model()
        torch.testing.assert_close(self.generate(model, rows=1, prompt_lookup_num_tokens=2),
                                   self.generate(model, rows=1))
