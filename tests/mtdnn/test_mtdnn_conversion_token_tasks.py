"""`hf-ext convert mtdnn` on a checkpoint with the original's token-level task heads: parity with the original code's
outputs on `tests/fixtures/mtdnn/token_tasks/` (written by the original train.py, see tests/fixtures/README.md) for
every task (SeqenceLabeling with dropout_p > 0 and = 0, i.e. both key layouts, SpanClassification,
SpanClassificationYN, and a Classification task beside them), and refusals of token heads that do not fit their task
definitions. Names, sizes and task types are read from the fixture's reference.json."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from test_mtdnn_conversion import assert_matches, assert_refused, run_cli
from transformers import AutoModel

import hf_ext  # noqa: F401  (registers the Auto classes)
from hf_ext.cli import main
from hf_ext.models.mtdnn import MTDNNModel
from hf_ext.models.mtdnn.conversion import read_checkpoint

TOKEN_TYPES = {"SeqenceLabeling": "sequence_labeling", "SpanClassification": "span_classification",
               "SpanClassificationYN": "span_classification_yn", "Classification": "classification"}


@pytest.fixture(scope="module")
def fixture(fixtures_dir):
    folder = fixtures_dir / "mtdnn" / "token_tasks"
    return folder, load_file(str(folder / "reference.safetensors")), json.loads((folder / "reference.json").read_text())


def convert(capsys, folder, out, *extra):
    code, stdout, err = run_cli(capsys, "convert", "mtdnn", folder / "model_0.pt", out, "--reference",
                                folder / "reference.safetensors", *extra)
    assert code == 0, err
    return stdout


@pytest.fixture(scope="module")
def converted(fixture, tmp_path_factory):
    """The fixture converted with the task definitions stored in the checkpoint, checked against its reference."""
    folder, _, _ = fixture
    out = tmp_path_factory.mktemp("mtdnn_token_tasks") / "converted"
    assert main(["convert", "mtdnn", str(folder / "model_0.pt"), str(out), "--reference",
                 str(folder / "reference.safetensors")]) == 0
    return out


def inputs_of(tensors, name):
    return {key: tensors[f"{name}.{key}"] for key in ("input_ids", "token_type_ids", "attention_mask")}


def test_the_fixture_covers_both_token_head_layouts_and_every_token_task_type(fixture):
    _, tensors, meta = fixture
    tasks = meta["tasks"]
    assert {task["task_type"] for task in tasks} == set(TOKEN_TYPES)
    layouts = {task["name"]: sorted(task["head_state_keys"]) for task in tasks if task["task_type"] != "Classification"}
    assert any(keys[0].endswith(".1.bias") for keys in layouts.values())  # nn.Sequential(Dropout, Linear)
    assert any(keys == [f"scoring_list.{task['task_id']}.bias", f"scoring_list.{task['task_id']}.weight"]
               for task in tasks for keys in [sorted(task["head_state_keys"])])  # a bare nn.Linear (dropout_p 0)
    tags = next(task["labels"] for task in tasks if task["task_type"] == "SeqenceLabeling")
    assert {"X", "CLS", "SEP"} <= set(tags)
    for task in tasks:
        assert (tensors[f"{task['name']}.attention_mask"] == 0).any(), f"{task['name']}: no padded row"


def test_every_task_matches_the_original(fixture, converted):
    _, tensors, meta = fixture
    model = AutoModel.from_pretrained(converted).eval()
    assert isinstance(model, MTDNNModel)
    assert model.config.task_names == [task["name"] for task in meta["tasks"]]
    for task in meta["tasks"]:
        name, kind = task["name"], task["task_type"]
        spec = model.config.task(name)
        assert spec["type"] == TOKEN_TYPES[kind] and spec["num_labels"] == task["n_class"]
        assert spec["dropout"] == task["dropout_p"] and spec["labels"] == task["labels"]
        inputs = inputs_of(tensors, name)
        labels = tensors[f"{name}.labels"]
        if kind == "SeqenceLabeling":
            labels = labels.masked_fill(labels == -1, -100)  # the original's ignore index is -1, transformers' -100
        elif kind != "Classification":
            labels = labels[:, :2]  # start, end (SpanCeCriterion ignores the third, is_impossible)
        with torch.no_grad():
            out = model(**inputs, task=name, labels=labels, output_hidden_states=True)
        assert_matches(torch.stack(out.hidden_states), tensors[f"{name}.all_hidden_states"])
        assert_matches(out.loss.reshape(1), tensors[f"{name}.loss"])
        if kind in ("SpanClassification", "SpanClassificationYN"):
            assert_matches(out.start_logits, tensors[f"{name}.start_logits"])
            assert_matches(out.end_logits, tensors[f"{name}.end_logits"])
            continue
        assert_matches(out.logits, tensors[f"{name}.logits"])
        if kind == "SeqenceLabeling":
            real = inputs["attention_mask"].bool()
            predicted = tensors[f"{name}.predict_labels"]
            assert torch.equal(out.logits.argmax(-1)[real], predicted[real])


def test_yaml_task_definitions_give_the_same_model(fixture, converted, tmp_path, capsys):
    folder, _, _ = fixture
    convert(capsys, folder, tmp_path / "out", "--task-def", folder / "task_def.yml")
    ours = json.loads((tmp_path / "out" / "config.json").read_text())
    stored = json.loads((converted / "config.json").read_text())
    assert ours["tasks"] == stored["tasks"]
    assert load_file(str(tmp_path / "out" / "model.safetensors")).keys() == \
        load_file(str(converted / "model.safetensors")).keys()


def test_the_reference_check_reads_the_token_outputs(fixture, converted, tmp_path, capsys):
    """A converted head that no longer reproduces the original's token outputs fails the conversion (a perturbed
    reference stands for a perturbed head weight: the check compares the two)."""
    folder, tensors, meta = fixture
    for key in ("squad-v2.end_logits", "pos.logits"):
        changed = dict(tensors)
        changed[key] = changed[key].clone()
        changed[key][0, 1] += 1e-3
        save_file(changed, str(tmp_path / "r.safetensors"))
        task, output = key.split(".")
        assert_refused(capsys, tmp_path / "out", folder / "model_0.pt", "--reference", tmp_path / "r.safetensors",
                       message=f"{task} {output}: max abs error")
    card = (converted / "README.md").read_text()
    for task in meta["tasks"]:
        outputs = ("start_logits", "end_logits") if "Span" in task["task_type"] else ("logits",)
        for output in outputs:
            assert f"| {task['name']} {output} |" in card


def fixture_without_task_defs(folder, path, change_state=None):
    """The fixture's checkpoint without its stored task definitions (converted with --task-def)."""
    state, opt = read_checkpoint(folder / "model_0.pt")
    if change_state is not None:
        change_state(state)
    torch.save({"state": state, "config": {k: v for k, v in opt.items() if k != "task_def_list"}}, path)
    return path


def test_token_heads_that_do_not_fit_their_task_definitions_are_refused(fixture, tmp_path, capsys):
    folder, _, meta = fixture
    text = (folder / "task_def.yml").read_text()
    by_type = {task["task_type"]: task for task in meta["tasks"]}
    ner, pos = [task for task in meta["tasks"] if task["task_type"] == "SeqenceLabeling"]
    squad, sst = by_type["SpanClassification"], by_type["Classification"]

    def yaml(*changes):
        changed = text
        for old, new in changes:
            assert old in changed
            changed = changed.replace(old, new, 1)
        path = tmp_path / "t.yml"
        path.write_text(changed)
        return path

    def more_tags(task):  # one more tag in the definition than the head has outputs
        n = task["n_class"]
        return [(f"n_class: {n}\n  task_type: SeqenceLabeling", f"n_class: {n + 1}\n  task_type: SeqenceLabeling"),
                (f"  - {task['labels'][0]}\n", f"  - {task['labels'][0]}\n  - EXTRA\n")]

    # both layouts, both problems on one line
    line = assert_refused(capsys, tmp_path / "out", folder / "model_0.pt", "--task-def",
                          yaml(*more_tags(ner), *more_tags(pos)), message=f"task {ner['name']} ")
    assert (f"task {ner['name']} (scoring_list.{ner['task_id']}, sequence_labeling): the task definition says "
            f"{ner['n_class'] + 1} output(s) (n_class), the weights scoring_list.{ner['task_id']}.1.weight have "
            f"{ner['n_class']}; task {pos['name']} (scoring_list.{pos['task_id']}, sequence_labeling): the task "
            f"definition says {pos['n_class'] + 1} output(s) (n_class), the weights "
            f"scoring_list.{pos['task_id']}.weight have {pos['n_class']}") in line
    # a span head with a third output
    index = squad["task_id"]

    def third_output(state):
        state[f"scoring_list.{index}.1.weight"] = torch.cat([state[f"scoring_list.{index}.1.weight"]] * 2)[:3]
        state[f"scoring_list.{index}.1.bias"] = torch.cat([state[f"scoring_list.{index}.1.bias"]] * 2)[:3]

    checkpoint = fixture_without_task_defs(folder, tmp_path / "model.pt", third_output)
    assert_refused(capsys, tmp_path / "out", checkpoint, "--task-def", folder / "task_def.yml",
                   message=f"task {squad['name']} (scoring_list.{index}, span_classification): the task definition "
                           f"says 2 (start, end) output(s) (n_class), the weights scoring_list.{index}.1.weight "
                           "have 3")
    # a token head that reads another width than the encoder's
    hidden = meta["encoder_config"]["hidden_size"]

    def wider(state):
        state[f"scoring_list.{pos['task_id']}.weight"] = torch.zeros(pos["n_class"], hidden + 1)

    checkpoint = fixture_without_task_defs(folder, tmp_path / "model.pt", wider)
    assert_refused(capsys, tmp_path / "out", checkpoint, "--task-def", folder / "task_def.yml",
                   message=f"task {pos['name']} (scoring_list.{pos['task_id']}, sequence_labeling): "
                           f"scoring_list.{pos['task_id']}.weight reads {hidden + 1} features, the encoder's hidden "
                           f"size is {hidden}")
    # a sentence-level head where the definition says a token task, and a bare token head for a sentence task
    sst_as_tags = yaml(("data_format: PremiseOnly", "data_format: Seqence"), ("  - ACC\n  loss: CeCriterion",
                                                                              "  - SeqEval\n  loss: SeqCeCriterion"),
                       ("task_type: Classification", "task_type: SeqenceLabeling"))
    assert_refused(capsys, tmp_path / "out", folder / "model_0.pt", "--task-def", sst_as_tags,
                   message=f"task {sst['name']} (scoring_list.{sst['task_id']}, sequence_labeling): the task "
                           "definition says a token head (a linear layer on every token")
    pos_as_classes = yaml(("data_format: Seqence\n  dropout_p: 0.0", "data_format: PremiseOnly\n  dropout_p: 0.0"),
                          ("loss: SeqCeCriterion\n  kd_loss: MseCriterion\n  adv_loss: SymKlCriterion\n  n_class: "
                           f"{pos['n_class']}\n  task_type: SeqenceLabeling",
                           "loss: CeCriterion\n  kd_loss: MseCriterion\n  adv_loss: SymKlCriterion\n  n_class: "
                           f"{pos['n_class']}\n  task_type: Classification"),
                          ("  - SeqEval\n  loss: CeCriterion", "  - ACC\n  loss: CeCriterion"))
    assert_refused(capsys, tmp_path / "out", folder / "model_0.pt", "--task-def", pos_as_classes,
                   message=f"task {pos['name']} (scoring_list.{pos['task_id']}): the checkpoint has the pre-2021 "
                           "head layout for a classification task")
