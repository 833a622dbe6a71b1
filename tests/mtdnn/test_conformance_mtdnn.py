"""MT-DNN's classes against the common model checks (`conformance.py`): the multi-task model, and one task of it as a
sequence classifier, a token classifier and a question-answering model; and the regression of issue #17 that
concerns them."""

import pytest
import torch
from conformance import ModelConformance, accelerate_fsdp2_prepare, fake_process_group
from torch.distributed.fsdp import FSDPModule
from transformers import BertConfig, BertForSequenceClassification, ModernBertConfig, RobertaConfig

from hf_ext.models.mtdnn import (
    MTDNNConfig,
    MTDNNForQuestionAnswering,
    MTDNNForSequenceClassification,
    MTDNNForTokenClassification,
    MTDNNModel,
)
from hf_ext.models.mtdnn.modeling_mtdnn import no_split_modules_outside_input_embeddings

BATCH, LENGTH = 2, 9
TASKS = [
    {"name": "nli", "type": "classification", "num_labels": 3, "head": "san", "san": {"num_turns": 2}},
    {"name": "sts", "type": "regression", "num_labels": 1},
    {"name": "ner", "type": "sequence_labeling", "num_labels": 3, "labels": ["O", "B-X", "I-X"]},
    {"name": "qa", "type": "span_classification", "num_labels": 2},
]


TASK_LABELS = {"nli": {"labels": torch.tensor([2, 0])}, "sts": {"labels": torch.tensor([0.5, -1.0])},
               "ner": {"labels": torch.tensor([[-100, 1, 2, 0, 0, 1, 2, 0, -100],
                                               [-100, 0, 1, 0, 0, 0, -100, -100, -100]])},
               "qa": {"start_positions": torch.tensor([5, 0]), "end_positions": torch.tensor([7, 0])}}

MORE_LABELS = ("MT-DNN's label counts are its tasks' (config.tasks[i]['num_labels']), not config.num_labels: "
               "test_the_number_of_labels_is_the_tasks shows it")


class MTDNNTester(ModelConformance):
    no_dropout = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
    init_not_from_config = {r"\.rnn\.": "the SAN head's GRU cell starts with torch's own initialisation, "
                                         "U(+-1/sqrt(hidden_size)), as in the original"}
    not_applicable = {"test_classifier_with_more_labels_loads_only_when_mismatches_are_ignored": MORE_LABELS}

    def classifier_config(self, problem_type):
        """The task of the problem type: the SAN classification task, the regression task, or a classification task
        with a linear head asked to be multi-label."""
        if problem_type == "regression":
            return self.config(default_task="sts")
        if problem_type == "single_label_classification":
            return self.config(default_task="nli")
        topics = {"name": "topics", "type": "classification", "num_labels": 3}
        return self.config(tasks=[*TASKS, topics], default_task="topics", problem_type=problem_type)

    def encoder(self, **overrides):
        return BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                          intermediate_size=24, max_position_embeddings=40, **overrides)

    def config(self, **overrides):
        encoder_overrides = {name: overrides.pop(name) for name in list(overrides) if name in self.no_dropout}
        encoder = self.encoder(**encoder_overrides)
        tasks = [{**task, "dropout": 0.0} if encoder_overrides else task for task in overrides.pop("tasks", TASKS)]
        return MTDNNConfig(encoder=encoder, tasks=tasks, **{"default_task": "nli", **overrides})

    def inputs(self, config, labels=False):
        """`[CLS] premise [SEP] hypothesis [SEP]` pairs, the second row shorter and right-padded."""
        input_ids = torch.randint(5, 50, (BATCH, LENGTH), generator=torch.Generator().manual_seed(0))
        token_type_ids = torch.tensor([[0, 0, 0, 0, 0, 1, 1, 1, 1], [0, 0, 0, 0, 1, 1, 1, 0, 0]])
        attention_mask = torch.tensor([[1] * 9, [1] * 7 + [0] * 2])
        inputs = {"input_ids": input_ids * attention_mask, "token_type_ids": token_type_ids,
                  "attention_mask": attention_mask}
        if labels:
            inputs.update(TASK_LABELS[config.default_task])
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

    @pytest.mark.slow
    def test_the_number_of_labels_is_the_tasks(self, tmp_path):
        """The reason for skipping the check of loading with more labels: num_labels does not size the heads."""
        model = self.model()
        model.save_pretrained(tmp_path)
        reloaded = MTDNNForSequenceClassification.from_pretrained(tmp_path, num_labels=5)
        assert reloaded.config.num_labels == reloaded.config.task("nli")["num_labels"] == 3
        assert self.run(reloaded.eval(), self.inputs(reloaded.config)).logits.shape == (BATCH, 3)

    def test_a_san_head_is_single_label(self):
        config = self.config(default_task="nli", problem_type="multi_label_classification")
        with pytest.raises(ValueError, match="SAN head.*multi_label_classification needs a linear head"):
            MTDNNForSequenceClassification(config)

    def test_the_problem_type_follows_the_task(self):
        """Single-label and regression follow the chosen task (a folder saved for one task loads for another)."""
        assert self.model(self.config(default_task="sts", problem_type="single_label_classification")
                          ).config.problem_type == "regression"
        assert self.model(self.config(default_task="nli", problem_type="regression")
                          ).config.problem_type == "single_label_classification"


# tiny encoders of three families, with the no-split modules of each (transformers') that MT-DNN keeps and the one
# it leaves out, the embedding module (`no_split_modules_outside_input_embeddings`)
ENCODERS = {
    "bert": (TestMTDNNForSequenceClassification().encoder(), {"BertLayer"}, "BertEmbeddings"),
    "roberta": (RobertaConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                              intermediate_size=24, max_position_embeddings=40), {"RobertaLayer"}, "RobertaEmbeddings"),
    "modernbert": (ModernBertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                    intermediate_size=32, global_attn_every_n_layers=1, local_attention=16,
                                    pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2),
                   {"ModernBertEncoderLayer"}, "ModernBertEmbeddings"),
}


class MTDNNClassifierOnEncoder(TestMTDNNForSequenceClassification):
    """The sequence classifier's checks on another encoder (called by the test below, not collected)."""

    def __init__(self, encoder):
        self.encoder_config = encoder

    def encoder(self, **overrides):
        return self.encoder_config


@pytest.mark.parametrize("family", sorted(ENCODERS))
def test_no_split_modules_are_the_encoders_but_its_embeddings_for_accelerates_fsdp2_plan(family):
    """MT-DNN runs on any encoder: it does not split its encoder's layers, and leaves the embedding module (a no-split
    module in transformers) to accelerate's FSDP2 plan, which gives the word embeddings a unit of their own; the plan
    then holds for each family (`test_accelerate_fsdp2_plan_at_world_size_8`)."""
    encoder, kept, embedding_module = ENCODERS[family]
    tester = MTDNNClassifierOnEncoder(encoder)
    model = tester.model()
    assert set(model.bert._no_split_modules) == kept | {embedding_module}
    assert model._no_split_modules == kept
    tester.test_accelerate_fsdp2_plan_at_world_size_8()


def test_transformers_bert_classifier_fails_accelerates_fsdp2_plan_unless_its_embedding_module_is_left_out():
    """What docs/scale.md says of transformers' own `BertForSequenceClassification`: accelerate's FSDP2 plan makes its
    no-split `BertEmbeddings` a unit, then shards the word embeddings inside it a second time, which FSDP2 cannot do;
    without `BertEmbeddings` among its no-split modules (MT-DNN's rule) the plan holds. This test fails when
    transformers or accelerate change that, and the page with it."""
    model = BertForSequenceClassification(ENCODERS["bert"][0])
    assert "BertEmbeddings" in model._no_split_modules
    with fake_process_group(), pytest.raises(TypeError, match="value was None"):
        accelerate_fsdp2_prepare(model)
    model = BertForSequenceClassification(ENCODERS["bert"][0])
    model._no_split_modules = no_split_modules_outside_input_embeddings(model)
    assert model._no_split_modules == {"BertLayer"}
    with fake_process_group():
        accelerate_fsdp2_prepare(model)
    assert {name for name, module in model.named_modules() if isinstance(module, FSDPModule)} == {
        "", "bert.embeddings.word_embeddings", "bert.encoder.layer.0", "bert.encoder.layer.1"}


NOT_SAN = "the task is not a SAN task (TestMTDNNModel and TestMTDNNForSequenceClassification run the check)"


class TestMTDNNForTokenClassification(MTDNNTester):
    model_class = MTDNNForTokenClassification
    not_applicable = {**MTDNNTester.not_applicable, "test_the_san_check_is_eager_only": NOT_SAN}

    def config(self, **overrides):
        return super().config(**{"default_task": "ner", **overrides})


class TestMTDNNForQuestionAnswering(MTDNNTester):
    model_class = MTDNNForQuestionAnswering
    not_applicable = {**MTDNNTester.not_applicable, "test_the_san_check_is_eager_only": NOT_SAN}

    def config(self, **overrides):
        return super().config(**{"default_task": "qa", **overrides})


# ----- regression of issue #17 -----

@pytest.mark.slow
def test_resized_vocabulary_survives_save_and_load(tmp_path):
    """#17.1: `resize_token_embeddings` records the new size in the encoder's config, which the encoder is rebuilt
    from, so the saved model loads."""
    model = TestMTDNNModel().model()
    model.resize_token_embeddings(57)
    assert model.config.encoder.vocab_size == 57 and model.config.get_text_config() is model.config.encoder
    model.save_pretrained(tmp_path)
    reloaded = MTDNNModel.from_pretrained(tmp_path)
    assert reloaded.get_input_embeddings().weight.shape == (57, 16)
