"""MT-DNN model: the config and its task-definition YAML, the heads (SAN turns, memory types, cells, stochastic
prediction dropout), the per-task losses, task selection, masks, and one task as a plain sequence classifier."""

import itertools
import math
import re
import subprocess
import sys
import textwrap

import pytest
import torch
from torch.nn import functional as F
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForSequenceClassification,
    BertConfig,
    BertModel,
    BertTokenizer,
    pipeline,
)

import hf_ext  # noqa: F401  (registers the Auto classes)
from hf_ext.models.mtdnn import MTDNNConfig, MTDNNForSequenceClassification, MTDNNModel, premise_hypothesis_masks
from hf_ext.models.mtdnn.modeling_mtdnn import variational_dropout
from hf_ext.models.mtdnn.task_defs import config_from_task_def_yaml

SAN = {"num_turns": 3, "memory_type": 1, "memory_dropout": 0.1, "merge_opt": 1, "rnn_type": "gru"}
TASK_DEF_YAML = textwrap.dedent("""\
    sst:
      data_format: PremiseOnly
      dropout_p: 0.05
      enable_san: false
      metric_meta: [ACC]
      loss: CeCriterion
      n_class: 2
      task_type: Classification
    nli:
      data_format: PremiseAndOneHypothesis
      enable_san: true
      labels: [contradiction, neutral, entailment]
      metric_meta: [ACC]
      loss: CeCriterion
      kd_loss: MseCriterion
      n_class: 3
      task_type: Classification
    sts:
      data_format: PremiseAndOneHypothesis
      dropout_p: 0.1
      enable_san: false
      metric_meta: [Pearson, Spearman]
      n_class: 1
      task_type: Regression
    rank:
      data_format: PremiseAndMultiHypothesis
      enable_san: false
      metric_meta: [ACC]
      loss: RankCeCriterion
      n_class: 1
      task_type: Ranking
    """)


def encoder(**changes):
    return BertConfig(**{"vocab_size": 50, "hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
                         "intermediate_size": 24, "max_position_embeddings": 40, **changes})


def tiny_config(san=None, group_sizes=None, default_task=None, **encoder_changes):
    return config_from_task_def_yaml(TASK_DEF_YAML, encoder(**encoder_changes), san=san or SAN,
                                          group_sizes=group_sizes or {"rank": 3}, default_task=default_task)


def tiny_model(seed=0, **kwargs):
    torch.manual_seed(seed)
    return MTDNNModel(tiny_config(**kwargs)).eval()


def pair_batch(lengths, vocab_size=50, seed=0):
    """Right-padded `[CLS] premise [SEP] hypothesis [SEP]` rows, one per (premise, hypothesis) length pair."""
    generator = torch.Generator().manual_seed(seed)
    width = max(p + h + 3 for p, h in lengths)
    input_ids = torch.zeros(len(lengths), width, dtype=torch.long)
    token_type_ids = torch.zeros_like(input_ids)
    attention_mask = torch.zeros_like(input_ids)
    for row, (p, h) in enumerate(lengths):
        tokens = torch.randint(5, vocab_size, (p + h + 3,), generator=generator)
        tokens[0], tokens[p + 1], tokens[-1] = 2, 3, 3
        input_ids[row, :len(tokens)] = tokens
        token_type_ids[row, p + 2:len(tokens)] = 1
        attention_mask[row, :len(tokens)] = 1
    return {"input_ids": input_ids, "token_type_ids": token_type_ids, "attention_mask": attention_mask}


def collater_masks(token_type_ids, attention_mask):
    """The original collater's masks, position by position: plen = number of type-0 tokens of the row."""
    premise = torch.ones_like(attention_mask, dtype=torch.bool)
    hypothesis = torch.ones_like(premise)
    for row, (types, real) in enumerate(zip(token_type_ids.tolist(), attention_mask.tolist(), strict=True)):
        length = sum(real)
        plen = length - sum(types[:length])
        premise[row, :plen] = False
        hypothesis[row, plen:length] = False
    return premise, hypothesis


BATCH = pair_batch([(4, 3), (2, 5), (6, 1), (3, 3), (1, 2), (5, 4)])


# ----- config ---------------------------------------------------------------------------------------------------------


def test_task_def_yaml_maps_every_field():
    config = tiny_config()
    assert config.task_names == ["sst", "nli", "sts", "rank"]
    sst, nli, sts, rank = config.tasks
    assert (sst["type"], sst["num_labels"], sst["head"], sst["dropout"], sst["data_format"]) == \
        ("classification", 2, "linear", 0.05, "PremiseOnly")
    assert (nli["head"], nli["labels"], nli["dropout"], nli["kd_loss"], nli["san"]) == \
        ("san", ["contradiction", "neutral", "entailment"], 0.1, "MseCriterion", SAN)
    assert (sts["type"], sts["num_labels"], sts["metrics"]) == ("regression", 1, ["Pearson", "Spearman"])
    assert (rank["type"], rank["group_size"], rank["data_format"]) == ("ranking", 3, "PremiseAndMultiHypothesis")


def test_task_names_choose_and_order_tasks(tmp_path):
    path = tmp_path / "task_def.yml"
    path.write_text(TASK_DEF_YAML)
    config = config_from_task_def_yaml(path, encoder(), task_names=["sts", "sst"])
    assert config.task_names == ["sts", "sst"]
    assert config.task_index("sst") == 1 and config.task(0)["type"] == "regression"


def test_config_round_trips_through_json(tmp_path):
    config = tiny_config(default_task="nli")
    config.save_pretrained(tmp_path)
    loaded = AutoConfig.from_pretrained(tmp_path)
    assert isinstance(loaded, MTDNNConfig)
    assert loaded.tasks == config.tasks and loaded.default_task == "nli"
    assert loaded.encoder.hidden_size == 16


@pytest.mark.parametrize("yaml_text, message", [
    ("sst: [unclosed", "malformed task-definition YAML at line"),
    ("- just\n- a list\n", "must map task names"),
    ("sst:\n  task_type: SeqenceGeneration\n  n_class: 2\n", "task_type 'SeqenceGeneration' is not supported"),
    ("sst:\n  task_type: Classification\n", "lacks n_class"),
    ("sst:\n  task_type: Classification\n  n_class: 2\n  enable_sna: true\n", "unknown key(s) enable_sna"),
    ("sst:\n  task_type: Classification\n  n_class: 3\n  labels: [a, b]\n", "2 label names for 3 labels"),
    ("sst:\n  task_type: Classification\n  n_class: 2\n  loss: KlCriterion\n", "loss KlCriterion is not supported"),
    ("sst:\n  task_type: Regression\n  n_class: 2\n", "num_labels must be 1"),
    ("sst:\n  task_type: Classification\n  n_class: 2\n  data_format: PremiseOnly\n  enable_san: true\n",
     "a SAN head classifies sentence pairs"),
    ("sst:\n  task_type: Ranking\n  n_class: 1\n  data_format: PremiseOnly\n", "does not fit a ranking task"),
    ("s.t:\n  task_type: Classification\n  n_class: 2\n", "task name 's.t' is not valid"),
])
def test_bad_task_definitions_raise_one_clear_line(yaml_text, message):
    with pytest.raises(ValueError) as error:
        config_from_task_def_yaml(yaml_text + "\n", encoder())
    assert message in str(error.value) and "\n" not in str(error.value)


def test_missing_task_file_and_unknown_tasks_are_refused(tmp_path):
    with pytest.raises(ValueError, match="cannot read the task-definition file"):
        config_from_task_def_yaml(tmp_path / "absent.yml", encoder())
    with pytest.raises(ValueError, match="task.s. qqp are not defined"):
        config_from_task_def_yaml(TASK_DEF_YAML, encoder(), task_names=["sst", "qqp"])
    with pytest.raises(ValueError, match="group sizes given for unknown task"):
        config_from_task_def_yaml(TASK_DEF_YAML, encoder(), group_sizes={"copa": 2})
    with pytest.raises(ValueError, match="default_task 'qqp' is not one of the tasks"):
        tiny_config(default_task="qqp")
    with pytest.raises(ValueError, match="unknown SAN setting"):
        tiny_config(san={"turns": 3})
    with pytest.raises(ValueError, match="rnn_type 'transformer' is not supported"):
        tiny_config(san={"rnn_type": "transformer"})


# ----- heads ----------------------------------------------------------------------------------------------------------


def test_derived_masks_are_the_original_collaters():
    premise, hypothesis = premise_hypothesis_masks(BATCH["token_type_ids"], BATCH["attention_mask"])
    expected = collater_masks(BATCH["token_type_ids"], BATCH["attention_mask"])
    assert torch.equal(premise, expected[0]) and torch.equal(hypothesis, expected[1])


def reference_san(head, sequence_output, premise_mask, hypothesis_mask):
    """The SAN head in eval mode, written out from the paper and the original's modules (no dropout)."""
    x = sequence_output
    scores = (x @ head.hypothesis_attn.weight.T + head.hypothesis_attn.bias).squeeze(-1)
    h = (scores.masked_fill(hypothesis_mask, -math.inf).softmax(-1).unsqueeze(-1) * x).sum(1)
    c = torch.zeros_like(h)
    probabilities, last_logits = [], None
    for _ in range(head.num_turns):
        att = torch.einsum("blh,bh->bl", x, h @ head.premise_attn.weight.T + head.premise_attn.bias)
        x_sum = (att.masked_fill(premise_mask, -math.inf).softmax(-1).unsqueeze(-1) * x).sum(1)
        parts = [x_sum, h, (x_sum - h).abs(), x_sum * h] if head.merge_opt == 1 else [x_sum, h]
        last_logits = torch.cat(parts, -1) @ head.classifier.weight.T + head.classifier.bias
        probabilities.append(last_logits.softmax(-1))
        if isinstance(head.rnn, torch.nn.LSTMCell):
            h, c = head.rnn(x_sum, (h, c))
        else:
            h = head.rnn(x_sum, h)
    return torch.stack(probabilities).mean(0).log() if head.memory_type == 1 else last_logits


@pytest.mark.parametrize("san", [
    {"num_turns": 5},
    {"num_turns": 1, "merge_opt": 0},
    {"num_turns": 3, "rnn_type": "lstm", "memory_type": 0},
    {"num_turns": 2, "rnn_type": "rnn"},
])
def test_san_head_matches_a_written_out_reference(san):
    model = tiny_model(san={**SAN, **san}, hidden_size=12, num_attention_heads=3)
    with torch.no_grad():
        out = model(**BATCH, task="nli", output_san_states=True, output_hidden_states=True)
        premise, hypothesis = collater_masks(BATCH["token_type_ids"], BATCH["attention_mask"])
        expected = reference_san(model.heads["nli"], out.hidden_states[-1], premise, hypothesis)
    turns = san["num_turns"]
    states = out.san_states
    assert out.logits.shape == (6, 3)
    torch.testing.assert_close(out.logits, expected, atol=1e-6, rtol=1e-5)
    assert states.attention_scores.shape == (turns, 6, BATCH["input_ids"].size(1))
    assert torch.equal(states.attention_scores.isinf(), premise.expand(turns, -1, -1))
    assert torch.equal(states.states[0], states.initial_state)
    assert torch.equal(states.states[1:], states.rnn_outputs[:-1])  # each turn reads the previous update
    if san.get("memory_type", 1) == 0:
        assert torch.equal(out.logits, states.turn_logits[-1])


def test_stochastic_prediction_dropout_keeps_whole_turns():
    """Training mode without other dropout: exp(logits) * T * (1 - p) is the sum of the probabilities of a non-empty
    subset of turns (the mean still divides by all T turns)."""
    p, turns = 0.5, 3
    model = tiny_model(san={**SAN, "num_turns": turns, "memory_dropout": p}, hidden_dropout_prob=0.0,
                       attention_probs_dropout_prob=0.0)
    model.heads["nli"].dropout = 0.0
    model.train()
    torch.manual_seed(3)
    with torch.no_grad():
        out = model(**BATCH, task="nli", output_san_states=True)
    probs = out.san_states.turn_logits.softmax(-1)  # (T, B, C)
    scaled = out.logits.exp() * turns * (1 - p)
    subsets = [s for r in range(1, turns + 1) for s in itertools.combinations(range(turns), r)]
    chosen = []
    for row in range(scaled.size(0)):
        matches = [s for s in subsets if torch.allclose(probs[list(s), row].sum(0), scaled[row], atol=1e-5)]
        assert matches, f"row {row} is not an average over kept turns"
        chosen.append(matches[0])
    assert any(len(s) < turns for s in chosen), "no turn was ever dropped"
    model.heads["nli"].memory_dropout = 0.0  # nothing dropped: the plain average, as at evaluation
    with torch.no_grad():
        assert torch.allclose(model(**BATCH, task="nli").logits, model.eval()(**BATCH, task="nli").logits, atol=1e-6)


def test_variational_dropout_shares_one_mask_over_positions():
    torch.manual_seed(0)
    x = torch.ones(4, 7, 10)
    out = variational_dropout(x, 0.5, training=True)
    assert set(out.unique().tolist()) <= {0.0, 2.0}
    assert torch.equal(out, out[:, :1].expand_as(out))
    assert torch.equal(variational_dropout(x, 0.5, training=False), x)


def test_linear_head_is_dense_then_projection_without_activation():
    model = tiny_model()
    with torch.no_grad():
        out = model(**BATCH, task="sts", output_hidden_states=True)
        head = model.heads["sts"]
        expected = head.out_proj(head.dense(out.hidden_states[-1][:, 0]))
    assert out.logits.shape == (6, 1)
    torch.testing.assert_close(out.logits, expected)


# ----- losses, tasks, masks -------------------------------------------------------------------------------------------


def test_losses_follow_the_task_type():
    model = tiny_model()
    with torch.no_grad():
        cls = model(**BATCH, task="nli", labels=torch.tensor([0, 1, 2, 0, 1, 2]))
        sts = model(**BATCH, task="sts", labels=torch.linspace(0, 5, 6))
        rank_rows = model(**BATCH, task="rank", labels=torch.tensor([1, 1, 1, 0, 0, 0]))
        rank_groups = model(**BATCH, task="rank", labels=torch.tensor([1, 0]))
    torch.testing.assert_close(cls.loss, F.cross_entropy(cls.logits, torch.tensor([0, 1, 2, 0, 1, 2])))
    torch.testing.assert_close(sts.loss, F.mse_loss(sts.logits.view(-1), torch.linspace(0, 5, 6)))
    assert rank_rows.logits.shape == (6, 1) and rank_rows.group_logits.shape == (2, 3)
    assert torch.equal(rank_rows.group_logits, rank_rows.logits.view(2, 3))
    torch.testing.assert_close(rank_rows.loss, F.cross_entropy(rank_rows.logits.view(2, 3), torch.tensor([1, 0])))
    torch.testing.assert_close(rank_groups.loss, rank_rows.loss)


@pytest.mark.slow
def test_multi_task_training_lowers_every_task_loss():
    model = tiny_model(seed=1, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    labels = {"sst": torch.tensor([0, 1, 0, 1, 0, 1]), "nli": torch.tensor([0, 1, 2, 2, 1, 0]),
              "sts": torch.linspace(-1, 1, 6), "rank": torch.tensor([2, 0])}
    lengths = [(4, 3), (2, 5), (6, 1), (3, 3), (1, 2), (5, 4)]
    batches = {task: pair_batch(lengths, seed=seed) for seed, task in enumerate(labels, 1)}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)

    def losses():
        with torch.no_grad():
            return {task: model.eval()(**batches[task], task=task, labels=y).loss.item() for task, y in labels.items()}

    before = losses()
    for _ in range(10):
        for task, y in labels.items():  # one task per batch, as the original's sampler
            optimizer.zero_grad()
            model.train()(**batches[task], task=task, labels=y).loss.backward()
            optimizer.step()
    after = losses()
    assert all(after[task] < 0.6 * before[task] for task in labels), (before, after)


def test_task_is_chosen_by_name_index_or_batch_column():
    model = tiny_model()
    with torch.no_grad():
        by_name = model(**BATCH, task="nli").logits
        assert torch.equal(model(**BATCH, task=1).logits, by_name)
        assert torch.equal(model(**BATCH, task=torch.full((6,), 1)).logits, by_name)
        assert torch.equal(model(**BATCH, task=["nli"] * 6).logits, by_name)
    with pytest.raises(ValueError, match="mixes tasks"):
        model(**BATCH, task=torch.tensor([0, 1, 1, 1, 1, 1]))
    with pytest.raises(ValueError, match="unknown task 'qqp'; the model's tasks are sst, nli, sts, rank"):
        model(**BATCH, task="qqp")
    with pytest.raises(ValueError, match="task index 4 is out of range"):
        model(**BATCH, task=4)
    with pytest.raises(ValueError, match="pass task="):
        model(**BATCH)
    model.config.default_task = "sts"
    assert model(**BATCH).logits.shape == (6, 1)


def test_explicit_masks_equal_derived_ones_and_bad_masks_are_refused():
    model = tiny_model()
    premise, hypothesis = collater_masks(BATCH["token_type_ids"], BATCH["attention_mask"])
    with torch.no_grad():
        derived = model(**BATCH, task="nli").logits
        given = model(**BATCH, task="nli", premise_mask=premise, hypothesis_mask=hypothesis).logits
        swapped = model(**BATCH, task="nli", premise_mask=hypothesis, hypothesis_mask=premise).logits
    assert torch.equal(given, derived) and not torch.allclose(swapped, derived)
    shape = re.escape(str(tuple(BATCH["input_ids"].shape)))
    with pytest.raises(ValueError, match=rf"premise_mask must be a bool tensor .* of the input's shape {shape}"):
        model(**BATCH, task="nli", premise_mask=premise[:, :5])
    with pytest.raises(ValueError, match="hypothesis_mask must be a bool tensor"):
        model(**BATCH, task="nli", hypothesis_mask=hypothesis.long())
    single = dict(BATCH, token_type_ids=torch.zeros_like(BATCH["token_type_ids"]))
    with pytest.raises(ValueError, match="task nli .SAN head. reads sentence pairs, but row 0 has no premise or no "
                                         "hypothesis token"):
        model(**single, task="nli")
    with pytest.raises(ValueError, match="5 rows do not form groups of 3"):
        model(**{k: v[:5] for k, v in BATCH.items()}, task="rank")
    assert model(**BATCH, task="rank", group_size=2).group_logits.shape == (3, 2)


def test_left_padding_gives_the_right_padded_result():
    model = tiny_model()
    row = {k: v[1:2, :BATCH["attention_mask"][1].sum()] for k, v in BATCH.items()}  # one unpadded row
    left = {k: F.pad(v, (3, 0)) for k, v in row.items()}
    left["input_ids"][:, :3] = 0
    position_ids = (left["attention_mask"].cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        expected = model(**row, task="nli").logits
        actual = model(**left, task="nli", position_ids=position_ids).logits
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)


# ----- loading: BERT init, one task as a classifier, remote code ------------------------------------------------------


@pytest.mark.slow
def test_a_bert_checkpoint_initialises_the_encoder(tmp_path):
    torch.manual_seed(0)
    bert = BertModel(encoder())
    bert.save_pretrained(tmp_path)
    model = MTDNNModel.from_pretrained(tmp_path, config=tiny_config())
    for name, tensor in bert.state_dict().items():
        if not name.startswith("pooler."):
            assert torch.equal(model.bert.state_dict()[name], tensor), name


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mtdnn") / "model"
    tiny_model(seed=2).save_pretrained(folder)
    return folder


@pytest.mark.slow
def test_one_task_as_a_classifier_in_a_pipeline(saved_model):
    classifier = AutoModelForSequenceClassification.from_pretrained(saved_model, default_task="nli")
    assert isinstance(classifier, MTDNNForSequenceClassification) and classifier.task == "nli"
    assert classifier.config.id2label == {0: "contradiction", 1: "neutral", 2: "entailment"}
    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(45)])}
    tokenizer = BertTokenizer(vocab=vocab)
    scores = pipeline("text-classification", model=classifier, tokenizer=tokenizer)(
        {"text": "w1 w7 w3", "text_pair": "w9 w2"}, top_k=None)
    encoded = tokenizer("w1 w7 w3", "w9 w2", return_tensors="pt")
    multi = AutoModel.from_pretrained(saved_model).eval()
    with torch.no_grad():
        probabilities = multi(**encoded, task="nli").logits.exp()[0]  # SAN logits are log-probabilities
    by_label = {s["label"]: s["score"] for s in scores}
    for index, label in classifier.config.id2label.items():
        assert by_label[label] == pytest.approx(probabilities[index].item(), abs=1e-5)
    regression = AutoModelForSequenceClassification.from_pretrained(saved_model, default_task="sts")
    assert regression.config.problem_type == "regression" and regression.config.num_labels == 1


@pytest.mark.slow
def test_fine_tuned_classifier_still_loads_as_the_multi_task_model(saved_model, tmp_path):
    classifier = AutoModelForSequenceClassification.from_pretrained(saved_model, default_task="sts")
    classifier.train()
    optimizer = torch.optim.SGD(classifier.parameters(), lr=0.1)
    classifier(**BATCH, labels=torch.linspace(0, 1, 6)).loss.backward()
    optimizer.step()
    classifier.save_pretrained(tmp_path)
    reloaded = AutoModel.from_pretrained(tmp_path).eval()
    original = AutoModel.from_pretrained(saved_model).eval()
    assert set(reloaded.state_dict()) == set(original.state_dict())  # every head is still there
    assert torch.equal(reloaded.heads["nli"].classifier.weight, original.heads["nli"].classifier.weight)
    assert not torch.equal(reloaded.heads["sts"].out_proj.weight, original.heads["sts"].out_proj.weight)


@pytest.mark.slow
def test_saved_remote_code_passes_transformers_import_check_without_pyyaml(tmp_path, monkeypatch):
    """transformers' own check of a remote-code folder (`check_imports`, which imports every module its files import,
    indented imports included) passes where PyYAML cannot be imported: the task-definition YAML is read outside the
    remote code."""
    from transformers.dynamic_module_utils import check_imports

    from hf_ext.export import write_model_folder
    from hf_ext.models.mtdnn import ENTRY

    model = tiny_model(seed=4)
    write_model_folder(tmp_path, MTDNNModel, model.config, model.state_dict(), ENTRY.auto_map)
    files = sorted(path.name for path in tmp_path.glob("*.py"))
    assert files == ["configuration_mtdnn.py", "modeling_mtdnn.py", "pipeline_mtdnn.py"]
    monkeypatch.setitem(sys.modules, "yaml", None)  # what `import yaml` meets where PyYAML is not installed
    for name in files:
        check_imports(tmp_path / name)


@pytest.mark.slow
def test_saved_folder_loads_as_remote_code_without_hf_ext(tmp_path):
    from hf_ext.export import write_model_folder
    from hf_ext.models.mtdnn import ENTRY

    model = tiny_model(seed=4)
    (tmp_path / "m").mkdir()
    write_model_folder(tmp_path / "m", MTDNNModel, model.config, model.state_dict(), ENTRY.auto_map)
    with torch.no_grad():
        expected = model(**BATCH, task="nli").logits
    torch.save(BATCH, tmp_path / "batch.pt")
    script = textwrap.dedent(f"""
        import sys, torch
        sys.modules["hf_ext"] = None  # hf_ext must not be needed
        from transformers import AutoModel
        model = AutoModel.from_pretrained({str(tmp_path / 'm')!r}, trust_remote_code=True).eval()
        batch = torch.load({str(tmp_path / 'batch.pt')!r})
        with torch.no_grad():
            torch.save(model(**batch, task="nli").logits, {str(tmp_path / 'logits.pt')!r})
        """)
    subprocess.run([sys.executable, "-c", script], check=True, cwd=tmp_path, env={"HF_HUB_OFFLINE": "1",
                   "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    torch.testing.assert_close(torch.load(tmp_path / "logits.pt"), expected)
