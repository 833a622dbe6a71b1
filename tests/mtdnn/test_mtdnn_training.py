"""MT-DNN training: the GLUE metrics, GLUE TSV and original JSON-lines data, the original's task-mixing sampler, the
multi-task Trainer (per-task losses and metrics, best checkpoint, resume), distillation, LoRA, `hf-ext mtdnn` and a
2-process run. Models are tiny and sized unlike the fixture's on purpose; the fixture's task definitions, data and
recorded outputs of the original code are read in place."""

import copy
import csv
import json
import math
import random

import numpy as np
import pytest
import scipy.stats
import sklearn.metrics
import torch
from conftest import PROCESS_TIMEOUT, REPO_ROOT, run_torchrun, torchrun_cli
from fsdp2_training import TOLERANCE, fsdp2_and_ddp_command_runs, fsdp2_and_ddp_runs
from huggingface_hub import ModelCard
from safetensors.torch import load_file
from torch.nn import functional as F
from transformers import (
    AutoModel,
    BertConfig,
    BertModel,
    BertTokenizer,
    TrainingArguments,
)

import hf_ext  # noqa: F401  (registers the Auto classes)
from hf_ext.cli import main
from hf_ext.errors import HfExtError
from hf_ext.lora import add_lora, load_lora
from hf_ext.metrics import load_metric, metric_path
from hf_ext.models.mtdnn import MTDNNModel
from hf_ext.models.mtdnn.data import (
    MTDNNCollator,
    MultiTaskBatchSampler,
    load_glue_tsv,
    load_mtdnn_json,
    mixed_task_order,
)
from hf_ext.models.mtdnn.distillation import add_soft_labels, distillation_loss, teacher_soft_labels
from hf_ext.models.mtdnn.modeling_mtdnn import MTDNNOutput
from hf_ext.models.mtdnn.task_defs import config_from_task_def_yaml
from hf_ext.models.mtdnn.training import MTDNNTrainer
from hf_ext.sample_text import train_bert_vocab

pytestmark = pytest.mark.slow

FIXTURE = REPO_ROOT / "tests/fixtures/mtdnn/tiny"
GLUE = REPO_ROOT / "tests/data/glue_samples"
TASKS = ["mnli", "cola", "qnnli", "stsb"]  # another order than the fixture's
TASK_DEF_EXTRA = """
mrpc:
  data_format: PremiseAndOneHypothesis
  enable_san: false
  metric_meta: [ACC, F1]
  n_class: 2
  task_type: Classification
nli:
  data_format: PremiseAndOneHypothesis
  enable_san: true
  labels: [entailment, neutral, contradiction]
  metric_meta: [ACC]
  n_class: 3
  task_type: Classification
"""




def tiny_config(tasks=TASKS, vocab_size=99, task_def=None):
    encoder = BertConfig(vocab_size=vocab_size, hidden_size=24, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=40, max_position_embeddings=64)
    text = task_def or (FIXTURE / "task_def.yml").read_text() + TASK_DEF_EXTRA
    return config_from_task_def_yaml(text, encoder, task_names=tasks, san={"num_turns": 2})


def tiny_model(seed=0, **kwargs):
    torch.manual_seed(seed)
    return MTDNNModel(tiny_config(**kwargs))


@pytest.fixture(scope="module")
def config():
    return tiny_config()


@pytest.fixture(scope="module")
def json_data(config):
    return {task: load_mtdnn_json(FIXTURE / "data" / f"{task}_dev.json", config, task) for task in TASKS}


def training_args(path, **changes):
    return TrainingArguments(**{"output_dir": str(path), "per_device_train_batch_size": 2, "learning_rate": 3e-3,
                                "logging_steps": 1, "save_strategy": "no", "report_to": [], "disable_tqdm": True,
                                "use_cpu": True, "seed": 0, **changes})


def logged_tasks(log_history):
    """The task of every logged training step (logging_steps=1: each entry names one `loss_<task>`)."""
    tasks = [[key[5:] for key in entry if key.startswith("loss_")] for entry in log_history if "loss" in entry]
    assert all(len(names) == 1 for names in tasks)
    return [names[0] for names in tasks]


def predict(model, dataset, task):
    model.eval()
    batch = MTDNNCollator()([dataset[i] for i in range(len(dataset))])
    batch.pop("soft_labels", None)
    batch.pop("task")  # a student's task id, the name below works for teachers too
    labels = batch.pop("labels")
    with torch.no_grad():
        return model(**batch, task=task), labels


# ----- metrics ------------------------------------------------------------------------------------------------------

def test_glue_metric_matches_scikit_learn_and_scipy():
    rng = np.random.default_rng(0)
    binary = load_metric("glue", config_name="mrpc")
    predictions, references = rng.integers(0, 2, 40), rng.integers(0, 2, 40)
    assert binary.compute(predictions=predictions, references=references) == pytest.approx({
        "accuracy": sklearn.metrics.accuracy_score(references, predictions),
        "f1": sklearn.metrics.f1_score(references, predictions)})
    # multi-class Matthews correlation, by the original's metric name
    predictions, references = rng.integers(0, 3, 50), rng.integers(0, 3, 50)
    assert load_metric("glue", config_name="classification").compute(
        predictions=predictions, references=references, metrics=["MCC", "ACC"]) == pytest.approx({
            "matthews_correlation": sklearn.metrics.matthews_corrcoef(references, predictions),
            "accuracy": sklearn.metrics.accuracy_score(references, predictions)})
    # scores with ties: Spearman uses average ranks
    scores, gold = rng.integers(0, 6, 30) / 2, rng.normal(size=30)
    assert load_metric("glue", config_name="stsb").compute(predictions=scores, references=gold) == pytest.approx({
        "pearson": scipy.stats.pearsonr(gold, scores)[0], "spearmanr": scipy.stats.spearmanr(gold, scores)[0]})
    cola = load_metric("glue", config_name="cola").compute(predictions=[1, 1, 1], references=[1, 0, 1])
    assert cola == {"accuracy": pytest.approx(2 / 3), "matthews_correlation": 0.0}  # constant predictions
    with pytest.raises(ValueError, match="unknown GLUE metric"):
        binary.compute(predictions=[1], references=[1], metrics=["BLEU"])
    with pytest.raises(KeyError, match="unknown GLUE metric config"):
        load_metric("glue", config_name="squad")


def test_glue_metric_loads_by_path_and_reproduces_the_originals_scores():
    """The original's dev scores (original_eval/*.json, percentages) from its predictions and the data's labels."""
    import evaluate

    for task, config_name in (("cola", "cola"), ("mnli", "mnli"), ("stsb", "stsb")):
        original = json.loads((FIXTURE / "original_eval" / f"{task}_dev_scores_epoch_0.json").read_text())
        rows = [json.loads(line) for line in (FIXTURE / "data" / f"{task}_dev.json").read_text().splitlines()]
        predictions = original["scores"] if config_name == "stsb" else original["predictions"]
        metric = evaluate.load(metric_path("glue"), config_name, keep_in_memory=True)
        ours = metric.compute(predictions=predictions, references=[row["label"] for row in rows])
        names = {"ACC": "accuracy", "MCC": "matthews_correlation", "Pearson": "pearson", "Spearman": "spearmanr"}
        assert {name: ours[names[name]] * 100 for name in original["metrics"]} == pytest.approx(original["metrics"])


# ----- data ---------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    texts = [field for path in GLUE.glob("*/*.tsv") for line in path.read_text(encoding="utf-8-sig").splitlines()
             for field in line.split("\t")]
    return BertTokenizer(vocab=str(train_bert_vocab(texts, tmp_path_factory.mktemp("vocab"), vocab_size=400)))


@pytest.fixture(scope="module")
def glue_config(tokenizer):
    return tiny_config(["cola", "sst", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte", "wnli", "nli"],
                       vocab_size=len(tokenizer), task_def=(FIXTURE / "task_def.yml").read_text() + GLUE_TASK_DEFS)


GLUE_TASK_DEFS = TASK_DEF_EXTRA + "".join(f"""
{name}:
  data_format: {'PremiseOnly' if name == 'sst' else 'PremiseAndOneHypothesis'}
  metric_meta: [ACC]
  n_class: 2
  task_type: Classification
""" + ("  labels: [not_entailment, entailment]\n" if name in ("qnli", "rte") else "")
    for name in ("sst", "qqp", "qnli", "rte", "wnli"))

# (folder, file, task, layout, premise column, hypothesis column, label column): read with the csv module here
GLUE_FILES = [
    ("CoLA", "train.tsv", "cola", None, 3, None, 1),  # no header
    ("CoLA", "test.tsv", "cola", None, "sentence", None, None),  # a header, no labels
    ("SST-2", "dev.tsv", "sst", None, "sentence", None, "label"),
    ("MRPC", "train.tsv", "mrpc", None, "#1 String", "#2 String", "Quality"),  # starts with a byte-order mark
    ("STS-B", "dev.tsv", "stsb", None, "sentence1", "sentence2", "score"),
    ("QQP", "train.tsv", "qqp", None, "question1", "question2", "is_duplicate"),
    ("MNLI", "dev_matched.tsv", "mnli", None, "sentence1", "sentence2", "gold_label"),
    ("MNLI", "dev_mismatched.tsv", "nli", "mnli", "sentence1", "sentence2", "gold_label"),  # other label order
    ("MNLI", "test_mismatched.tsv", "mnli", None, "sentence1", "sentence2", None),
    ("QNLI", "dev.tsv", "qnli", None, "question", "sentence", "label"),
    ("RTE", "train.tsv", "rte", None, "sentence1", "sentence2", "label"),
    ("WNLI", "test.tsv", "wnli", None, "sentence1", "sentence2", None),
]


def read_tsv(path, header):
    with open(path, encoding="utf-8-sig", newline="") as handle:
        rows = list(csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))
    if not header:
        return [dict(enumerate(row)) for row in rows]
    return [dict(zip(rows[0], row, strict=True)) for row in rows[1:]]


@pytest.mark.parametrize("folder,name,task,layout,premise,hypothesis,label", GLUE_FILES,
                         ids=[f"{f}/{n}" for f, n, *_ in GLUE_FILES])
def test_glue_tsv_files_load_in_each_tasks_layout(glue_config, tokenizer, folder, name, task, layout, premise,
                                                  hypothesis, label):
    rows = read_tsv(GLUE / folder / name, header=isinstance(premise, str))
    dataset = load_glue_tsv(GLUE / folder / name, glue_config, task, tokenizer, max_length=32, layout=layout)
    spec = glue_config.task(task)
    assert len(dataset) == len(rows) and set(dataset["task"]) == {glue_config.task_index(task)}
    for row, example in zip(rows, dataset, strict=True):
        encoded = tokenizer(row[premise], row[hypothesis] if hypothesis else None, truncation=True, max_length=32)
        assert example["input_ids"] == encoded["input_ids"]
        assert example["token_type_ids"] == encoded["token_type_ids"]
        if label is None:
            assert "labels" not in example
        elif spec["type"] == "regression":
            assert example["labels"] == pytest.approx(float(row[label]))
        elif spec.get("labels"):
            assert spec["labels"][example["labels"]] == row[label]
        else:
            assert example["labels"] == int(row[label])


def test_bad_glue_files_are_refused_with_one_line(glue_config, tokenizer, tmp_path):
    def refused(text, task, message, layout=None):
        path = tmp_path / "bad.tsv"
        path.write_text(text, encoding="utf-8")
        with pytest.raises(HfExtError, match=message) as error:
            load_glue_tsv(path, glue_config, task, tokenizer, layout=layout)
        assert "\n" not in str(error.value)

    mnli_header = (GLUE / "MNLI" / "dev_matched.tsv").read_text().splitlines()[0]
    refused("a\tb\n", "qnli", "not a GLUE qnli TSV file")
    refused("index\tquestion\tsentence\tlabel\n0\tq\ts\n", "qnli", "line 2: 3 tab-separated fields")
    refused("index\tquestion\tsentence\tlabel\n0\tq\ts\tmaybe\n", "qnli", "label 'maybe' is not one of")
    refused("index\tsentence1\tsentence2\tscore\n0\ta\tb\thigh\n", "stsb", "score 'high' is not a number",
            layout="sts-b")
    refused(mnli_header + "\n", "stsb", "regression task but the GLUE layout mnli holds classes", layout="mnli")
    refused("sentence\tlabel\nx\t1\n", "mrpc", "holds single sentences", layout="sst2")
    refused(mnli_header + "\n", "rte", "task rte has 2 classes but the GLUE layout mnli has 3", layout="mnli")
    refused("", "cola", "is empty")
    with pytest.raises(HfExtError, match="no GLUE TSV layout named 'squad'"):
        load_glue_tsv(GLUE / "QNLI" / "dev.tsv", glue_config, "qnli", tokenizer, layout="squad")
    with pytest.raises(HfExtError, match="unknown task 'boolq'"):
        load_glue_tsv(GLUE / "QNLI" / "dev.tsv", glue_config, "boolq", tokenizer)
    with pytest.raises(HfExtError, match="does not exist"):
        load_glue_tsv(tmp_path / "missing.tsv", glue_config, "qnli", tokenizer)
    with pytest.raises(HfExtError, match="no pair of rows with one question and one positive and one negative"):
        load_glue_tsv(GLUE / "QNLI" / "dev.tsv", tiny_config(), "qnnli", tokenizer)
    with pytest.raises(HfExtError, match="ranking task qnnli reads GLUE TSV rows as the original's QNLI ranking"):
        load_glue_tsv(GLUE / "QNLI" / "dev.tsv", tiny_config(), "qnnli", tokenizer, layout="stsb")


def test_qnli_tsv_reads_as_ranking_pairs_like_the_original(tokenizer, tmp_path):
    """QNLI rows 2i and 2i+1 with one question, one entailed and one not, become a ranking group whose label is the
    positive candidate's index (the order shuffled); other pairs are skipped, as the original's `load_qnnli`."""
    config = tiny_config(vocab_size=len(tokenizer))
    rows = [("what is red?", "the apple is red.", "entailment"), ("what is red?", "the sky is blue.", "not_entailment"),
            ("who runs?", "a dog runs.", "entailment"), ("who sleeps?", "a cat sleeps.", "entailment"),  # 2 questions
            ("where?", "here.", "entailment"), ("where?", "there.", "entailment"),  # no negative
            ("why not?", "no reason.", "not_entailment"), ("why not?", "because.", "entailment")]
    path = tmp_path / "qnli.tsv"
    path.write_text("index\tquestion\tsentence\tlabel\n" + "".join(
        f"{i}\t{q}\t{s}\t{label}\n" for i, (q, s, label) in enumerate(rows)), encoding="utf-8")
    dataset = load_glue_tsv(path, config, "qnnli", tokenizer, max_length=32)
    assert len(dataset) == 2 and set(dataset["task"]) == {config.task_index("qnnli")}
    for group, pair in zip(dataset, ([rows[0], rows[1]], [rows[7], rows[6]]), strict=True):
        encoded = [tokenizer(q, s, truncation=True, max_length=32)["input_ids"] for q, s, _ in pair]
        assert sorted(group["input_ids"]) == sorted(encoded)
        assert group["input_ids"][group["labels"]] == encoded[0]  # the entailed sentence is the positive
    test_rows = path.read_text().replace("\tentailment\n", "\n").replace("\tnot_entailment\n", "\n")
    path.write_text(test_rows.replace("\tlabel\n", "\n"), encoding="utf-8")
    unlabelled = load_glue_tsv(path, config, "qnnli", tokenizer, max_length=32)
    assert "labels" not in unlabelled.column_names and len(unlabelled) == 3  # pairs with one question, file order
    batch = MTDNNCollator()([dataset[0], dataset[1]])
    assert batch["input_ids"].shape[0] == 4 and batch["labels"].tolist() == dataset["labels"]
    output = tiny_model(vocab_size=len(tokenizer))(**batch)
    assert output.group_logits.shape == (2, 2) and torch.isfinite(output.loss)


def test_adamax_is_the_originals_optimizer_under_the_trainers_schedule(json_data, tmp_path):
    args = training_args(tmp_path, learning_rate=5e-3, max_steps=4, warmup_steps=0.25, adam_epsilon=1e-7)
    trainer = MTDNNTrainer(model=tiny_model(), args=args, train_dataset=json_data, optimizer_name="adamax")
    trainer.train()
    optimizer = trainer.optimizer.optimizer if hasattr(trainer.optimizer, "optimizer") else trainer.optimizer
    assert isinstance(optimizer, torch.optim.Adamax)
    assert optimizer.defaults["lr"] == 5e-3 and optimizer.defaults["eps"] == 1e-7
    rates = [entry["learning_rate"] for entry in trainer.state.log_history if "learning_rate" in entry]
    assert rates == pytest.approx([0.0, 5e-3, 5e-3 * 2 / 3, 5e-3 / 3])  # warm-up of one step, then linear decay
    with pytest.raises(ValueError, match="optimizer_name must be one of adamw, adamax"):
        MTDNNTrainer(model=tiny_model(), args=args, train_dataset=json_data, optimizer_name="sgd")


def test_json_lines_collate_as_the_originals_collater(config, json_data):
    """Batches of the fixture's preprocessed rows equal the original Collater's tensors (reference.safetensors)."""
    reference = load_file(FIXTURE / "reference.safetensors")
    for task, dataset in json_data.items():
        batch = MTDNNCollator()([dataset[i] for i in range(len(dataset))])
        for name in ("input_ids", "token_type_ids", "attention_mask"):
            assert torch.equal(batch[name], reference[f"{task}.{name}"]), (task, name)
        labels = reference[f"{task}.labels"]
        if task == "qnnli":  # the original repeats the group's label on each of its rows
            labels = labels.view(-1, config.task(task)["group_size"])[:, 0]
        assert torch.equal(batch["labels"], labels.to(batch["labels"].dtype))
        assert batch["task"].tolist() == [config.task_index(task)] * len(dataset)


def test_json_lines_soft_labels_and_bad_rows(config, tmp_path):
    row = {"uid": "x", "label": 2, "token_id": [2, 5, 3, 7, 3], "type_id": [0, 0, 0, 1, 1]}
    path = tmp_path / "nli.json"
    path.write_text(json.dumps({**row, "softlabel": [0.25, 0.25, 0.5]}) + "\n\n"
                    + json.dumps({**row, "token_id": [2] + [5] * 10 + [3], "type_id": [0] * 6 + [1] * 6,
                                  "softlabel": [0.5, 0.5, 0]}) + "\n")
    dataset = load_mtdnn_json(path, config, "mnli")
    assert dataset["soft_labels"] == [[0.25, 0.25, 0.5], [0.5, 0.5, 0.0]]
    assert dataset["attention_mask"][0] == [1] * 5
    assert len(load_mtdnn_json(path, config, "mnli", max_length=8)) == 1  # longer rows dropped, as in training

    def refused(rows, task, message):
        path.write_text("\n".join(rows) + "\n")
        with pytest.raises(HfExtError, match=message):
            load_mtdnn_json(path, config, task)

    refused(["{not json"], "mnli", "line 1: not JSON")
    refused([json.dumps({**row, "label": 3})], "mnli", "label 3 is not a class id below 3")
    refused([json.dumps({**row, "token_id": [2, 500, 3, 7, 3]})], "mnli", "outside the model's vocabulary of 99")
    refused([json.dumps({**row, "type_id": [0, 0]})], "mnli", "equally long lists")
    refused([json.dumps(row), json.dumps({k: v for k, v in row.items() if k != "label"})], "mnli",
            "some rows have a label and some do not")
    refused([json.dumps({**row, "softlabel": [1.0]})], "mnli", "softlabel must be a list of 3 numbers")
    refused([json.dumps({**row, "label": 0})], "qnnli", "needs 2 candidate token lists")
    refused([json.dumps({**row, "label": 0})], "cola", "a sentence pair where task cola reads PremiseOnly rows")
    refused([json.dumps({**row, "type_id": [0] * 5})], "mnli", "a single sentence where task mnli reads")


# ----- the original's task mixing ---------------------------------------------------------------------------------

def test_task_order_reproduces_the_original_sampler():
    reference = json.loads((FIXTURE / "reference.json").read_text())
    for case in reference["sampler_reference"]:
        seed = int(case["seed"].split("(")[1].split(")")[0])
        order = mixed_task_order(case["batches_per_task"], case["mix_opt"], case["ratio"], random.Random(seed),
                                 np.random.RandomState(seed))
        assert order == case["task_order"], case
    # the original train.py run: the sampler is built (shuffling each task's chunks) after seeding, then iterated
    run = reference["training_run"]
    sizes = [5, 8, 7, 6]  # two chunks of the batch size 4 each, as the fixture's run had
    assert MultiTaskBatchSampler(sizes, 4, seed=2018).task_order(0) == run["batch_task_order"]


@pytest.mark.parametrize("mix_opt,ratio", [(0, 0.0), (1, 0.0), (0, 0.5), (1, 0.5)])
def test_sampler_batches_one_task_each_and_replays_any_epoch(mix_opt, ratio):
    sizes, batch_size = [7, 3, 5], 2
    sampler = MultiTaskBatchSampler(sizes, batch_size, mix_opt, ratio, seed=11)
    offsets = np.cumsum([0] + sizes)
    epochs = []
    for epoch in range(3):
        sampler.set_epoch(epoch)
        batches = list(sampler)
        assert len(batches) == len(sampler)
        tasks = [int(np.searchsorted(offsets, batch[0], side="right") - 1) for batch in batches]
        for task, batch in zip(tasks, batches, strict=True):
            assert offsets[task] <= min(batch) and max(batch) < offsets[task + 1]  # one task
            assert batch == list(range(batch[0], batch[0] + len(batch)))  # a contiguous chunk
        main = sorted(i for batch, task in zip(batches, tasks, strict=True) if task == 0 for i in batch)
        assert main == list(range(sizes[0]))  # every main-task row, once
        extra = sum(task != 0 for task in tasks)
        assert extra == (int(min(4 * ratio, 5)) if ratio else 5)  # 4 main-task and 2 + 3 = 5 other chunks
        if mix_opt == 1:
            assert tasks[-4:] == [0] * 4
        epochs.append(batches)
    assert epochs[0] != epochs[1] or epochs[1] != epochs[2]
    fresh = MultiTaskBatchSampler(sizes, batch_size, mix_opt, ratio, seed=11)
    fresh.set_epoch(2)  # straight to epoch 2: the same batches as after epochs 0 and 1
    assert list(fresh) == epochs[2]
    # two processes split every batch (padded with its first row) and train the same task at each step
    halves = [list(MultiTaskBatchSampler(sizes, batch_size * 2, mix_opt, ratio, seed=11, rank=r, world_size=2))
              for r in (0, 1)]
    whole = list(MultiTaskBatchSampler(sizes, batch_size * 2, mix_opt, ratio, seed=11))
    assert [a + b for a, b in zip(*halves, strict=True)] == [batch + batch[:1] * (len(batch) % 2) for batch in whole]


# ----- Trainer ------------------------------------------------------------------------------------------------------

def test_multi_task_training_logs_task_losses_evaluates_each_task_and_keeps_the_best(config, json_data, tmp_path):
    model = tiny_model(seed=1)
    args = training_args(tmp_path, num_train_epochs=4, eval_strategy="epoch", save_strategy="epoch",
                         load_best_model_at_end=True, metric_for_best_model="stsb_pearson", seed=7)
    trainer = MTDNNTrainer(model=model, args=args, train_dataset=json_data, eval_dataset=json_data, mix_opt=1)
    trainer.train()
    history = trainer.state.log_history
    # one task per step, in the sampler's order (batches of 2 over the tasks' rows, seeded by args.seed)
    sampler = MultiTaskBatchSampler([len(d) for d in json_data.values()], 2, mix_opt=1, seed=7)
    expected = [TASKS[i] for epoch in range(4) for i in sampler.task_order(epoch)]
    assert logged_tasks(history) == expected
    for entry in (e for e in history if "loss" in e):
        assert entry[f"loss_{expected.pop(0)}"] == pytest.approx(entry["loss"])
    by_step = {}  # each task's evaluation is its own log entry
    for entry in history:
        if any(key.startswith("eval_") for key in entry):
            by_step.setdefault(entry["step"], {}).update(entry)
    evaluations = [by_step[step] for step in sorted(by_step)]
    assert len(evaluations) == 4 and all(f"eval_{task}_loss" in e for e in evaluations for task in TASKS)
    for task in TASKS:  # every task's evaluation loss fell
        assert evaluations[-1][f"eval_{task}_loss"] < evaluations[0][f"eval_{task}_loss"], task
    # the best checkpoint is the one with the highest stsb Pearson, and it is the model kept
    best = max(evaluations, key=lambda e: e["eval_stsb_pearson"])
    assert trainer.state.best_metric == pytest.approx(best["eval_stsb_pearson"])
    assert trainer.state.best_model_checkpoint.endswith(f"checkpoint-{best['step']}")
    final = trainer.evaluate()
    assert final["eval_stsb_pearson"] == pytest.approx(best["eval_stsb_pearson"])
    # each task's metrics are those of the model's predictions, by scikit-learn and scipy
    for task, dataset in json_data.items():
        output, labels = predict(model, dataset, task)
        if task == "stsb":
            scores = output.logits[:, 0].numpy()
            assert final["eval_stsb_spearmanr"] == pytest.approx(scipy.stats.spearmanr(labels, scores)[0])
            assert final["eval_stsb_pearson"] == pytest.approx(scipy.stats.pearsonr(labels, scores)[0], abs=1e-6)
            continue
        predicted = (output.group_logits if task == "qnnli" else output.logits).argmax(-1)
        assert final[f"eval_{task}_accuracy"] == pytest.approx(sklearn.metrics.accuracy_score(labels, predicted))
        if task == "cola":
            assert final["eval_cola_matthews_correlation"] == pytest.approx(
                sklearn.metrics.matthews_corrcoef(labels, predicted))
    with pytest.raises(ValueError, match="ddp_find_unused_parameters=True"):
        MTDNNTrainer(model=model, args=training_args(tmp_path, ddp_find_unused_parameters=False),
                     train_dataset=json_data)


def test_resume_from_a_mid_run_checkpoint_continues_the_same_order(json_data, tmp_path):
    def run(out, resume=None):
        model = tiny_model(seed=2)
        args = training_args(out, num_train_epochs=3, save_strategy="steps", save_steps=8, seed=4)
        trainer = MTDNNTrainer(model=model, args=args, train_dataset=json_data, mix_opt=0, ratio=0.8)
        trainer.train(resume_from_checkpoint=resume)
        return model, trainer.state.log_history

    full_model, full_history = run(tmp_path / "full")
    # per epoch the 3 main-task (mnli) batches and int(3 * 0.8) = 2 others: step 8 is in the second epoch
    resumed_model, resumed_history = run(tmp_path / "resumed", resume=tmp_path / "full" / "checkpoint-8")
    assert logged_tasks(resumed_history) == logged_tasks(full_history)
    assert len(logged_tasks(full_history)) == 15
    full_losses = [e["loss"] for e in full_history if "loss" in e]
    assert [e["loss"] for e in resumed_history if "loss" in e] == full_losses
    for (name, full), resumed in zip(full_model.state_dict().items(), resumed_model.state_dict().values(), strict=True):
        assert torch.equal(full, resumed), name


# ----- distillation -----------------------------------------------------------------------------------------------

def test_distillation_terms_match_the_original_criterion_and_the_papers():
    """MSE: the original's MseCriterion values recorded by the fixture; soft CE: -sum p log q."""
    reference = load_file(FIXTURE / "reference.safetensors")
    config = tiny_config(tasks=["cola", "mnli"])
    for task in ("cola", "mnli"):
        logits, soft = reference[f"{task}.logits"], reference[f"{task}.kd_soft_labels"]
        outputs = MTDNNOutput(logits=logits)
        assert distillation_loss(config.task(task), outputs, soft, "mse").item() == pytest.approx(
            reference[f"{task}.kd_loss"].item(), rel=1e-5)
        expected = -(soft * F.log_softmax(logits, -1)).sum(-1).mean()
        assert distillation_loss(config.task(task), outputs, soft).item() == pytest.approx(expected.item())


def test_teacher_soft_labels_are_the_mean_of_the_teachers_distributions(json_data):
    teachers = [tiny_model(seed=s).eval() for s in (3, 4)]
    for teacher in teachers:  # distinct, peaked distributions
        for parameter in teacher.heads.parameters():
            parameter.data.normal_(0, 0.5)
    for task, dataset in json_data.items():
        outputs = [predict(teacher, dataset, task)[0] for teacher in teachers]
        if task == "stsb":
            expected = sum(o.logits for o in outputs) / 2
        else:
            expected = sum(F.softmax(o.group_logits if task == "qnnli" else o.logits, -1) for o in outputs) / 2
        soft = torch.tensor(teacher_soft_labels(teachers, dataset, task, batch_size=2))
        assert torch.allclose(soft, expected, atol=1e-6), task
    with pytest.raises(HfExtError, match="teacher 2: unknown task 'stsb'"):
        teacher_soft_labels([teachers[0], tiny_model(tasks=["mnli"])], json_data["stsb"], "stsb")


def test_distillation_moves_the_student_toward_the_teachers(json_data, tmp_path):
    data = {task: json_data[task] for task in ("mnli", "cola")}
    # an ensemble of two teachers whose confident distributions differ from the hard labels
    first = tiny_model(seed=5, tasks=list(data))
    for parameter in first.heads.parameters():
        parameter.data.normal_(0, 0.5)
    second = copy.deepcopy(first)
    for parameter in second.parameters():
        parameter.data.add_(0.05 * torch.randn_like(parameter))
    distilled = {task: add_soft_labels(dataset, [first.eval(), second.eval()], task) for task, dataset in data.items()}

    def divergence(student):
        """KL(teacher mean || student) per task."""
        result = {}
        for task, dataset in distilled.items():
            output = predict(student, dataset, task)[0]
            target = torch.tensor(dataset["soft_labels"])
            result[task] = F.kl_div(F.log_softmax(output.logits, -1), target, reduction="batchmean").item()
        return result

    def student(datasets, **kwargs):
        model = tiny_model(seed=9, tasks=list(data))
        args = training_args(tmp_path, num_train_epochs=4, per_device_train_batch_size=4, logging_steps=50)
        MTDNNTrainer(model=model, args=args, train_dataset=datasets, **kwargs).train()
        return divergence(model)

    before = divergence(tiny_model(seed=9, tasks=list(data)))
    hard = student(data)
    hard_and_soft = student(distilled)
    soft = student({task: dataset.remove_columns("labels") for task, dataset in distilled.items()})
    hard_and_mse = student(distilled, kd_loss="mse")
    for task in data:
        assert soft[task] < hard_and_soft[task] < min(before[task], hard[task]), task
        assert hard_and_mse[task] < hard[task], task


# ----- LoRA -------------------------------------------------------------------------------------------------------

def test_lora_on_the_encoder_trains_the_heads_and_reloads_identically(json_data, tmp_path):
    base = tiny_model(seed=8)
    base.save_pretrained(tmp_path / "base")
    frozen = {name: tensor.clone() for name, tensor in base.bert.state_dict().items()}
    model = add_lora(base, r=4)
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in name or ".heads." in name for name in trainable)
    assert {name.split(".heads.")[1].split(".")[0] for name in trainable if ".heads." in name} == set(TASKS)
    MTDNNTrainer(model=model, args=training_args(tmp_path / "run", num_train_epochs=2),
                 train_dataset=json_data).train()
    encoder = {name.replace(".base_layer", ""): tensor for name, tensor in
               model.get_base_model().bert.state_dict().items() if "lora_" not in name}
    assert encoder.keys() == frozen.keys()
    for name, tensor in frozen.items():  # the base encoder is untouched
        assert torch.equal(encoder[name], tensor), name
    model.save_pretrained(tmp_path / "adapter")
    saved = load_file(tmp_path / "adapter" / "adapter_model.safetensors")
    assert any(".heads.mnli.rnn." in key for key in saved) and any(".heads.qnnli.out_proj." in key for key in saved)
    reloaded = load_lora(MTDNNModel.from_pretrained(tmp_path / "base"), tmp_path / "adapter")
    untrained = MTDNNModel.from_pretrained(tmp_path / "base")
    for task, dataset in json_data.items():
        ours, theirs = predict(model, dataset, task)[0].logits, predict(reloaded, dataset, task)[0].logits
        assert torch.equal(ours, theirs), task
        assert not torch.allclose(ours, predict(untrained, dataset, task)[0].logits), task


# ----- hf-ext mtdnn -----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def bert_dir(tokenizer, tmp_path_factory):
    folder = tmp_path_factory.mktemp("bert") / "bert"
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=len(tokenizer), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=24, max_position_embeddings=64)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    task_def = folder.parent / "task_def.yml"
    task_def.write_text((FIXTURE / "task_def.yml").read_text() + TASK_DEF_EXTRA)
    return folder


def test_cli_trains_on_glue_files_from_a_bert_model_and_distils(bert_dir, tmp_path, capsys):
    out = tmp_path / "model"
    assert main(["mtdnn", "train", str(bert_dir), "--task-def", str(bert_dir.parent / "task_def.yml"),
                 "--train", f"mnli={GLUE}/MNLI/train.tsv", "--train", f"cola={GLUE}/CoLA/train.tsv",
                 "--train", f"stsb={GLUE}/STS-B/train.tsv", "--train", f"mrpc={GLUE}/MRPC/train.tsv",
                 "--eval", f"mnli:matched={GLUE}/MNLI/dev_matched.tsv",
                 "--eval", f"mnli:mismatched={GLUE}/MNLI/dev_mismatched.tsv", "--eval", f"mrpc={GLUE}/MRPC/dev.tsv",
                 "--output-dir", str(out), "--epochs", "3", "--batch-size", "2", "--learning-rate", "1e-3",
                 "--metric-for-best-model", "mnli_mismatched_loss", "--logging-steps", "1"]) == 0
    summary = json.loads(capsys.readouterr().out)
    model = AutoModel.from_pretrained(out)
    assert model.config.task_names == ["mnli", "cola", "stsb", "mrpc"] and model.config.task("mnli")["head"] == "san"
    history = json.loads((out / "log_history.json").read_text())
    losses = [e["eval_mnli_mismatched_loss"] for e in history if "eval_mnli_mismatched_loss" in e]
    assert summary["best_metric"] == pytest.approx(min(losses[:-1]))  # the last entry re-evaluates the best
    assert set(summary["eval"]) >= {"eval_mnli_matched_accuracy", "eval_mrpc_accuracy", "eval_mrpc_f1"}
    # the card records the final evaluation: model-index, and the Hub's files for GLUE's tasks
    card = ModelCard.load(out / "README.md")
    recorded = {(r.dataset_config, r.dataset_split, r.metric_type): r.metric_value for r in card.data.eval_results}
    assert recorded == {("mnli", "matched", "accuracy"): summary["eval"]["eval_mnli_matched_accuracy"],
                        ("mnli", "mismatched", "accuracy"): summary["eval"]["eval_mnli_mismatched_accuracy"],
                        ("mrpc", None, "accuracy"): summary["eval"]["eval_mrpc_accuracy"],
                        ("mrpc", None, "f1"): summary["eval"]["eval_mrpc_f1"]}
    assert sorted(path.name for path in (out / ".eval_results").iterdir()) == ["mnli.yaml", "mrpc.yaml"]
    # the saved model is the best one: evaluating it again gives the reported metrics
    tokenizer = BertTokenizer.from_pretrained(out)
    data = load_glue_tsv(GLUE / "MNLI" / "dev_mismatched.tsv", model.config, "mnli", tokenizer)
    assert MTDNNTrainer(model=model, args=training_args(tmp_path / "eval")).evaluate(
        {"mm": data})["eval_mm_loss"] == pytest.approx(summary["best_metric"], rel=1e-5)

    # distil that model into a LoRA student on the original's preprocessed rows
    capsys.readouterr()  # the evaluation above printed its logs
    student = tmp_path / "student"
    assert main(["mtdnn", "distill", str(out), "--teacher", str(out), "--teacher", str(out),
                 "--train", f"mnli={FIXTURE}/data/mnli_dev.json", "--output-dir", str(student),
                 "--max-steps", "2", "--lora-r", "2", "--seed", "1"]) == 0
    assert json.loads(capsys.readouterr().out)["steps"] == 2
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {p.name for p in student.iterdir()}


@pytest.mark.parametrize("extra,message", [
    (["--train", "mnli"], "--train takes KEY=VALUE"),
    (["--train", "boolq=x.json"], "unknown task 'boolq'"),
    (["--train", "mnli=missing.json"], "does not exist"),
    (["--eval", "mnli=data/mnli_dev.json", "--metric-for-best-model", "mnli_f1"],
     "--metric-for-best-model mnli_f1 is not an evaluation metric of this run (mnli_loss, mnli_accuracy)"),
    (["--metric-for-best-model", "mnli_loss"], "need --eval data"),
    (["--lora-alpha", "4"], "--lora-alpha and --lora-dropout need --lora-r"),
    (["--ratio", "-1"], "argument --ratio: must be >= 0"),
    (["--layout", "cola=cola"], "--layout names task(s) cola without --train or --eval data"),
    (["--task-def", "task_def.yml"], "is an MT-DNN model already: train it without --task-def"),
    (["--train", "stsb=../../data/glue_samples/STS-B/train.tsv"], "text data needs a tokenizer"),
])
def test_cli_bad_arguments_give_one_line_and_write_nothing(saved_mtdnn, tmp_path, capsys, extra, message,
                                                           monkeypatch):
    monkeypatch.chdir(FIXTURE)
    out = tmp_path / "out"
    train = [] if "--train" in extra else ["--train", "mnli=data/mnli_dev.json"]
    try:
        code = main(["mtdnn", "train", str(saved_mtdnn), *train, *extra, "--output-dir", str(out)])
    except SystemExit as usage_error:  # argparse's own checks
        code = usage_error.code
    assert code in (1, 2)
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not out.exists() and not list(tmp_path.iterdir())


@pytest.fixture(scope="module")
def saved_mtdnn(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mtdnn") / "model"
    tiny_model(seed=3).save_pretrained(folder)
    return folder


def test_cli_distill_refuses_a_teacher_without_the_task(saved_mtdnn, tmp_path, capsys):
    other = tmp_path / "teacher"
    tiny_model(tasks=["cola"]).save_pretrained(other)
    out = tmp_path / "out"
    assert main(["mtdnn", "distill", str(saved_mtdnn), "--teacher", str(other), "--train",
                 f"mnli={FIXTURE}/data/mnli_dev.json", "--output-dir", str(out)]) == 1
    assert f"teacher {other} has no task mnli" in capsys.readouterr().err
    assert not out.exists()


# ----- distributed ----------------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_two_process_multi_task_training_with_torchrun(tmp_path):
    ranks, run = run_torchrun("mtdnn/mtdnn_ddp_train.py", FIXTURE / "task_def.yml", FIXTURE / "data", tmp_path)
    assert "unused" not in run.stderr.lower()
    sizes = [len(load_mtdnn_json(FIXTURE / "data" / f"{task}_dev.json", tiny_config(), task)) for task in TASKS]
    # each process gets half of every global batch of 4: the task order of a single process with batches of 4
    sampler = MultiTaskBatchSampler(sizes, 4, seed=3)
    expected = [TASKS[i] for epoch in range(2) for i in sampler.task_order(epoch)]
    for result in ranks:
        assert (result["world_size"], result["global_step"], result["backend"]) == (2, len(expected), "gloo")
        assert result["find_unused_parameters"] is True
        assert math.isfinite(result["train_loss"])
        assert logged_tasks(result["log_history"]) == expected
        assert all(math.isfinite(e["loss"]) for e in result["log_history"] if "loss" in e)
    assert ranks[0]["weights_checksum"] == ranks[1]["weights_checksum"]
    assert ranks[0]["log_history"][:-1] == ranks[1]["log_history"][:-1]  # the final entry holds each rank's timing


@pytest.mark.slow
def test_fsdp2_training_through_accelerate_matches_ddp(tmp_path):
    """`train_mtdnn` (the run of `hf-ext mtdnn train`) under 2 processes over gloo, sharded by accelerate's FSDP2 plan
    with the settings of docs/launch/accelerate_fsdp2_gpu.yaml: a unit per encoder layer, the word embeddings in one
    of their own, the rest (embedding positions and segments, the task heads) in the model's; every parameter sharded,
    each step one task's batch, with the heads of the other tasks unused; the run trains exactly as DDP does on the
    same batches (losses and weights within float rounding)."""
    runs, _ = fsdp2_and_ddp_runs("mtdnn/mtdnn_fsdp2_train.py", FIXTURE / "task_def.yml", FIXTURE / "data",
                                 out=tmp_path)
    fsdp2 = runs["fsdp2"]
    assert fsdp2["units"] == ["", "bert.embeddings.word_embeddings", "bert.encoder.layer.0"]
    assert len(fsdp2["losses"]) == 8 and set(fsdp2["tasks"]) == set(TASKS)
    mnli = [loss for loss, task in zip(fsdp2["losses"], fsdp2["tasks"], strict=True) if task == "mnli"]
    assert len(mnli) > 1 and mnli[-1] < mnli[0]


@pytest.mark.slow
def test_cli_under_fsdp2_saves_the_whole_trained_model_as_ddp_does(saved_mtdnn, tmp_path):
    """`hf-ext mtdnn train` under 2 processes over gloo, sharded by accelerate's FSDP2 plan (tests/fsdp2_command.py):
    both processes exit 0, the main one writes the folder once, its weights whole (gathered from the shards by every
    process) and equal to the same command's under DDP, as is the evaluation after training (a collective)."""
    data = f"{FIXTURE}/data"
    runs = fsdp2_and_ddp_command_runs(["mtdnn", "train", saved_mtdnn, "--train", f"mnli={data}/mnli_dev.json",
                                       "--train", f"stsb={data}/stsb_dev.json", "--eval", f"mnli={data}/mnli_dev.json",
                                       "--max-steps", "4", "--batch-size", "2", "--eval-batch-size", "1",
                                       "--learning-rate", "1e-2", "--device", "cpu"], out=tmp_path)
    fsdp2, ddp = runs["fsdp2"], runs["ddp"]
    assert fsdp2["steps"] == ddp["steps"] == 4
    assert fsdp2["eval"]["eval_mnli_loss"] == pytest.approx(ddp["eval"]["eval_mnli_loss"], rel=TOLERANCE)
    untrained = load_file(saved_mtdnn / "model.safetensors")
    assert fsdp2["weights"].keys() == untrained.keys()
    assert not torch.equal(fsdp2["weights"]["bert.encoder.layer.0.output.dense.weight"],
                           untrained["bert.encoder.layer.0.output.dense.weight"])


@pytest.mark.slow
def test_cli_under_torchrun_writes_its_output_once_from_the_main_process(saved_mtdnn, tmp_path):
    """`hf-ext mtdnn train` under `torchrun --nproc-per-node 2`: both processes end with exit code 0, the evaluation
    (a collective) runs on both, and only the main process writes the output folder, once, with one summary line;
    the saved weights are the ones evaluated (their loss, computed again here, is the one recorded)."""
    out = tmp_path / "out"
    code, stdout, err = torchrun_cli(["mtdnn", "train", saved_mtdnn, "--train", f"mnli={FIXTURE}/data/mnli_dev.json",
                                      "--eval", f"mnli={FIXTURE}/data/mnli_dev.json", "--output-dir", out,
                                      "--max-steps", "3", "--batch-size", "2", "--eval-batch-size", "1",
                                      "--learning-rate", "1e-2", "--device", "cpu"], timeout=PROCESS_TIMEOUT)
    assert code == 0, err[-3000:]
    [summary] = [json.loads(line) for line in stdout.splitlines()]
    assert summary["steps"] == 3 and summary["output_dir"] == str(out)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["out"]  # no other process's staging folder
    model = AutoModel.from_pretrained(out)
    recorded = json.loads((out / "eval_results.json").read_text())["eval_mnli_loss"]
    assert recorded == summary["eval"]["eval_mnli_loss"]
    data = load_mtdnn_json(FIXTURE / "data" / "mnli_dev.json", model.config, "mnli")
    # one row per batch, as the run evaluated: the mean loss does not depend on how the rows were split
    assert MTDNNTrainer(model=model, args=training_args(tmp_path / "eval", per_device_eval_batch_size=1)).evaluate(
        {"mnli": data})["eval_mnli_loss"] == pytest.approx(recorded, rel=1e-5)
    untrained = AutoModel.from_pretrained(saved_mtdnn).state_dict()
    assert any(not torch.equal(weight, untrained[name]) for name, weight in model.state_dict().items())


@pytest.mark.slow
def test_cli_under_torchrun_keeps_the_best_checkpoint_in_every_process(saved_mtdnn, tmp_path, monkeypatch):
    """`hf-ext mtdnn train --metric-for-best-model` under `torchrun --nproc-per-node 2`: a learning rate high enough
    that a later epoch is worse than the best, whose checkpoint every process loads back at the end (all share one
    scratch folder, the main process's), so that the final evaluation, over both processes' rows, is the best
    model's and the saved model's; the scratch folder is gone afterwards."""
    scratch = tmp_path / "tmp"  # the processes' temporary folders
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    out = tmp_path / "out"
    code, stdout, err = torchrun_cli(["mtdnn", "train", saved_mtdnn, "--train", f"mnli={FIXTURE}/data/mnli_dev.json",
                                      "--eval", f"mnli={FIXTURE}/data/mnli_dev.json", "--output-dir", out,
                                      "--epochs", "4", "--batch-size", "2", "--eval-batch-size", "1",
                                      "--learning-rate", "1e-1", "--metric-for-best-model", "mnli_loss",
                                      "--device", "cpu"], timeout=PROCESS_TIMEOUT)
    assert code == 0, err[-3000:]
    [summary] = [json.loads(line) for line in stdout.splitlines()]
    history = json.loads((out / "log_history.json").read_text())
    epochs = [entry["eval_mnli_loss"] for entry in history if "eval_mnli_loss" in entry][:-1]  # then the final one
    assert len(epochs) == 4 and min(epochs) < epochs[-1]  # the best checkpoint is not the last
    assert summary["best_metric"] == min(epochs)
    recorded = json.loads((out / "eval_results.json").read_text())["eval_mnli_loss"]
    assert recorded == summary["eval"]["eval_mnli_loss"] == pytest.approx(min(epochs), rel=1e-5)
    model = AutoModel.from_pretrained(out)
    data = load_mtdnn_json(FIXTURE / "data" / "mnli_dev.json", model.config, "mnli")
    assert MTDNNTrainer(model=model, args=training_args(tmp_path / "eval", per_device_eval_batch_size=1)).evaluate(
        {"mnli": data})["eval_mnli_loss"] == pytest.approx(recorded, rel=1e-5)
    assert not list(scratch.glob("tmp*"))  # tempfile's names (torchrun leaves a folder of its own)
