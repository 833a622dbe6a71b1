"""`hf-ext convert mtdnn`: parity with the original code's outputs on the tiny fixture, other configurations written in
the original's checkpoint format (more tasks, other SAN settings and sizes, the enum form of encoder_type), and one
clear error line, a non-zero exit and nothing written for every kind of bad input."""

import enum
import json
import math
import os
import runpy
import sys
import types
from pathlib import Path
from unittest import mock

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch.nn import functional as F
from transformers import AutoModel, BertConfig, BertTokenizer, pipeline

import hf_ext  # noqa: F401  (registers the Auto classes)
from hf_ext.cli import main
from hf_ext.models.mtdnn import MTDNNModel

ATOL, RTOL = 5e-5, 1e-4  # reference.json's suggested tolerances


def assert_matches(actual, expected):
    torch.testing.assert_close(actual, expected, atol=ATOL, rtol=RTOL)


def run_cli(capsys, *argv):
    """`hf-ext ARGV` in this process: (exit code, stdout, stderr)."""
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exit_info:  # argparse's usage errors
        code = exit_info.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture(scope="module")
def tiny(fixtures_dir):
    return fixtures_dir / "mtdnn" / "tiny"


@pytest.fixture(scope="module")
def reference(tiny):
    return load_file(str(tiny / "reference.safetensors")), json.loads((tiny / "reference.json").read_text())


@pytest.fixture(scope="module")
def converted(tiny, repo_root, tmp_path_factory):
    """The fixture's model_0.pt converted by the conversion/ script (checked against the reference on the way)."""
    out = tmp_path_factory.mktemp("mtdnn_tiny") / "converted"
    script = repo_root / "conversion" / "convert_mtdnn_original_checkpoint.py"
    argv = [str(script), str(tiny / "model_0.pt"), str(out), "--reference", str(tiny / "reference.safetensors")]
    with mock.patch.object(sys, "argv", argv), pytest.raises(SystemExit) as exit_info:
        runpy.run_path(str(script), run_name="__main__")
    assert exit_info.value.code == 0
    return out


# ----- parity with the original code on the fixture -------------------------------------------------------------------


def fixture_inputs(tensors, name, with_masks):
    inputs = {key: tensors[f"{name}.{key}"] for key in ("input_ids", "token_type_ids", "attention_mask")}
    if with_masks and f"{name}.premise_mask" in tensors:
        inputs.update(premise_mask=tensors[f"{name}.premise_mask"], hypothesis_mask=tensors[f"{name}.hypothesis_mask"])
    return inputs


@pytest.mark.parametrize("with_masks", [True, False], ids=["collater masks", "derived masks"])
def test_every_task_matches_the_original(converted, reference, with_masks):
    tensors, meta = reference
    model = AutoModel.from_pretrained(converted).eval()
    assert isinstance(model, MTDNNModel)
    assert model.config.task_names == [task["name"] for task in meta["tasks"]]
    for task in meta["tasks"]:
        name = task["name"]
        inputs = fixture_inputs(tensors, name, with_masks)
        with torch.no_grad():
            out = model(**inputs, task=task["task_id"], labels=tensors[f"{name}.labels"], output_hidden_states=True,
                        output_san_states=True)
        assert_matches(out.logits, tensors[f"{name}.logits"])
        assert_matches(torch.stack(out.hidden_states), tensors[f"{name}.all_hidden_states"])
        assert_matches(out.hidden_states[-1], tensors[f"{name}.sequence_output"])
        assert_matches(out.loss.reshape(1), tensors[f"{name}.loss"])
        if f"{name}.pooled_output" in tensors:  # linear heads: the task pooler has no activation
            head = model.heads[name]
            assert_matches(head.dense(out.hidden_states[-1][:, 0]), tensors[f"{name}.pooled_output"])
        if task["task_type"] == "Classification":
            assert torch.equal(out.logits.argmax(-1), tensors[f"{name}.predict_labels"])
            assert_matches(out.logits.softmax(-1).reshape(-1), tensors[f"{name}.predict_scores"])
        if task["task_type"] == "Regression":
            assert_matches(out.logits.reshape(-1), tensors[f"{name}.predict_scores"])


def test_san_intermediate_states_match_the_original(converted, reference):
    tensors, meta = reference
    model = AutoModel.from_pretrained(converted).eval()
    (task,) = [t for t in meta["tasks"] if t["enable_san"]]
    name = task["name"]
    with torch.no_grad():
        out = model(**fixture_inputs(tensors, name, True), task=name, output_san_states=True)
    states = out.san_states
    assert_matches(states.initial_state, tensors[f"{name}.san_h0"])
    expected_scores = tensors[f"{name}.san_att_scores"]
    assert torch.equal(states.attention_scores.isinf(), expected_scores.isinf())  # -inf outside the premise
    finite = ~expected_scores.isinf()
    assert_matches(states.attention_scores[finite], expected_scores[finite])
    assert_matches(states.premise_summaries, tensors[f"{name}.san_x_sum"])
    assert_matches(states.states, tensors[f"{name}.san_h_state"])
    assert_matches(states.rnn_outputs, tensors[f"{name}.san_gru_out"])
    assert_matches(states.turn_logits, tensors[f"{name}.san_turn_scores"])
    assert_matches(out.logits.exp(), tensors[f"{name}.san_mean_probs"])


def test_ranking_groups_and_masks_match_the_original(converted, reference):
    tensors, meta = reference
    model = AutoModel.from_pretrained(converted).eval()
    (task,) = [t for t in meta["tasks"] if t["task_type"] == "Ranking"]
    name = task["name"]
    assert model.config.task(name)["group_size"] == task["pairwise_size"]
    with torch.no_grad():
        out = model(**fixture_inputs(tensors, name, False), task=name)
    assert_matches(out.group_logits, tensors[f"{name}.group_scores"])
    assert_matches(out.group_logits.softmax(-1), tensors[f"{name}.group_probs"])  # grouped before the softmax
    from hf_ext.models.mtdnn import premise_hypothesis_masks

    for pair_task in (t["name"] for t in meta["tasks"] if f"{t['name']}.premise_mask" in tensors):
        premise, hypothesis = premise_hypothesis_masks(tensors[f"{pair_task}.token_type_ids"],
                                                       tensors[f"{pair_task}.attention_mask"])
        assert torch.equal(premise, tensors[f"{pair_task}.premise_mask"])
        assert torch.equal(hypothesis, tensors[f"{pair_task}.hypothesis_mask"])


def test_folder_holds_config_code_weights_and_card(converted, tiny):
    config = json.loads((converted / "config.json").read_text())
    assert config["model_type"] == "mt-dnn" and config["architectures"] == ["MTDNNModel"]
    assert config["auto_map"]["AutoModelForSequenceClassification"].startswith("modeling_mtdnn.")
    assert (converted / "modeling_mtdnn.py").is_file() and (converted / "configuration_mtdnn.py").is_file()
    card = (converted / "README.md").read_text()
    assert "| 2 | `mnli` | classification | san (5 turns) | contradiction, neutral, entailment | 0.1 |" in card
    assert "pipeline_tag: text-classification" in card
    from huggingface_hub.utils.sha import sha_fileobj

    with open(tiny / "model_0.pt", "rb") as handle:
        assert sha_fileobj(handle).hex() in card
    rows = [line for line in card.splitlines() if line.startswith("| mnli san_")]
    assert len(rows) == 6 and all(float(row.split("|")[2]) < ATOL for row in rows)


@pytest.mark.slow
def test_yaml_task_definitions_and_a_tokenizer_give_a_pipeline_ready_folder(tiny, converted, tmp_path, capsys):
    vocab_size = json.loads((converted / "config.json").read_text())["encoder"]["vocab_size"]
    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tokenizer = BertTokenizer(vocab={t: i for i, t in enumerate(special + [f"w{i}" for i in range(vocab_size - 5)])})
    tokenizer.save_pretrained(tmp_path / "tokenizer")
    code, out, err = run_cli(capsys, "convert", "mtdnn", tiny / "model_0.pt", tmp_path / "from_yaml", "--task-def",
                             tiny / "task_def.yml", "--default-task", "mnli", "--tokenizer", tmp_path / "tokenizer")
    assert code == 0, err
    assert out.splitlines() == ["weights (round trip): max abs error 0 (tolerance: exact)"]
    from_yaml = json.loads((tmp_path / "from_yaml" / "config.json").read_text())
    from_checkpoint = json.loads((converted / "config.json").read_text())
    assert from_yaml["tasks"] == from_checkpoint["tasks"] and from_yaml["default_task"] == "mnli"
    assert load_file(str(tmp_path / "from_yaml" / "model.safetensors")).keys() == \
        load_file(str(converted / "model.safetensors")).keys()
    # the folder alone makes a text-classification pipeline for the default task
    scores = pipeline("text-classification", model=str(tmp_path / "from_yaml"))(
        {"text": "w1 w2 w3", "text_pair": "w4 w5"}, top_k=None)
    model = AutoModel.from_pretrained(converted).eval()
    with torch.no_grad():
        probabilities = model(**tokenizer("w1 w2 w3", "w4 w5", return_tensors="pt"), task="mnli").logits.exp()[0]
    by_label = {s["label"]: s["score"] for s in scores}
    assert by_label == pytest.approx({"contradiction": probabilities[0].item(), "neutral": probabilities[1].item(),
                                      "entailment": probabilities[2].item()}, abs=1e-5)


# ----- other configurations, written in the original's checkpoint format ---------------------------------------------


class TaskDef(dict):
    """experiments.exp_def.TaskDef as the original defines it: repr strings as items, real values as attributes."""

    __module__ = "experiments.exp_def"  # pickled under the original's name

    def __init__(self, label_vocab, n_class, data_type, task_type, metric_meta, split_names, enable_san, dropout_p,
                 loss, kd_loss, adv_loss, actf):
        values = dict(label_vocab=label_vocab, n_class=n_class, data_type=data_type, task_type=task_type,
                      metric_meta=metric_meta, split_names=split_names, enable_san=enable_san, dropout_p=dropout_p,
                      loss=loss, kd_loss=kd_loss, adv_loss=adv_loss, actf=actf)
        super().__init__(**{k: repr(v) for k, v in values.items()})
        self.__dict__.update(values)


class Vocabulary:
    """data_utils.vocab.Vocabulary(neat=True) with the labels added in order."""

    __module__ = "data_utils.vocab"

    def __init__(self, labels):
        self.neat = True
        self.tok2ind = {label: i for i, label in enumerate(labels)}
        self.ind2tok = dict(enumerate(labels))


ORIGINAL = types.SimpleNamespace(
    TaskType=enum.IntEnum("TaskType", {"Classification": 1, "Regression": 2, "Ranking": 3,
                                       "SpanClassification": 4}, module="data_utils.task_def"),
    DataFormat=enum.IntEnum("DataFormat", {"PremiseOnly": 1, "PremiseAndOneHypothesis": 2,
                                           "PremiseAndMultiHypothesis": 3}, module="data_utils.task_def"),
    EncoderModelType=enum.IntEnum("EncoderModelType", {"BERT": 1, "ROBERTA": 2, "XLNET": 3, "DEBERTA": 6,
                                                       "ELECTRA": 7, "T5": 8}, module="data_utils.task_def"),
    Metric=enum.Enum("Metric", {"ACC": 0, "F1": 1, "MCC": 2, "Pearson": 3, "Spearman": 4},
                     module="data_utils.metrics"),
    LossCriterion=enum.IntEnum("LossCriterion", {"CeCriterion": 0, "MseCriterion": 1, "RankCeCriterion": 2,
                                                 "SymKlCriterion": 7}, module="mt_dnn.loss"),
)


def original_modules():
    """The original's modules with its classes, so that torch.save pickles them under the original's names."""
    modules = {name: types.ModuleType(name) for name in ("experiments", "experiments.exp_def", "data_utils",
                                                          "data_utils.task_def", "data_utils.metrics",
                                                          "data_utils.vocab", "mt_dnn", "mt_dnn.loss")}
    for cls, module in ((TaskDef, "experiments.exp_def"), (Vocabulary, "data_utils.vocab"),
                        *((getattr(ORIGINAL, n), "data_utils.task_def")
                          for n in ("TaskType", "DataFormat", "EncoderModelType")),
                        (ORIGINAL.Metric, "data_utils.metrics"), (ORIGINAL.LossCriterion, "mt_dnn.loss")):
        setattr(modules[module], cls.__name__, cls)
    return modules


def original_task_def(task_type, data_format, n_class, enable_san=False, dropout_p=0.1, labels=None):
    loss = {"Classification": "CeCriterion", "Regression": "MseCriterion", "Ranking": "RankCeCriterion"}[task_type]
    metrics = ("Pearson", "Spearman") if task_type == "Regression" else ("ACC",)
    return TaskDef(Vocabulary(labels) if labels else None, n_class, ORIGINAL.DataFormat[data_format],
                   ORIGINAL.TaskType[task_type], tuple(ORIGINAL.Metric[m] for m in metrics), ["train", "dev", "test"],
                   enable_san, dropout_p, ORIGINAL.LossCriterion[loss], ORIGINAL.LossCriterion.MseCriterion,
                   ORIGINAL.LossCriterion.SymKlCriterion, None)


def original_head(index, hidden, n_class, san, generator):
    """scoring_list.<index> weights of a linear head (san=None) or a SAN head, under the original's names."""
    def weight(*shape):
        return torch.randn(*shape, generator=generator) * 0.3

    prefix = f"scoring_list.{index}."
    state = {prefix + "0.dense.weight": weight(hidden, hidden), prefix + "0.dense.bias": weight(hidden)}
    if san is None:
        state.update({prefix + "1.weight": weight(n_class, hidden), prefix + "1.bias": weight(n_class)})
        return state
    gates = {"gru": 3, "lstm": 4, "rnn": 1}[san["rnn_type"]]
    merged = hidden * (4 if san["merge_opt"] == 1 else 2)
    state.update({prefix + "1.alpha": torch.zeros(1, 1),
                  prefix + "1.query_wsum.att.linear.weight": weight(1, hidden),
                  prefix + "1.query_wsum.att.linear.bias": weight(1),
                  prefix + "1.attn.score_func.linear.weight": weight(hidden, hidden),
                  prefix + "1.attn.score_func.linear.bias": weight(hidden),
                  prefix + "1.rnn.weight_ih": weight(gates * hidden, hidden),
                  prefix + "1.rnn.weight_hh": weight(gates * hidden, hidden),
                  prefix + "1.rnn.bias_ih": weight(gates * hidden), prefix + "1.rnn.bias_hh": weight(gates * hidden),
                  prefix + "1.classifier.proj.weight": weight(n_class, merged),
                  prefix + "1.classifier.proj.bias": weight(n_class)})
    return state


def write_original_checkpoint(path, bert, tasks, san, encoder_type=1, seed=0, **extra_options):
    """A checkpoint as the original's MTDNNModel.save writes it. `tasks`: (dataset, TaskDef) in training order.
    `bert`: the encoder's config (BERT's, or RoBERTa's, DeBERTa's, ELECTRA's with the matching `encoder_type`)."""
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    encoder = AutoModel.from_config(bert)  # with its pooler where it has one, as the original builds it
    state = {f"bert.{key}": value for key, value in encoder.state_dict().items()}
    state["bert.embeddings.position_ids"] = torch.arange(bert.max_position_embeddings)[None]
    for index, (_, task_def) in enumerate(tasks):
        state.update(original_head(index, bert.hidden_size, task_def.n_class,
                                   san if task_def.enable_san else None, generator))
    opt = {"train_datasets": [dataset for dataset, _ in tasks], "task_def_list": [d for _, d in tasks],
           "encoder_type": encoder_type, "bert_model_type": "bert-base-uncased", "mem_cum_type": "simple",
           "answer_num_turn": san["num_turns"], "answer_mem_type": san["memory_type"], "answer_mem_drop_p": 0.1,
           "answer_merge_opt": san["merge_opt"], "answer_rnn_type": san["rnn_type"], "answer_att_type": "bilinear",
           "answer_weight_norm_on": False, **bert.to_dict(), **extra_options}
    with mock.patch.dict(sys.modules, original_modules()):
        torch.save({"state": state, "optimizer": {"state": {}, "param_groups": []}, "config": opt}, path)
    return state


def original_masks(token_type_ids, attention_mask):
    premise = torch.ones_like(attention_mask, dtype=torch.bool)
    hypothesis = torch.ones_like(premise)
    for row, (types_, real) in enumerate(zip(token_type_ids.tolist(), attention_mask.tolist(), strict=True)):
        length = sum(real)
        plen = length - sum(types_[:length])
        premise[row, :plen], hypothesis[row, plen:length] = False, False
    return premise, hypothesis


def original_outputs(state, bert, index, task_def, san, batch):
    """The original network's eval-mode output for task `index`, computed from its own weight names."""
    encoder = AutoModel.from_config(bert).eval()
    encoder.load_state_dict({k[5:]: v for k, v in state.items()
                             if k.startswith("bert.") and k != "bert.embeddings.position_ids"})
    with torch.no_grad():
        x = encoder(**batch).last_hidden_state
    w = {key[len(f"scoring_list.{index}."):]: value for key, value in state.items()
         if key.startswith(f"scoring_list.{index}.")}
    if not task_def.enable_san:
        return F.linear(F.linear(x[:, 0], w["0.dense.weight"], w["0.dense.bias"]), w["1.weight"], w["1.bias"])
    premise, hypothesis = original_masks(batch["token_type_ids"], batch["attention_mask"])
    cell = {"gru": torch.nn.GRUCell, "lstm": torch.nn.LSTMCell, "rnn": torch.nn.RNNCell}[san["rnn_type"]]
    rnn = cell(x.size(-1), x.size(-1))
    rnn.load_state_dict({k[len("1.rnn."):]: v for k, v in w.items() if k.startswith("1.rnn.")})
    scores = F.linear(x, w["1.query_wsum.att.linear.weight"], w["1.query_wsum.att.linear.bias"]).squeeze(-1)
    h = torch.bmm(scores.masked_fill(hypothesis, -math.inf).softmax(1).unsqueeze(1), x).squeeze(1)
    c = torch.zeros_like(h)
    turn_scores = []
    with torch.no_grad():
        for _ in range(san["num_turns"]):
            wy = F.linear(h, w["1.attn.score_func.linear.weight"], w["1.attn.score_func.linear.bias"])
            att = torch.bmm(x, wy.unsqueeze(2)).squeeze(2).masked_fill(premise, -math.inf)
            x_sum = torch.bmm(att.softmax(1).unsqueeze(1), x).squeeze(1)
            merged = [x_sum, h, (x_sum - h).abs(), x_sum * h] if san["merge_opt"] == 1 else [x_sum, h]
            turn_scores.append(F.linear(torch.cat(merged, 1), w["1.classifier.proj.weight"],
                                        w["1.classifier.proj.bias"]))
            h, c = rnn(x_sum, (h, c)) if san["rnn_type"] == "lstm" else (rnn(x_sum, h), c)
    if san["memory_type"] == 0:
        return turn_scores[-1]
    return torch.stack([s.softmax(1) for s in turn_scores], 2).mean(2).log()


def pair_batch(rows, vocab_size, seed):
    generator = torch.Generator().manual_seed(seed)
    width = max(p + h + 3 for p, h in rows)
    batch = {key: torch.zeros(len(rows), width, dtype=torch.long) for key in ("input_ids", "token_type_ids",
                                                                               "attention_mask")}
    for row, (p, h) in enumerate(rows):
        batch["input_ids"][row, :p + h + 3] = torch.randint(4, vocab_size, (p + h + 3,), generator=generator)
        batch["token_type_ids"][row, p + 2:p + h + 3] = 1
        batch["attention_mask"][row, :p + h + 3] = 1
    return batch


CONFIGURATIONS = {
    "six tasks, 3 turns, enum encoder_type": dict(
        bert=dict(vocab_size=80, hidden_size=24, num_hidden_layers=3, num_attention_heads=3, intermediate_size=40,
                  max_position_embeddings=48),
        san={"num_turns": 3, "memory_type": 1, "merge_opt": 1, "rnn_type": "gru"},
        tasks=[("sst", "Classification", "PremiseOnly", 2, False, None),
               ("rte", "Classification", "PremiseAndOneHypothesis", 2, True, ["not_entailment", "entailment"]),
               ("mnli_matched", "Classification", "PremiseAndOneHypothesis", 3, True, None),
               ("stsb", "Regression", "PremiseAndOneHypothesis", 1, False, None),
               ("copa", "Ranking", "PremiseAndMultiHypothesis", 1, False, None),
               ("qqp", "Classification", "PremiseAndOneHypothesis", 2, False, None)],
        encoder_type="enum", group_sizes={"copa": 3}),
    "lstm, 1 turn, merge 0, last-turn memory": dict(
        bert=dict(vocab_size=40, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16,
                  max_position_embeddings=32),
        san={"num_turns": 1, "memory_type": 0, "merge_opt": 0, "rnn_type": "lstm"},
        tasks=[("snli", "Classification", "PremiseAndOneHypothesis", 3, True, None),
               ("wnli", "Classification", "PremiseAndOneHypothesis", 2, False, None)],
        encoder_type=1, group_sizes={}),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CONFIGURATIONS))
def test_other_configurations_convert_exactly(name, tmp_path, capsys):
    spec = CONFIGURATIONS[name]
    bert = BertConfig(**spec["bert"])
    tasks = [(dataset, original_task_def(t, f, n, san, labels=labels))
             for dataset, t, f, n, san, labels in spec["tasks"]]
    encoder_type = ORIGINAL.EncoderModelType.BERT if spec["encoder_type"] == "enum" else spec["encoder_type"]
    state = write_original_checkpoint(tmp_path / "model_3.pt", bert, tasks, spec["san"], encoder_type)
    group_args = [arg for task, k in spec["group_sizes"].items() for arg in ("--group-size", f"{task}={k}")]
    code, _, err = run_cli(capsys, "convert", "mtdnn", tmp_path / "model_3.pt", tmp_path / "out", *group_args)
    assert code == 0, err
    model = AutoModel.from_pretrained(tmp_path / "out").eval()
    names = list(dict.fromkeys(dataset.split("_")[0] for dataset, _ in tasks))
    assert model.config.task_names == names and model.config.encoder.num_hidden_layers == bert.num_hidden_layers
    for index, (task_name, (_, task_def)) in enumerate(zip(names, tasks, strict=True)):
        task = model.config.task(task_name)
        rows = [(3, 2), (1, 4), (5, 1), (2, 2), (4, 3), (2, 1)]
        batch = pair_batch(rows, bert.vocab_size, seed=index)
        with torch.no_grad():
            out = model(**batch, task=task_name)
        expected = original_outputs(state, bert, index, task_def, {**spec["san"]}, batch)
        assert_matches(out.logits, expected)
        if task["type"] == "ranking":
            size = spec["group_sizes"][task_name]
            assert out.group_logits.shape == (len(rows) // size, size)
        if task_def.enable_san:
            assert task["san"]["num_turns"] == spec["san"]["num_turns"]
            vocabulary = task_def.label_vocab
            assert task["labels"] == (list(vocabulary.ind2tok.values()) if vocabulary else None)


# ----- bad input: one clear line, a non-zero exit, nothing written ----------------------------------------------------


def assert_refused(capsys, out, *argv, message):
    code, stdout, err = run_cli(capsys, "convert", "mtdnn", *argv, out)
    assert code != 0
    errors = [line for line in err.splitlines() if line.startswith("hf-ext: error: ")]
    assert len(errors) == 1 and err.strip().splitlines()[-1] == errors[0], err  # progress lines may precede it
    assert message in errors[0], errors[0]
    assert "Traceback" not in err and not stdout
    assert not Path(out).exists()
    assert not [p for p in Path(out).parent.iterdir() if p.name.startswith(f".{Path(out).name}.")]
    return errors[0]


class RunsCode:
    """Pickles as a call of os.system: loading it with plain pickle would create the marker file."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


class GetattrProbe:
    """Pickles as getattr(argparse.Namespace, "__init__"): probing the getattr stand-in with an allowed global."""

    def __reduce__(self):
        import argparse

        return getattr, (argparse.Namespace, "__init__")


@pytest.fixture(scope="module")
def small_checkpoint(tmp_path_factory):
    """A tiny two-task original checkpoint (a SAN pair classifier and a regression) and its task_def.yml text."""
    folder = tmp_path_factory.mktemp("mtdnn_small")
    bert = BertConfig(vocab_size=30, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8,
                      max_position_embeddings=16)
    tasks = [("mnli", original_task_def("Classification", "PremiseAndOneHypothesis", 3, True,
                                        labels=["contradiction", "neutral", "entailment"])),
             ("stsb", original_task_def("Regression", "PremiseAndOneHypothesis", 1))]
    write_original_checkpoint(folder / "model.pt", bert, tasks,
                              {"num_turns": 2, "memory_type": 1, "merge_opt": 1, "rnn_type": "gru"})
    yaml_text = ("mnli:\n  data_format: PremiseAndOneHypothesis\n  enable_san: true\n  n_class: 3\n"
                 "  task_type: Classification\n  labels: [contradiction, neutral, entailment]\n"
                 "stsb:\n  data_format: PremiseAndOneHypothesis\n  enable_san: false\n  n_class: 1\n"
                 "  task_type: Regression\n")
    return folder / "model.pt", yaml_text


@pytest.mark.slow
def test_pickle_that_would_run_code_is_refused_unexecuted(small_checkpoint, tmp_path, capsys):
    marker = tmp_path / "executed"
    evil = tmp_path / "evil.pt"
    torch.save({"state": {}, "config": {"payload": RunsCode(marker)}}, evil)
    line = assert_refused(capsys, tmp_path / "out", evil, message="refusing to load checkpoint")
    assert "system" in line and "it was not executed" in line
    assert not marker.exists()
    probe = tmp_path / "probe.pt"
    torch.save({"state": {}, "config": {"payload": GetattrProbe()}}, probe)
    assert_refused(capsys, tmp_path / "out", probe, message="builtins.getattr")


@pytest.mark.slow
def test_truncated_foreign_and_encoder_only_checkpoints_are_refused(small_checkpoint, tmp_path, capsys):
    data = small_checkpoint[0].read_bytes()
    (tmp_path / "truncated.pt").write_bytes(data[:len(data) // 2])
    line = assert_refused(capsys, tmp_path / "out", tmp_path / "truncated.pt", message=str(tmp_path / "truncated.pt"))
    assert "truncated or corrupt" in line or "could not be read as a torch checkpoint" in line
    torch.save({"weight": torch.zeros(2)}, tmp_path / "plain.pt")
    assert_refused(capsys, tmp_path / "out", tmp_path / "plain.pt", message="is not an MT-DNN checkpoint")
    (tmp_path / "notes.txt").write_text("hello")
    assert_refused(capsys, tmp_path / "out", tmp_path / "notes.txt", message="is not a torch checkpoint")
    assert_refused(capsys, tmp_path / "out", tmp_path / "absent.pt", message="does not exist")


@pytest.mark.slow
def test_yaml_problems_are_refused(small_checkpoint, tmp_path, capsys):
    checkpoint, yaml_text = small_checkpoint
    cases = {
        "missing task": (yaml_text.split("stsb:")[0], "task(s) stsb are not defined in the task definitions"),
        "unknown type": (yaml_text.replace("task_type: Regression", "task_type: MaskLM"),
                         "task_type 'MaskLM' is not supported"),
        "label count": (yaml_text.replace("n_class: 3", "n_class: 4").replace(
            "  labels: [contradiction, neutral, entailment]\n", ""),
            "task mnli (scoring_list.0): the task definition says 4 label(s), the weights "
            "scoring_list.0.1.classifier.proj.weight have 3"),
        "head type": (yaml_text.replace("enable_san: true", "enable_san: false"),
                      "the task definition says a linear head, the checkpoint holds a SAN head"),
        "malformed": (yaml_text.replace("n_class: 3", "n_class: [3"), "malformed task-definition YAML at line"),
    }
    for name, (text, message) in cases.items():
        path = tmp_path / f"{name.replace(' ', '_')}.yml"
        path.write_text(text)
        assert_refused(capsys, tmp_path / "out", checkpoint, "--task-def", path, message=message)


@pytest.mark.slow
def test_unknown_task_names_and_options_are_refused(small_checkpoint, tmp_path, capsys):
    checkpoint = small_checkpoint[0]
    assert_refused(capsys, tmp_path / "out", checkpoint, "--default-task", "qqp",
                   message="default_task 'qqp' is not one of the tasks (mnli, stsb)")
    assert_refused(capsys, tmp_path / "out", checkpoint, "--group-size", "copa=3",
                   message="group sizes given for unknown task(s) copa")
    assert_refused(capsys, tmp_path / "out", checkpoint, "--group-size", "copa",
                   message="argument --group-size: expected TASK=K, got 'copa'")


@pytest.mark.slow
def test_unsupported_encoders_and_san_variants_are_refused(tmp_path, capsys):
    bert = BertConfig(vocab_size=30, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8,
                      max_position_embeddings=16)
    tasks = [("rte", original_task_def("Classification", "PremiseAndOneHypothesis", 2, True))]
    san = {"num_turns": 2, "memory_type": 1, "merge_opt": 1, "rnn_type": "gru"}
    supported = "(supported: BERT, ROBERTA, DEBERTA, ELECTRA)"
    for encoder_type, name in ((ORIGINAL.EncoderModelType.XLNET, "XLNET"), (8, "T5")):
        write_original_checkpoint(tmp_path / "other.pt", bert, tasks, san, encoder_type)
        assert_refused(capsys, tmp_path / "out", tmp_path / "other.pt",
                       message=f"encoder_type {name} is not supported {supported}")
    write_original_checkpoint(tmp_path / "unknown.pt", bert, tasks, san, 99)
    assert_refused(capsys, tmp_path / "out", tmp_path / "unknown.pt",
                   message=f"encoder_type 99 is not one of the original's encoder types {supported}")
    # a BERT config under a RoBERTa encoder_type: the config's model_type says otherwise
    write_original_checkpoint(tmp_path / "mixed.pt", bert, tasks, san, ORIGINAL.EncoderModelType.ROBERTA)
    assert_refused(capsys, tmp_path / "out", tmp_path / "mixed.pt",
                   message="encoder_type RoBERTa but the config's model_type is 'bert'")
    write_original_checkpoint(tmp_path / "mlp.pt", bert, tasks, san, answer_att_type="simple")
    assert_refused(capsys, tmp_path / "out", tmp_path / "mlp.pt",
                   message="unsupported SAN option(s) answer_att_type='simple'")


@pytest.mark.slow
def test_mismatched_reference_masks_are_refused(converted, reference, tiny, tmp_path, capsys):
    tensors, _ = reference
    broken = {k: v for k, v in tensors.items() if k.startswith("mnli.")}
    broken["mnli.premise_mask"] = broken["mnli.premise_mask"][:, :-2].contiguous()
    save_file(broken, str(tmp_path / "broken.safetensors"))
    assert_refused(capsys, tmp_path / "out", tiny / "model_0.pt", "--reference", tmp_path / "broken.safetensors",
                   message="premise_mask must be a bool tensor (True = excluded) of the input's shape")


@pytest.mark.slow
def test_existing_output_is_kept(small_checkpoint, tmp_path, capsys):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    code, _, err = run_cli(capsys, "convert", "mtdnn", small_checkpoint[0], tmp_path / "out")
    assert code != 0 and "already exists" in err
    assert (tmp_path / "out" / "keep.txt").read_text() == "mine"


def test_reference_tolerances_are_the_fixtures(reference):
    from hf_ext.models.mtdnn.conversion import REFERENCE_TOLERANCES

    stated = reference[1]["tolerances_suggested"]
    assert {(tolerance.atol, tolerance.rtol) for tolerance in REFERENCE_TOLERANCES.values()} == \
        {(stated["atol"], stated["rtol"])}
    # masked SAN scores are -inf in the original; the comparison wants them -inf at the same places
    assert [name for name, tolerance in REFERENCE_TOLERANCES.items() if tolerance.infinities] == ["san_att_scores"]
    assert "-inf" in stated["note"]
