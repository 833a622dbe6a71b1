"""ERNIE 2.0's pre-training model against the common model checks (`conformance.py`)."""

import pytest
import torch
from conformance import ModelConformance, accelerate_fsdp2_prepare, fake_process_group
from safetensors.torch import load_file
from transformers import ErnieForMaskedLM

from hf_ext import Ernie2ForPreTraining, Ernie2PreTrainingConfig

BATCH, LENGTH = 2, 8


class TestErnie2ForPreTraining(ModelConformance):
    model_class = Ernie2ForPreTraining
    no_dropout = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}

    def config(self, **overrides):
        values = dict(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=24,
                      max_position_embeddings=40, max_reorder_segments=3)
        return Ernie2PreTrainingConfig(**{**values, **overrides})

    def inputs(self, config, labels=False):
        generator = torch.Generator().manual_seed(0)
        attention_mask = torch.tensor([[1] * LENGTH, [1] * (LENGTH - 3) + [0] * 3])
        inputs = {"input_ids": torch.randint(5, config.vocab_size, (BATCH, LENGTH), generator=generator)
                  * attention_mask,
                  "attention_mask": attention_mask,
                  "token_type_ids": torch.zeros(BATCH, LENGTH, dtype=torch.long),
                  # a knowledge-masking row and a sentence-distance row
                  "task_type_ids": torch.tensor([[config.task_ids["knowledge_masking"]] * LENGTH,
                                                 [config.task_ids["sentence_distance"]] * LENGTH])}
        if labels:
            masked = torch.full((BATCH, LENGTH), -100)
            masked[0, [1, 4]] = torch.tensor([7, 9])
            inputs["knowledge_masking_labels"] = masked
            inputs["sentence_distance_labels"] = torch.tensor([-100, 2])
        return inputs

    def output_shapes(self, config, inputs, outputs, kind):
        if kind == "hidden_states":
            return {"hidden_states": [(BATCH, LENGTH, config.hidden_size)] * (config.num_hidden_layers + 1)}
        return {"attentions": [(BATCH, config.num_attention_heads, LENGTH, LENGTH)] * config.num_hidden_layers}


def test_the_mlm_bias_is_the_decoders_alone_and_saved_under_transformers_name(tmp_path):
    """The MLM decoder's bias belongs to the decoder only (accelerate's FSDP2 plan puts the decoder in the word
    embeddings' unit), and is saved as transformers' ERNIE saves it, `cls.predictions.bias`: `from_pretrained`, a
    state dict loaded as saved (Trainer's resume) and transformers' `ErnieForMaskedLM` read it back."""
    model = TestErnie2ForPreTraining().model()
    bias = model.cls.predictions.decoder.bias
    assert [name for name, parameter in model.named_parameters(remove_duplicate=False) if parameter is bias] == [
        "cls.predictions.decoder.bias"]
    with torch.no_grad():
        bias.normal_()
    model.save_pretrained(tmp_path)
    stored = load_file(tmp_path / "model.safetensors")
    assert "cls.predictions.decoder.bias" not in stored and torch.equal(stored["cls.predictions.bias"], bias)
    fresh = TestErnie2ForPreTraining().model(seed=1)
    assert not fresh.load_state_dict(stored, strict=False).unexpected_keys
    for loaded in (Ernie2ForPreTraining.from_pretrained(tmp_path), fresh):
        assert torch.equal(loaded.cls.predictions.decoder.bias, bias)
    assert torch.equal(ErnieForMaskedLM.from_pretrained(tmp_path).cls.predictions.decoder.bias, bias)


def test_transformers_ernie_mlm_fails_accelerates_fsdp2_plan():
    """What docs/scale.md says of transformers' own `ErnieForMaskedLM` (BERT's alike): its MLM head holds the decoder's
    bias as its own `bias` too, and accelerate's FSDP2 plan puts the decoder in the word embeddings' unit, the head in
    the model's, which FSDP2 refuses on the first forward. This test fails when transformers or accelerate change
    that, and the page with it."""
    tester = TestErnie2ForPreTraining()
    model = ErnieForMaskedLM(tester.config())
    assert model.cls.predictions.bias is model.cls.predictions.decoder.bias
    with fake_process_group():
        model = accelerate_fsdp2_prepare(model)
        with pytest.raises(ValueError, match="shared with a parameter already managed by another FSDP group"):
            model(input_ids=tester.inputs(model.config)["input_ids"])
