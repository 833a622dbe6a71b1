"""What transformers' common tests (`tests/test_modeling_common.py`, `tests/test_configuration_common.py` and
`tests/generation/test_utils.py` in its sdist, which the wheel does not ship) expect of every model, checked here in
this repository's own words against the installed transformers, offline.

A model's test class mixes in `ModelConformance` (and `GenerationConformance` for generative models) and says how to
build a tiny config and inputs and what shape each output item has; one piece of code then serves every model class.
What follows from transformers' conventions is derived here from the config and the inputs, never restated by a
tester: how many hidden states and attention maps a model returns (from `num_hidden_layers`), which loss a problem type
takes, what a row alone gives, how weights are initialised and loaded. A check that does not apply is skipped: where
the check can see why (no sequence classifier, no `inputs_embeds`, no base model, no sub-configs, no decoding cache),
it decides and words the skip itself; otherwise the tester names it in `not_applicable` with the reason, which becomes
the skip message, and a test in the model's own file shows that the reason holds.
"""

import contextlib
import copy
import inspect
import json
import re
import warnings
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file
from torch import nn
from torch.nn import functional as F
from transformers import AttentionInterface, AutoModelForSequenceClassification, PretrainedConfig, PreTrainedModel
from transformers.core_model_loading import revert_weight_conversion
from transformers.generation import GenerateDecoderOnlyOutput
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

ATOL = 1e-5
# transformers 5.24 renamed gradient checkpointing to activation checkpointing
CHECKPOINTING_ENABLE = ("activation_checkpointing_enable" if hasattr(PreTrainedModel, "activation_checkpointing_enable")
                        else "gradient_checkpointing_enable")
# ... and the decoding cache `past_key_values` to `cache` (generate()'s keyword and output field)
CACHE_NAME = "cache" if "cache" in GenerateDecoderOnlyOutput.__dataclass_fields__ else "past_key_values"
PROBLEM_TYPES = ("single_label_classification", "multi_label_classification", "regression")
# the FSDP2 settings docs/scale.md gives `accelerate launch` (test_accelerate_fsdp2_plan_at_world_size_8)
DOCS_FSDP2_CONFIG = Path(__file__).resolve().parents[1] / "docs" / "launch" / "accelerate_fsdp2_gpu.yaml"
# the world of the FSDP2 plan checks, and the rank this process plays in it
FSDP2_WORLD, FSDP2_RANK = 8, 3


def docs_fsdp2_settings() -> dict:
    """The `fsdp_config` of the FSDP2 config docs/scale.md gives `accelerate launch`."""
    return yaml.safe_load(DOCS_FSDP2_CONFIG.read_text())["fsdp_config"]


@contextlib.contextmanager
def fake_process_group(world=FSDP2_WORLD, rank=FSDP2_RANK):
    """torch's fake process group for this one process as `rank` of `world`: collectives do nothing, so the other
    ranks' values are not there, shapes and placements are real."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    try:
        yield
    finally:
        dist.destroy_process_group()


def accelerate_fsdp2_prepare(model):
    """`model` sharded as `accelerate launch --config_file docs/launch/accelerate_fsdp2_gpu.yaml` shards it for
    `Trainer`: accelerate's own `fsdp2_prepare_model` with that config's FSDP settings (a unit per
    `_no_split_modules` module, the input embedding in a unit of its own or, tied to the output embedding, in one with
    it, the model last; the weights moved to the meta device, sharded there and loaded from the main process's copy),
    in float32 (the config's bf16 autocast is a GPU setting), in a process group already started. accelerate picks
    FSDP for accelerator devices only, so the plugin is handed to `fsdp2_prepare_model` directly rather than through
    an `Accelerator` on this CPU. Skips where accelerate has no FSDP2."""
    from types import SimpleNamespace

    from accelerate.utils import fsdp_utils  # accelerate is a dependency of transformers' Trainer, and ours

    if not hasattr(fsdp_utils, "fsdp2_prepare_model"):
        pytest.skip("this accelerate has no FSDP2 (accelerate >= 1.6)")
    from accelerate.utils import FullyShardedDataParallelPlugin

    settings = docs_fsdp2_settings()
    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=settings["fsdp_version"], auto_wrap_policy=settings["fsdp_auto_wrap_policy"],
        reshard_after_forward=settings["fsdp_reshard_after_forward"],
        state_dict_type=settings["fsdp_state_dict_type"],
        cpu_ram_efficient_loading=settings["fsdp_cpu_ram_efficient_loading"])
    # what fsdp2_prepare_model reads of an Accelerator; the main process holds the weights it loads from
    accelerator = SimpleNamespace(state=SimpleNamespace(fsdp_plugin=plugin), torch_device_mesh=None,
                                  mixed_precision="no", is_main_process=True, device=torch.device("cpu"))
    return fsdp_utils.fsdp2_prepare_model(accelerator, model)


def read_checkpoint(model, folder) -> dict[str, torch.Tensor]:
    """The tensors of `folder`/model.safetensors under `model`'s state-dict names: a model may store some under other
    names, which transformers renames on loading and back on saving (`register_checkpoint_conversion_mapping`)."""
    stored = load_file(Path(folder) / "model.safetensors")
    names = {name: next(iter(revert_weight_conversion(model, {name: tensor})))
             for name, tensor in model.state_dict().items()}
    return {name: stored[stored_name] for name, stored_name in names.items() if stored_name in stored}


def write_checkpoint(model, state: dict[str, torch.Tensor], folder) -> None:
    """Write `state` (under `model`'s state-dict names) as `folder`/model.safetensors, named as saving names it."""
    save_file(revert_weight_conversion(model, state), Path(folder) / "model.safetensors", metadata={"format": "pt"})


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


def rows_of(inputs, rows):
    """The inputs of the batch rows `rows` (a slice): every tensor whose first dimension is the batch's."""
    batch = next(value for value in inputs.values() if isinstance(value, torch.Tensor)).shape[0]
    return {name: value[rows] if isinstance(value, torch.Tensor) and value.dim() and value.shape[0] == batch
            else value for name, value in inputs.items()}


def layers_config(config, field):
    """The (sub-)config whose layers an output field comes from: `encoder_*` the encoder's, `decoder_*` and
    `cross_attentions` the decoder's, the others the generating side's (transformers' `get_text_config(decoder=True)`,
    the model itself for single-stack models)."""
    for side in ("encoder", "decoder"):
        if field.startswith(f"{side}_") or (side == "decoder" and field == "cross_attentions"):
            sub_config = getattr(config, side, None)
            return sub_config if isinstance(sub_config, PretrainedConfig) else config.get_text_config(**{side: True})
    return config.get_text_config(decoder=True)


def expected_count(config, field):
    """transformers' convention: `num_hidden_layers + 1` hidden states (the embeddings and every layer's output) and
    `num_hidden_layers` attention maps, whatever the input."""
    layers = layers_config(config, field).num_hidden_layers
    return layers + 1 if field.endswith("hidden_states") else layers


def is_sequence_classifier(model_class, config):
    """Whether `AutoModelForSequenceClassification` builds `model_class` for this config."""
    try:
        return AutoModelForSequenceClassification._model_mapping[type(config)] is model_class
    except KeyError:
        return False


def classification_labels(problem_type, num_labels, batch):
    """Labels as transformers' sequence classifiers take them: class ids, multi-hot floats, or float targets."""
    generator = torch.Generator().manual_seed(0)
    if problem_type == "single_label_classification":
        return torch.randint(num_labels, (batch,), generator=generator)
    if problem_type == "multi_label_classification":
        return torch.randint(2, (batch, num_labels), generator=generator).float()
    return torch.randn((batch,) if num_labels == 1 else (batch, num_labels), generator=generator)


def classification_loss(problem_type, logits, labels):
    """The loss transformers' `ForSequenceClassification` models take for a problem type, written out."""
    logits = logits.float()
    if problem_type == "single_label_classification":
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1))
    if problem_type == "multi_label_classification":
        return F.binary_cross_entropy_with_logits(logits, labels)
    return F.mse_loss(logits.squeeze(), labels.squeeze()) if logits.shape[-1] == 1 else F.mse_loss(logits, labels)


def init_scale_to_nothing(config):
    """A copy of `config` whose initialisation scales are (almost) zero, in it and its sub-configs: transformers'
    `_config_zero_init` (`*init_range`, `initializer_range`, `*_std`, `initializer_factor` set to 1e-10), and
    `initializer_gain`, a variance (the Universal Transformer's, t2t's `uniform_unit_scaling`), set to 1e-20."""
    config = copy.deepcopy(config)
    for key, value in list(vars(config).items()):
        if isinstance(value, PretrainedConfig):
            setattr(config, key, init_scale_to_nothing(value))
        elif "init_range" in key or "initializer_range" in key or "_std" in key \
                or "initializer_factor" in key:
            setattr(config, key, 1e-10)
        elif key == "initializer_gain":
            setattr(config, key, 1e-20)
    return config


def clear_initialised_flags(model):
    """Forget that `model`'s modules and weights were initialised (transformers' `_is_hf_initialized` flags), as if
    it had just been built on the meta device."""
    for item in (*model.modules(), *model.parameters(), *model.buffers()):
        if hasattr(item, "_is_hf_initialized"):
            item._is_hf_initialized = False


def register_counting_attention(name, calls):
    """Register an attention function `name` (and its mask format) that counts its calls in `calls` and runs SDPA."""

    def counting_sdpa(*args, **kwargs):
        calls.append(name)
        return ALL_ATTENTION_FUNCTIONS["sdpa"](*args, **kwargs)

    AttentionInterface.register(name, counting_sdpa)
    # models that build their masks with transformers' masking utilities need the mask format named too
    AttentionMaskInterface.register(name, sdpa_mask)


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
    # parameter name pattern -> why its initialisation does not scale with the config's initializer range (or gain)
    init_not_from_config: dict = {}

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

    def auxiliary_loss(self, outputs) -> torch.Tensor | float:
        """What a head's loss adds to its task's loss (the Universal Transformer's weighted ponder cost)."""
        return 0.0

    def classifier_config(self, problem_type) -> PretrainedConfig:
        """A sequence classifier's config for `problem_type` (one output for regression, three labels otherwise)."""
        return self.config(problem_type=problem_type, num_labels=1 if problem_type == "regression" else 3)

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

    @staticmethod
    def stored_embedding_names(model, state):
        """The names under which `state` (a saved checkpoint, `read_checkpoint`) holds the input embeddings and the
        sources of tied weights."""
        embedding = model.get_input_embeddings().weight
        names = {name for name, parameter in model.named_parameters(remove_duplicate=False) if parameter is embedding}
        return (names | set(model.all_tied_weights_keys.values())) & set(state)

    @pytest.mark.slow
    def test_missing_embeddings_are_reported_on_load(self, tmp_path):
        model = self.model()
        model.save_pretrained(tmp_path)
        state = read_checkpoint(model, tmp_path)
        # the stored embeddings (sources of tied weights among them) are real weights: none may go missing silently
        names = self.stored_embedding_names(model, state)
        assert names
        for name in names:
            write_checkpoint(model, {key: value for key, value in state.items() if key != name}, tmp_path)
            _, info = self.model_class.from_pretrained(tmp_path, output_loading_info=True)
            assert name in info["missing_keys"], name

    @pytest.mark.slow
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

    @pytest.mark.slow
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
            # how many: from the config alone (num_hidden_layers), whatever the tester or the input
            assert len(getattr(by_keyword, field)) == expected_count(model.config, field), field
            assert [tuple(item.shape) for item in getattr(by_keyword, field)] == shapes, field
        setattr(model.config, switch, True)
        by_config = self.run(model, inputs)
        for field in expected:
            assert_outputs_close(getattr(by_keyword, field), getattr(by_config, field), atol=0)

    @pytest.mark.slow
    def test_eager_matches_sdpa(self):
        sdpa = self.model(attn_implementation="sdpa")
        eager = same_weights(sdpa, self.model_class, attn_implementation="eager")
        assert eager.config._attn_implementation == "eager" and sdpa.config._attn_implementation == "sdpa"
        inputs = self.inputs(sdpa.config, labels=True)
        assert_outputs_close(self.run(eager, inputs), self.run(sdpa, inputs))

    @pytest.mark.slow
    def test_a_registered_attention_function_is_used(self):
        calls = []
        register_counting_attention("hf_ext_counting", calls)
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

    @pytest.mark.slow
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

    @pytest.mark.slow
    def test_training_step_reaches_the_weights(self):
        model = self.model().train()
        self.training_objective(model(**self.inputs(model.config, labels=True))).backward()
        with_grad = [name for name, parameter in model.named_parameters() if parameter.grad is not None]
        assert with_grad and all(torch.isfinite(model.get_parameter(name).grad).all() for name in with_grad)

    def check_fsdp2_plan(self, shard, values_kept=True):
        """Shards a fresh model with `shard(model)` over 8 ranks in this one process (torch's fake process group:
        collectives do nothing, so the other ranks' values are not there, shapes and placements are real) and checks
        that every `_no_split_modules` class names modules of the model and each of them is an FSDP unit, that the
        ties between parameters hold (a parameter two units hold is sharded twice, untied), that every parameter is a
        `Shard(0)` DTensor whose local piece is rank 3's share of dim 0 (its values too with `values_kept`: not
        where the values come through a collective, which the fake group leaves empty), and that a training step runs
        through the sharded model. Returns the sharded model."""
        from torch.distributed.fsdp import FSDPModule
        from torch.distributed.tensor import DTensor, Shard

        model = self.model().train()
        units = [module for module in model.modules() if type(module).__name__ in (model._no_split_modules or ())]
        assert {type(module).__name__ for module in units} == set(model._no_split_modules or ()), \
            f"_no_split_modules names classes the model lacks: {model._no_split_modules}"
        full = {name: parameter.detach().clone() for name, parameter in model.named_parameters(remove_duplicate=False)}
        tied = len(full) - len(dict(model.named_parameters()))
        with fake_process_group():
            model = shard(model)
            assert isinstance(model, FSDPModule) and all(isinstance(module, FSDPModule) for module in units)
            assert len(full) - len(dict(model.named_parameters())) == tied
            for name, parameter in model.named_parameters():
                rows = full[name].shape[0]
                share = -(-rows // FSDP2_WORLD)
                assert isinstance(parameter, DTensor) and parameter.placements == (Shard(0),), name
                local = parameter.to_local()
                assert local.shape[0] == max(0, min(share, rows - FSDP2_RANK * share)), name
                if values_kept:
                    start = FSDP2_RANK * share
                    torch.testing.assert_close(local, full[name][start:start + local.shape[0]], atol=0, rtol=0,
                                               msg=name)
            self.training_objective(model(**self.inputs(model.config, labels=True))).backward()
        return model

    def test_fsdp2_shards_each_no_split_module_at_world_size_8(self):
        """FSDP2 over 8 ranks: a unit per `_no_split_modules` module, then the model (`check_fsdp2_plan`)."""
        from torch.distributed.fsdp import fully_shard

        def shard(model):
            for module in [module for module in model.modules()
                           if type(module).__name__ in model._no_split_modules]:
                fully_shard(module)
            return fully_shard(model)

        self.check_fsdp2_plan(shard)

    def test_accelerate_fsdp2_plan_at_world_size_8(self):
        """The plan `accelerate launch --config_file docs/launch/accelerate_fsdp2_gpu.yaml` gives `Trainer`
        (`accelerate_fsdp2_prepare`), over 8 ranks (`check_fsdp2_plan`)."""
        # with cpu_ram_efficient_loading the shards arrive by a scatter from the main process
        model = self.check_fsdp2_plan(accelerate_fsdp2_prepare,
                                      values_kept=not docs_fsdp2_settings()["fsdp_cpu_ram_efficient_loading"])
        output_embeddings = model.get_output_embeddings()
        if output_embeddings is not None and model.config.tie_word_embeddings:
            assert output_embeddings.weight is model.get_input_embeddings().weight

    @pytest.mark.slow
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

    @pytest.mark.slow
    def test_torch_export(self):
        model = self.model(self.config(**self.static_graph_overrides))
        inputs = self.inputs(model.config)
        if "use_cache" in inspect.signature(model.forward).parameters:
            inputs["use_cache"] = False  # a cache object is no graph output (transformers' own export tests alike)
        exported = torch.export.export(model, args=(), kwargs=inputs, strict=False)
        assert_outputs_close(self.run(model, inputs), self.run(exported.module(), inputs))

    @pytest.mark.slow
    def test_torch_compile(self):
        model = self.model(self.config(**self.static_graph_overrides))
        inputs = self.inputs(model.config)
        torch._dynamo.reset()
        compiled = torch.compile(model, backend="eager", fullgraph=True)  # tracing is the check; no code generation
        assert_outputs_close(self.run(model, inputs), self.run(compiled, inputs))

    # ----- the loss of a sequence classifier by problem type (test_problem_types) -----

    def skip_unless_sequence_classifier(self):
        config = self.config()
        if not is_sequence_classifier(self.model_class, config):
            pytest.skip(f"AutoModelForSequenceClassification does not build {self.model_class.__name__} for "
                        f"{type(config).__name__}: problem types concern sequence classifiers")

    @pytest.mark.slow
    @pytest.mark.parametrize("problem_type", PROBLEM_TYPES)
    def test_loss_follows_the_problem_type(self, problem_type):
        self.skip_unless_sequence_classifier()
        model = self.model(self.classifier_config(problem_type))
        assert model.config.problem_type == problem_type
        inputs = self.inputs(model.config)
        batch = inputs[model.main_input_name].shape[0]
        labels = classification_labels(problem_type, model.config.num_labels, batch)
        with warnings.catch_warnings():
            # torch's symptom of regression labels broadcast against logits of another shape
            warnings.filterwarnings("error", message="Using a target size")
            outputs = model(**inputs, labels=labels)
        expected = classification_loss(problem_type, outputs.logits, labels) + self.auxiliary_loss(outputs)
        torch.testing.assert_close(outputs.loss, expected)
        outputs.loss.backward()
        assert all(torch.isfinite(parameter.grad).all() for parameter in model.parameters()
                   if parameter.grad is not None)

    @pytest.mark.slow
    @pytest.mark.parametrize("problem_type", PROBLEM_TYPES)
    def test_problem_type_is_inferred_when_unset(self, problem_type):
        """Unset, the problem type follows from `num_labels` and the labels' dtype (one output: regression; integer
        labels: single-label; float labels: multi-label) and is recorded in the config, as transformers does."""
        self.skip_unless_sequence_classifier()
        config = self.classifier_config(problem_type)
        config.problem_type = None
        model = self.model(config)
        if model.config.problem_type is not None:
            pytest.skip(f"{self.model_class.__name__} sets problem_type itself when built "
                        f"({model.config.problem_type!r})")
        inputs = self.inputs(model.config)
        labels = classification_labels(problem_type, model.config.num_labels, inputs[model.main_input_name].shape[0])
        outputs = self.run(model, inputs, labels=labels)
        assert model.config.problem_type == problem_type
        expected = classification_loss(problem_type, outputs.logits, labels) + self.auxiliary_loss(outputs)
        torch.testing.assert_close(outputs.loss, expected)

    # ----- batching (test_batching_equivalence) -----

    @pytest.mark.slow
    def test_a_row_alone_gives_its_row_of_the_batch(self):
        model = self.model()
        inputs = self.inputs(model.config)
        batched = self.run(model, inputs, output_hidden_states=True)
        batch = inputs[model.main_input_name].shape[0]
        assert batch > 1
        for row in range(batch):
            alone = tensors_of(self.run(model, rows_of(inputs, slice(row, row + 1)), output_hidden_states=True))
            together = tensors_of(batched)
            # the same outputs (as many hidden states) whatever the rest of the batch
            assert alone.keys() == together.keys(), row
            for name, tensor in together.items():
                if tensor.dim() and tensor.is_floating_point():  # scalars are batch means (losses, ponder cost)
                    torch.testing.assert_close(alone[name], tensor[row:row + 1], atol=ATOL, rtol=ATOL,
                                               msg=f"{name}, row {row}")

    # ----- loading (test_load_with_mismatched_shapes, test_correct_missing_keys, initialisation) -----

    @pytest.mark.slow
    def test_checkpoint_of_another_size_loads_only_when_mismatches_are_ignored(self, tmp_path):
        model = self.model()
        model.save_pretrained(tmp_path)
        state = read_checkpoint(model, tmp_path)
        # a checkpoint whose vocabulary has three more tokens than the config says
        grown = self.stored_embedding_names(model, state)
        assert grown
        # shifted, so that a weight initialised to a constant (a zero bias) cannot equal its stored value
        stored = {name: torch.cat([tensor, tensor[:3]]) + 1 if name in grown else tensor
                  for name, tensor in state.items()}
        write_checkpoint(model, stored, tmp_path)
        with pytest.raises((RuntimeError, ValueError), match="(?i)size|shape"):
            self.model_class.from_pretrained(tmp_path)
        reloaded, info = self.model_class.from_pretrained(tmp_path, ignore_mismatched_sizes=True,
                                                          output_loading_info=True)
        assert {entry[0] if isinstance(entry, tuple) else entry for entry in info["mismatched_keys"]} == grown
        assert not info["missing_keys"] and not info["unexpected_keys"]
        loaded = reloaded.state_dict()
        for name, tensor in state.items():
            if name in grown:  # the config's size, freshly initialised
                assert loaded[name].shape == tensor.shape, name
                assert not torch.equal(loaded[name], stored[name][:len(tensor)]), name
            else:
                assert torch.equal(loaded[name], tensor), name
        assert tensors_of(self.run(reloaded.eval(), self.inputs(reloaded.config)))

    @pytest.mark.slow
    def test_classifier_with_more_labels_loads_only_when_mismatches_are_ignored(self, tmp_path):
        self.skip_unless_sequence_classifier()
        model = self.model()
        model.save_pretrained(tmp_path)
        num_labels = model.config.num_labels + 2
        with pytest.raises((RuntimeError, ValueError), match="(?i)size|shape"):
            self.model_class.from_pretrained(tmp_path, num_labels=num_labels)
        reloaded, info = self.model_class.from_pretrained(tmp_path, num_labels=num_labels,
                                                          ignore_mismatched_sizes=True, output_loading_info=True)
        mismatched = {entry[0] if isinstance(entry, tuple) else entry for entry in info["mismatched_keys"]}
        assert mismatched and all(num_labels in reloaded.get_parameter(name).shape for name in mismatched)
        saved = model.state_dict()
        for name, tensor in reloaded.state_dict().items():
            if name not in mismatched:
                assert torch.equal(tensor, saved[name]), name
        assert self.run(reloaded.eval(), self.inputs(reloaded.config)).logits.shape[-1] == num_labels

    @pytest.mark.slow
    def test_init_weights_cover_every_weight(self):
        """`_init_weights` (through `initialize_weights`, what `from_pretrained` runs for weights a checkpoint lacks)
        writes every parameter: none keeps the NaN it is filled with."""
        model = self.model()
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.fill_(torch.nan)
        clear_initialised_flags(model)
        model.initialize_weights()
        left = [name for name, parameter in model.named_parameters() if torch.isnan(parameter).any()]
        assert not left, f"_init_weights leaves {left}"

    @pytest.mark.slow
    def test_init_follows_the_config_scale(self):
        """transformers' `test_initialization`: with the config's initializer range (or gain) near zero, every
        weight is near 0 or 1 (norm scales); the tester's exceptions are exactly the weights that are not."""
        torch.manual_seed(0)
        model = self.model_class._from_config(init_scale_to_nothing(self.config()))  # as built, not as a tester sets it
        off = {name for name, parameter in model.named_parameters()
               if ((parameter.mean() * 1e9).round() / 1e9).item() not in (0.0, 1.0)}
        excepted = {name for name, _ in model.named_parameters()
                    if any(re.search(pattern, name) for pattern in self.init_not_from_config)}
        assert off == excepted
        for pattern in self.init_not_from_config:  # each stated exception still holds
            assert any(re.search(pattern, name) for name in off), pattern

    @pytest.mark.slow
    def test_loaded_weights_are_not_initialised_again(self, tmp_path):
        """Weights read from a checkpoint carry transformers' `_is_hf_initialized` flag: initialising again (as
        `post_init` or a later `initialize_weights` does) keeps them, and only what the checkpoint lacks is new."""
        model = self.model()
        model.save_pretrained(tmp_path)
        state = read_checkpoint(model, tmp_path)
        # a bias whose module's weight is in the checkpoint: initialising the module must leave the weight alone
        dropped = next(name for name in sorted(state) if name.endswith(".bias") and f"{name[:-4]}weight" in state)
        write_checkpoint(model, {name: tensor for name, tensor in state.items() if name != dropped}, tmp_path)
        reloaded, info = self.model_class.from_pretrained(tmp_path, output_loading_info=True)
        assert dropped in info["missing_keys"]
        before = {name: tensor.clone() for name, tensor in reloaded.state_dict().items()}
        reloaded.initialize_weights()
        for name, tensor in reloaded.state_dict().items():
            assert torch.equal(tensor, before[name]), name
            if name in state and name != dropped:
                assert torch.equal(tensor, state[name]), name
        assert torch.isfinite(before[dropped]).all()

    @pytest.mark.slow
    def test_base_model_loads_into_the_head_and_back(self, tmp_path):
        """transformers' `base_model_prefix`: the base model's weights load into the model with its heads (the heads
        are missing, nothing else), and the head model's into the base model (the heads are unexpected)."""
        model = self.model()
        base, prefix = model.base_model, model.base_model_prefix
        if base is model:
            pytest.skip(f"{self.model_class.__name__} is its own base model (no `{prefix}` submodule)")
        head_only = {name for name in model.state_dict() if not name.startswith(f"{prefix}.")}
        tied = model.all_tied_weights_keys
        # a tied weight is loaded from its source when the checkpoint has it; a tie within the heads (BERT's decoder
        # bias to the prediction bias) is missing with its source. A checkpoint stores no tied copy.
        missing_heads = head_only - {target for target, source in tied.items() if source not in head_only}
        stored_heads = head_only - set(tied)
        assert stored_heads
        base.save_pretrained(tmp_path / "base")
        with_heads, info = self.model_class.from_pretrained(tmp_path / "base", config=model.config,
                                                            output_loading_info=True)
        assert set(info["missing_keys"]) == missing_heads and not info["unexpected_keys"]
        for name, tensor in base.state_dict().items():
            assert torch.equal(with_heads.base_model.state_dict()[name], tensor), name
        model.save_pretrained(tmp_path / "head")
        base_again, info = type(base).from_pretrained(tmp_path / "head", config=base.config, output_loading_info=True)
        # what a base model built alone has beyond the head model's (BERT's pooler where the heads read no pooler)
        own = set(type(base)._from_config(base.config).state_dict()) - set(base.state_dict())
        assert set(info["unexpected_keys"]) == stored_heads and set(info["missing_keys"]) == own
        for name, tensor in base.state_dict().items():
            assert torch.equal(base_again.state_dict()[name], tensor), name

    # ----- inputs (test_inputs_embeds_matches_input_ids) -----

    @pytest.mark.slow
    def test_inputs_embeds_give_the_outputs_of_input_ids(self):
        model = self.model()
        parameters = inspect.signature(model.forward).parameters
        if "inputs_embeds" not in parameters:
            pytest.skip(f"{self.model_class.__name__}.forward takes no inputs_embeds")
        inputs = self.inputs(model.config)
        embed = model.get_input_embeddings()
        # as transformers' test: no padding id, which some models read (masks and positions come from the inputs)
        pad = model.config.get_text_config().pad_token_id
        by_ids, by_embeds = dict(inputs), dict(inputs)
        for ids_name, embeds_name in (("input_ids", "inputs_embeds"), ("decoder_input_ids", "decoder_inputs_embeds")):
            if ids_name in inputs and embeds_name in parameters:
                ids = inputs[ids_name].masked_fill(inputs[ids_name] == pad, pad + 1) if pad is not None \
                    else inputs[ids_name]
                by_ids[ids_name] = ids
                del by_embeds[ids_name]
                by_embeds[embeds_name] = embed(ids)
        assert_outputs_close(self.run(model, by_ids), self.run(model, by_embeds))

    # ----- attention implementations of composite models (test_attn_implementation_composite_models) -----

    @pytest.mark.slow
    def test_attention_implementation_per_sub_model(self, tmp_path):
        config = self.config()
        sub_models = [key for key in config.sub_configs if getattr(config, key, None) is not None]
        if not sub_models:
            pytest.skip(f"{type(config).__name__} has no sub-configs: one attention implementation for the model")
        calls = []
        choice = {"": "eager"}
        for key in sub_models:  # a counting function of its own for every sub-model
            choice[key] = f"hf_ext_counting_{key}"
            register_counting_attention(choice[key], calls)
        model = self.model(config, attn_implementation=choice)
        for key in sub_models:
            assert getattr(model.config, key)._attn_implementation == choice[key], key
        inputs = self.inputs(model.config)
        eager = same_weights(model, self.model_class, attn_implementation="eager")
        assert_outputs_close(self.run(eager, inputs), self.run(model, inputs))
        # every sub-model this class builds (a module holding the sub-config, as transformers finds sub-models) runs
        # its own function, and nothing else runs one; a class may build only some of its config's sub-models (a
        # classifier on a composite config's encoder), whose functions then have nothing to count
        built = [key for key in sub_models
                 if any(getattr(module, "config", None) is getattr(model.config, key) for module in model.modules())]
        assert built
        assert set(calls) == {choice[key] for key in built}
        # and as a `from_pretrained` argument
        model.save_pretrained(tmp_path)
        mixed = {"": "eager", **{key: "sdpa" if index % 2 else "eager" for index, key in enumerate(sub_models)}}
        reloaded = self.model_class.from_pretrained(tmp_path, attn_implementation=mixed)
        for key in sub_models:
            assert getattr(reloaded.config, key)._attn_implementation == mixed[key], key

    # ----- parameter-efficient fine-tuning (test_peft_gradient_checkpointing_enable_disable) -----

    @pytest.mark.slow
    def test_peft_lora_with_gradient_checkpointing(self):
        """LoRA adapters on every linear layer (PEFT) train the same with and without gradient checkpointing, the
        base weights frozen."""
        from peft import LoraConfig, get_peft_model

        if not self.model_class.supports_gradient_checkpointing:
            pytest.skip(f"{self.model_class.__name__} declares no gradient checkpointing support")
        gradients = []
        for checkpointing in (False, True):
            model = self.model(self.config(**self.no_dropout)).train()
            if checkpointing:
                getattr(model, CHECKPOINTING_ENABLE)()
                model.enable_input_require_grads()  # frozen embeddings: checkpointed layers still need an input grad
            torch.manual_seed(1)  # random A and B, so that every adapter weight gets a gradient
            adapted = get_peft_model(model, LoraConfig(r=2, target_modules="all-linear", lora_dropout=0.0,
                                                       init_lora_weights=False))
            self.training_objective(adapted(**self.inputs(model.config, labels=True))).backward()
            gradients.append({name: parameter.grad for name, parameter in adapted.named_parameters()
                              if parameter.grad is not None})
            assert gradients[-1] and all("lora_" in name for name in gradients[-1])
        assert gradients[0].keys() == gradients[1].keys()
        assert_outputs_close(gradients[0], gradients[1])


class GenerationConformance:
    """Generation checks (generation/test_utils.py) for a model whose tester defines `generation_inputs` and
    `next_token_logits`.

    They run on a model trained for a few steps on the tester's labelled inputs (`generative_model`), so that greedy
    decoding emits different tokens (a tiny random model repeats one token, which would make assisted decoding, prompt
    lookup, beam search and sampling agree trivially); each comparison asserts that the tokens vary."""

    max_new_tokens = 4
    training_steps = 40
    trained: dict = {}  # (tester class, seed) -> trained model, shared by the checks of a test process

    def generation_inputs(self, model) -> dict:
        raise NotImplementedError

    def next_token_logits(self, model, generation_inputs, sequences) -> torch.Tensor:
        """The model's logits for the token after `sequences`, computed without generate()."""
        raise NotImplementedError

    def generative_model(self, seed=0):
        """A copy of the tester's model (seed `seed`) trained with Adam for `training_steps` steps on its labelled
        inputs, in eval mode."""
        key = (type(self), seed)
        if key not in self.trained:
            model = self.model(self.config(**self.no_dropout), seed=seed).train()
            inputs = self.inputs(model.config, labels=True)
            optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
            torch.manual_seed(seed)
            for _ in range(self.training_steps):
                self.training_objective(model(**inputs)).backward()
                optimizer.step()
                optimizer.zero_grad()
            self.trained[key] = model.eval()
        return copy.deepcopy(self.trained[key])

    def generate(self, model, rows=None, **kwargs):
        """generate() on the tester's inputs (their first `rows` rows when given, a slice for others)."""
        # no early end: every row runs max_new_tokens steps, so that outputs line up
        settings = dict(max_new_tokens=self.max_new_tokens, do_sample=False)
        settings.update(kwargs)
        settings.setdefault("min_new_tokens", settings["max_new_tokens"])
        inputs = self.generation_inputs(model)
        if rows is not None:
            inputs = rows_of(inputs, rows if isinstance(rows, slice) else slice(None, rows))
        with torch.no_grad():
            return model.generate(**inputs, **settings)

    def assert_tokens_vary(self, sequences):
        """Each row's new tokens are not one token repeated."""
        new_tokens = sequences[:, -self.max_new_tokens:]
        assert all(len(set(row.tolist())) > 1 for row in new_tokens), f"constant generations: {new_tokens.tolist()}"

    def decoding_cache(self, model):
        """The cache generate() keeps (None for a model that recomputes the prefix for every token)."""
        return self.generate(model, rows=1, max_new_tokens=1, use_cache=True, return_dict_in_generate=True).get(
            CACHE_NAME)

    def skip_without_cache(self, model, what):
        if self.decoding_cache(model) is None:
            pytest.skip(f"{type(model).__name__}.generate() keeps no decoding cache (it recomputes the prefix for "
                        f"every token); {what} needs one")

    def test_greedy_search_matches_an_argmax_loop(self):
        model = self.generative_model()
        generated = self.generate(model, return_dict_in_generate=True, output_scores=True, output_logits=True)
        self.assert_tokens_vary(generated.sequences)
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

    @pytest.mark.slow
    def test_sampling_draws_from_the_model_and_top_k_1_is_greedy(self):
        model = self.generative_model()
        greedy = self.generate(model)
        self.assert_tokens_vary(greedy)
        torch.manual_seed(0)
        first = self.generate(model, do_sample=True, top_k=3)
        torch.manual_seed(0)
        torch.testing.assert_close(first, self.generate(model, do_sample=True, top_k=3))  # reproducible
        torch.testing.assert_close(greedy, self.generate(model, do_sample=True, top_k=1))
        # every sampled token is one of the three most likely ones after its prefix (EOS held back by min_new_tokens)
        samples = [first]
        for seed in range(1, 6):
            torch.manual_seed(seed)
            samples.append(self.generate(model, do_sample=True, top_k=3, temperature=2.0))
        gen_inputs = self.generation_inputs(model)
        eos = model.generation_config.eos_token_id
        prompt_length = greedy.shape[1] - self.max_new_tokens
        for sample in samples:
            for position in range(prompt_length, sample.shape[1]):
                with torch.no_grad():
                    logits = self.next_token_logits(model, gen_inputs, sample[:, :position])
                if eos is not None:
                    logits[:, eos] = -torch.inf
                allowed = logits.topk(3, dim=-1).indices
                assert (allowed == sample[:, position, None]).any(-1).all(), (position, sample.tolist())
        assert any(not torch.equal(sample, greedy) for sample in samples), "sampling gave the greedy output"

    def reference_beam_search(self, model, prompt, num_beams, length_penalty):
        """Beam search written out, row by row: every beam's continuations scored by their summed log-probability
        (EOS held back, as `min_new_tokens` does), the best `num_beams` kept at each step; the final hypotheses
        scored by that sum over `new tokens ** length_penalty`, best first."""
        gen_inputs = self.generation_inputs(model)
        eos = model.generation_config.eos_token_id
        results, scores = [], []
        for row in range(prompt.shape[0]):
            beams, beam_scores = prompt[row:row + 1], torch.zeros(1)
            row_inputs = rows_of(gen_inputs, slice(row, row + 1))
            for _ in range(self.max_new_tokens):
                repeated = {name: value.repeat_interleave(len(beams), 0)
                            if isinstance(value, torch.Tensor) and value.dim() else value
                            for name, value in row_inputs.items()}
                with torch.no_grad():
                    log_probs = self.next_token_logits(model, repeated, beams).float().log_softmax(-1)
                if eos is not None:
                    log_probs[:, eos] = -torch.inf
                totals = (beam_scores[:, None] + log_probs).flatten()
                best = totals.topk(num_beams).indices
                vocab = log_probs.shape[-1]
                beams = torch.cat([beams[best // vocab], (best % vocab)[:, None]], dim=1)
                beam_scores = totals[best]
            results.append(beams)
            scores.append(beam_scores / self.max_new_tokens**length_penalty)
        return torch.cat(results), torch.cat(scores)

    @pytest.mark.slow
    def test_beam_search_matches_a_reference_beam_search(self):
        model = self.generative_model()
        greedy = self.generate(model)
        self.assert_tokens_vary(greedy)
        beams = self.generate(model, num_beams=3, num_return_sequences=3, length_penalty=0.7, early_stopping=True,
                              return_dict_in_generate=True, output_scores=True)
        batch = greedy.shape[0]
        assert beams.sequences.shape[0] == 3 * batch and len(beams.scores) == self.max_new_tokens
        assert beams.beam_indices.shape[0] == 3 * batch
        prompt = greedy[:, :greedy.shape[1] - self.max_new_tokens]
        sequences, scores = self.reference_beam_search(model, prompt, num_beams=3, length_penalty=0.7)
        torch.testing.assert_close(beams.sequences, sequences)
        torch.testing.assert_close(beams.sequences_scores, scores, atol=ATOL, rtol=ATOL)
        torch.testing.assert_close(self.generate(model, num_beams=1), greedy)  # one beam is greedy search

    @pytest.mark.slow
    def test_generate_dict_outputs_have_one_entry_per_step(self):
        model = self.generative_model()
        model.set_attn_implementation("eager")  # SDPA computes no attention weights
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
            assert len(steps) == self.max_new_tokens, name
            # every step returns every layer's outputs: as many as the decoder's num_hidden_layers say
            assert all(len(step) == expected_count(model.config, name) for step in steps), name

    def test_cache_gives_the_outputs_of_recomputation(self):
        model = self.generative_model()
        self.skip_without_cache(model, "comparing it with recomputation")
        with_cache = self.generate(model, use_cache=True, return_dict_in_generate=True, output_logits=True)
        without = self.generate(model, use_cache=False, return_dict_in_generate=True, output_logits=True)
        self.assert_tokens_vary(with_cache.sequences)
        torch.testing.assert_close(with_cache.sequences, without.sequences)
        assert_outputs_close(with_cache.logits, without.logits)

    @pytest.mark.slow
    def test_generation_continues_from_a_prefix_cache(self):
        """generate() handed the cache of an earlier call on a prefix (and that call's output as the prompt) goes on
        as one call would have (transformers' `test_generate_continue_from_past_key_values`)."""
        model = self.generative_model()
        self.skip_without_cache(model, "continuing from one")
        whole = self.generate(model)
        self.assert_tokens_vary(whole)
        half = self.max_new_tokens // 2
        first = self.generate(model, max_new_tokens=half, return_dict_in_generate=True)
        inputs = {**self.generation_inputs(model), "input_ids": first.sequences}
        if "attention_mask" in inputs:
            mask = inputs["attention_mask"]
            inputs["attention_mask"] = torch.cat([mask, mask.new_ones(mask.shape[0], half)], dim=1)
        with torch.no_grad():
            rest = model.generate(**inputs, **{CACHE_NAME: first[CACHE_NAME]}, do_sample=False,
                                  max_new_tokens=self.max_new_tokens - half, min_new_tokens=self.max_new_tokens - half)
        torch.testing.assert_close(rest, whole)

    @pytest.mark.slow
    def test_static_cache_gives_the_dynamic_cache_output(self):
        model = self.generative_model()
        self.skip_without_cache(model, "a static cache")
        dynamic = self.generate(model, return_dict_in_generate=True, output_logits=True)
        static = self.generate(model, cache_implementation="static", return_dict_in_generate=True, output_logits=True)
        self.assert_tokens_vary(dynamic.sequences)
        torch.testing.assert_close(static.sequences, dynamic.sequences)
        assert_outputs_close(dynamic.logits, static.logits)

    @pytest.mark.slow
    def test_left_padding_gives_the_unpadded_generation(self):
        """A left-padded prompt (its attention mask zero over the padding) generates the tokens and logits of the
        unpadded one (transformers' `test_left_padding_compatibility`)."""
        model = self.generative_model()
        if model.config.is_encoder_decoder:
            pytest.skip(f"{type(model).__name__} is an encoder-decoder: its prompt is the encoder's input, padded on "
                        "the right, and the decoder starts from its start token")
        plain = self.generate(model, return_dict_in_generate=True, output_logits=True)
        self.assert_tokens_vary(plain.sequences)
        inputs = self.generation_inputs(model)
        ids = inputs["input_ids"]
        mask = inputs.get("attention_mask", torch.ones_like(ids))
        pad = model.generation_config.pad_token_id
        pad = model.config.get_text_config(decoder=True).pad_token_id if pad is None else pad
        inputs["input_ids"] = torch.cat([ids.new_full((ids.shape[0], 3), pad), ids], dim=1)
        inputs["attention_mask"] = torch.cat([mask.new_zeros(mask.shape[0], 3), mask], dim=1)
        with torch.no_grad():
            padded = model.generate(**inputs, do_sample=False, max_new_tokens=self.max_new_tokens,
                                    min_new_tokens=self.max_new_tokens, return_dict_in_generate=True,
                                    output_logits=True)
        torch.testing.assert_close(padded.sequences[:, 3:], plain.sequences)
        assert_outputs_close(plain.logits, padded.logits)

    @pytest.mark.slow
    def test_assisted_decoding_gives_greedy_output(self):
        model = self.generative_model()
        self.skip_without_cache(model, "assisted decoding")
        assistant = self.generative_model(seed=1)  # trained alike from another start: it proposes other tokens
        for row in range(self.generate(model).shape[0]):  # transformers' assisted decoding takes one row at a time
            greedy = self.generate(model, rows=slice(row, row + 1))
            self.assert_tokens_vary(greedy)
            torch.testing.assert_close(self.generate(model, rows=slice(row, row + 1), assistant_model=assistant),
                                       greedy)

    @pytest.mark.slow
    def test_prompt_lookup_decoding_gives_greedy_output(self):
        model = self.generative_model()
        self.skip_without_cache(model, "prompt lookup decoding (assisted decoding)")
        for row in range(self.generate(model).shape[0]):
            greedy = self.generate(model, rows=slice(row, row + 1))
            self.assert_tokens_vary(greedy)
            torch.testing.assert_close(self.generate(model, rows=slice(row, row + 1), prompt_lookup_num_tokens=2),
                                       greedy)
