"""Optimus's two classes against the common model checks (`conformance.py`), and the regressions of issue #17 that
concern them."""

import pytest
import torch
from conformance import GenerationConformance, ModelConformance
from transformers import LlamaConfig, ModernBertConfig, RobertaConfig

from hf_ext import OptimusConfig, OptimusForSequenceClassification, OptimusModel
from hf_ext.models.optimus.samples import tiny_config

BATCH, ENCODER_LENGTH, DECODER_LENGTH = 2, 7, 6
DECODER_BASE_VOCAB = 30  # <PAD>, <BOS>, <EOS> follow
PAD, BOS, EOS = DECODER_BASE_VOCAB, DECODER_BASE_VOCAB + 1, DECODER_BASE_VOCAB + 2
NO_GRADIENT_CHECKPOINTING = ("the latent memory lives in the decoder's KV cache, which gradient checkpointing "
                             "turns off in training")


class OptimusTester(ModelConformance):
    not_applicable = {"test_gradient_checkpointing_gives_the_same_gradients": NO_GRADIENT_CHECKPOINTING}

    def config(self, **overrides):
        return tiny_config(50, DECODER_BASE_VOCAB, latent_size=8, hidden_size=16, num_layers=2, num_heads=2,
                           **overrides)

    def source(self, config):
        generator = torch.Generator().manual_seed(0)
        input_ids = torch.randint(1, config.encoder.vocab_size, (BATCH, ENCODER_LENGTH), generator=generator)
        attention_mask = torch.ones(BATCH, ENCODER_LENGTH, dtype=torch.long)
        attention_mask[1, -2:] = 0
        return {"input_ids": input_ids.masked_fill(attention_mask == 0, 0), "attention_mask": attention_mask}

    def encoder_shapes(self, config, kind, prefix):
        encoder = config.encoder
        if kind == "hidden_states":
            return {f"{prefix}hidden_states": [(BATCH, ENCODER_LENGTH, encoder.hidden_size)]
                    * (encoder.num_hidden_layers + 1)}
        return {f"{prefix}attentions": [(BATCH, encoder.num_attention_heads, ENCODER_LENGTH, ENCODER_LENGTH)]
                * encoder.num_hidden_layers}


class TestOptimusModel(OptimusTester, GenerationConformance):
    model_class = OptimusModel

    def inputs(self, config, labels=False):
        inputs = self.source(config)
        body = torch.randint(0, DECODER_BASE_VOCAB, (BATCH, DECODER_LENGTH - 2),
                             generator=torch.Generator().manual_seed(1))
        sentences = torch.cat([torch.full((BATCH, 1), BOS), body, torch.full((BATCH, 1), EOS)], dim=1)
        sentences[1, -2:] = torch.tensor([EOS, PAD])  # one shorter sentence
        inputs["labels" if labels else "decoder_input_ids"] = sentences
        return inputs

    def output_shapes(self, config, inputs, outputs, kind):
        decoder = config.decoder  # the common names, GPT-2's own through its attribute map
        shapes = self.encoder_shapes(config, kind, "encoder_")
        if kind == "hidden_states":
            shapes["hidden_states"] = [(BATCH, DECODER_LENGTH, decoder.hidden_size)] * (decoder.num_hidden_layers + 1)
        else:  # the keys start with the latent memory slot
            shapes["attentions"] = ([(BATCH, decoder.num_attention_heads, DECODER_LENGTH, DECODER_LENGTH + 1)]
                                    * decoder.num_hidden_layers)
        return shapes

    def generation_inputs(self, model):
        latent_z = torch.randn(BATCH, model.config.latent_size, generator=torch.Generator().manual_seed(2))
        return {"input_ids": torch.tensor([[BOS, 3], [BOS, 7]]), "latent_z": latent_z}

    def next_token_logits(self, model, generation_inputs, sequences):
        return model(decoder_input_ids=sequences, latent_z=generation_inputs["latent_z"]).logits[:, -1]


class TestOptimusModelOnModernBertAndLlama(TestOptimusModel):
    """The same checks on other backbones (issue #27): a ModernBERT encoder, which has no pooler (the posterior reads
    the first token's state), and a Llama decoder, with rotary positions and 4 query heads sharing 2 key/value heads
    (the memory holds one key per key/value head). It skips what the BERT + GPT-2 class skips, for the same
    reasons: gradient checkpointing (named in `not_applicable`, inherited) and the checks that word their own skip
    (no sequence classifier, no base-model submodule, no `inputs_embeds`)."""

    def config(self, **overrides):
        encoder = ModernBertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                   intermediate_size=32, global_attn_every_n_layers=1, local_attention=16,
                                   pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2)
        # biases on the attention projections (as Qwen2's): the load check drops a bias, and the rest is bias-free
        decoder = LlamaConfig(vocab_size=DECODER_BASE_VOCAB + 3, hidden_size=16, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, intermediate_size=32,
                              max_position_embeddings=64, attention_bias=True, pad_token_id=PAD, bos_token_id=BOS,
                              eos_token_id=EOS)
        return OptimusConfig(encoder=encoder, decoder=decoder, latent_size=8, encoder_pooling="cls", **overrides)


class TestOptimusForSequenceClassification(OptimusTester):
    model_class = OptimusForSequenceClassification

    def inputs(self, config, labels=False):
        inputs = self.source(config)
        if labels:
            inputs["labels"] = torch.tensor([0, 1])
        return inputs

    def output_shapes(self, config, inputs, outputs, kind):
        return self.encoder_shapes(config, kind, "")


# tiny encoders of three families for the classifier, the pooling each has and the no-split modules the classifier
# keeps: transformers' less the embedding module, which holds its input embeddings
# (`no_split_modules_outside_input_embeddings`)
CLASSIFIER_ENCODERS = {
    "bert": (TestOptimusForSequenceClassification().config().encoder, "pooler", {"BertLayer"}),
    "roberta": (RobertaConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                              intermediate_size=32, max_position_embeddings=40), "pooler", {"RobertaLayer"}),
    "modernbert": (TestOptimusModelOnModernBertAndLlama().config().encoder, "cls", {"ModernBertEncoderLayer"}),
}


class OptimusClassifierOnEncoder(TestOptimusForSequenceClassification):
    """The classifier's checks on another encoder (called by the test below, not collected)."""

    def __init__(self, encoder, pooling):
        self.encoder, self.pooling = encoder, pooling

    def config(self, **overrides):
        return OptimusConfig(encoder=self.encoder, decoder=super().config().decoder, latent_size=8,
                             encoder_pooling=self.pooling, **overrides)


@pytest.mark.parametrize("family", sorted(CLASSIFIER_ENCODERS))
def test_the_classifier_leaves_its_embedding_module_to_accelerates_fsdp2_plan(family):
    """The classifier's input embeddings are its encoder's: it does not split the encoder's layers and leaves the
    embedding module (a no-split module in transformers) to accelerate's FSDP2 plan, which gives the word embeddings
    a unit of their own; the plan then holds for each family (`test_accelerate_fsdp2_plan_at_world_size_8`)."""
    encoder, pooling, kept = CLASSIFIER_ENCODERS[family]
    tester = OptimusClassifierOnEncoder(encoder, pooling)
    model = tester.model()
    assert model._no_split_modules == kept
    assert set(model.encoder._no_split_modules) - kept == {type(model.encoder.embeddings).__name__}
    tester.test_accelerate_fsdp2_plan_at_world_size_8()


@pytest.mark.parametrize("family, dropout_name", [("bert", "hidden_dropout_prob"), ("roberta", "hidden_dropout_prob"),
                                                  ("modernbert", "classifier_dropout")])
def test_the_classifier_dropout_defaults_to_the_encoders_own(family, dropout_name):
    """Unset, the classifier's dropout is the one the encoder's family configures under its own name (ModernBERT
    has no `hidden_dropout_prob`); given, it wins."""
    encoder, pooling, _ = CLASSIFIER_ENCODERS[family]
    encoder = type(encoder).from_dict({**encoder.to_dict(), dropout_name: 0.37})
    tester = OptimusClassifierOnEncoder(encoder, pooling)
    assert tester.model().dropout.p == pytest.approx(0.37)
    assert tester.model(tester.config(classifier_dropout=0.2)).dropout.p == pytest.approx(0.2)


def test_the_vae_keeps_its_encoders_embedding_module_whole():
    """`OptimusModel`'s input embeddings are its decoder's, which GPT-2 keeps outside its no-split modules: the
    encoder's embedding module stays a no-split module."""
    assert TestOptimusModel().model()._no_split_modules == {"BertEmbeddings", "BertLayer", "GPT2Block"}


# ----- regressions of issue #17 -----

def test_return_dict_false_gives_a_tuple():
    """#17.2: `return_dict=False` no longer reaches GPT-2 and breaks `_decode`; the tuple starts with the loss."""
    tester = TestOptimusModel()
    model = tester.model()
    inputs = tester.inputs(model.config, labels=True)
    with torch.no_grad():
        as_tuple = model(**inputs, return_dict=False)
        as_dict = model(**inputs)
    assert isinstance(as_tuple, tuple)
    torch.testing.assert_close(as_tuple[0], as_dict.loss)


def test_the_classifier_can_replace_its_input_embeddings():
    """#17.4: `set_input_embeddings` exists beside `get_input_embeddings`."""
    model = TestOptimusForSequenceClassification().model()
    replacement = torch.nn.Embedding(50, 16)
    model.set_input_embeddings(replacement)
    assert model.get_input_embeddings() is replacement and model.encoder.embeddings.word_embeddings is replacement


def test_attentions_and_hidden_states_are_found_under_the_common_names():
    """#17.6 and #17.8: the decoder's hidden states and attention weights are `hidden_states` / `attentions` (what
    generate() and generic code read), the encoder's are `encoder_*`; the config's switches work too."""
    tester = TestOptimusModel()
    model = tester.model(tester.config(output_attentions=True, output_hidden_states=True),
                         attn_implementation="eager")
    with torch.no_grad():
        outputs = model(**tester.inputs(model.config))
    for name in ("hidden_states", "attentions", "encoder_hidden_states", "encoder_attentions"):
        assert outputs[name] is not None, name
    assert "decoder_hidden_states" not in outputs


def test_get_encoder_takes_a_modality():
    """#17.3: transformers' exporter calls `get_encoder(modality=...)`; a text model has no modal encoder."""
    model = TestOptimusModel().model()
    assert model.get_encoder() is model.encoder and model.get_decoder() is model.decoder
    assert model.get_encoder(modality="image") is model and model.get_encoder(modality="audio") is model
