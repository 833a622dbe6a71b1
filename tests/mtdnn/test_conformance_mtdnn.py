"""MT-DNN's two classes against the common model checks (`conformance.py`), and the regression of issue #17 that
concerns them."""

import pytest
import torch
from conformance import ModelConformance
from transformers import BertConfig

from hf_ext.models.mtdnn import MTDNNConfig, MTDNNForSequenceClassification, MTDNNModel

pytestmark = pytest.mark.usefixtures("one_thread")

BATCH, LENGTH = 2, 9
TASKS = [
    {"name": "nli", "type": "classification", "num_labels": 3, "head": "san", "san": {"num_turns": 2}},
    {"name": "sts", "type": "regression", "num_labels": 1},
]


class MTDNNTester(ModelConformance):
    no_dropout = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}

    def config(self, **overrides):
        encoder_overrides = {name: overrides.pop(name) for name in list(overrides) if name in self.no_dropout}
        encoder = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                             intermediate_size=24, max_position_embeddings=40, **encoder_overrides)
        tasks = [{**task, "dropout": 0.0} if encoder_overrides else task for task in TASKS]
        return MTDNNConfig(encoder=encoder, tasks=tasks, **{"default_task": "nli", **overrides})

    def inputs(self, config, labels=False):
        """`[CLS] premise [SEP] hypothesis [SEP]` pairs, the second row shorter and right-padded."""
        input_ids = torch.randint(5, 50, (BATCH, LENGTH), generator=torch.Generator().manual_seed(0))
        token_type_ids = torch.tensor([[0, 0, 0, 0, 0, 1, 1, 1, 1], [0, 0, 0, 0, 1, 1, 1, 0, 0]])
        attention_mask = torch.tensor([[1] * 9, [1] * 7 + [0] * 2])
        inputs = {"input_ids": input_ids * attention_mask, "token_type_ids": token_type_ids,
                  "attention_mask": attention_mask}
        if labels:
            inputs["labels"] = torch.tensor([2, 0]) if config.default_task == "nli" else torch.tensor([0.5, -1.0])
        return inputs

    def output_shapes(self, config, inputs, outputs, kind):
        encoder = config.encoder
        if kind == "hidden_states":
            return {"hidden_states": [(BATCH, LENGTH, encoder.hidden_size)] * (encoder.num_hidden_layers + 1)}
        return {"attentions": [(BATCH, encoder.num_attention_heads, LENGTH, LENGTH)] * encoder.num_hidden_layers}

    def test_the_san_check_is_eager_only(self):
        """A row without a premise or hypothesis token is refused in eager mode; compiled and exported graphs (the
        common tests above, whose default task is the SAN one) cannot hold that check on the data."""
        model = self.model()
        inputs = self.inputs(model.config)
        inputs["token_type_ids"] = torch.zeros_like(inputs["token_type_ids"])  # no hypothesis
        with pytest.raises(ValueError, match="no premise or no hypothesis token"):
            model(**inputs)


class TestMTDNNModel(MTDNNTester):
    model_class = MTDNNModel

    def test_task_chosen_per_call(self):
        model = self.model()
        with torch.no_grad():
            assert model(**self.inputs(model.config), task="sts").logits.shape == (BATCH, 1)


class TestMTDNNForSequenceClassification(MTDNNTester):
    model_class = MTDNNForSequenceClassification


# ----- regression of issue #17 -----

def test_resized_vocabulary_survives_save_and_load(tmp_path):
    """#17.1: `resize_token_embeddings` records the new size in the encoder's config, which the encoder is rebuilt
    from, so the saved model loads."""
    model = TestMTDNNModel().model()
    model.resize_token_embeddings(57)
    assert model.config.encoder.vocab_size == 57 and model.config.get_text_config() is model.config.encoder
    model.save_pretrained(tmp_path)
    reloaded = MTDNNModel.from_pretrained(tmp_path)
    assert reloaded.get_input_embeddings().weight.shape == (57, 16)
