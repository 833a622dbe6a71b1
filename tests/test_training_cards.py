"""The model card every training command writes into its output (`hf_ext.hub.write_training_card`): what the model
is, what it was trained from and with which settings, its steps, loss and metrics (a table, `model-index` and the
Hub's `.eval_results/` files), and how to load it; no local path and no secret in it, and loading by the Hub id once
pushed (`hf_ext.hub.card_for_repo`)."""

import argparse

import pytest
import yaml
from huggingface_hub import ModelCard, parse_eval_result_entries

from hf_ext.hub import Evaluation, card_for_repo, write_training_card

SST = Evaluation("text-classification", "sst (dev.tsv)", {"accuracy": 0.75, "f1": 0.5}, ("nyu-mll/glue", "sst2"))


@pytest.fixture
def data_file(tmp_path):
    path = tmp_path / "data" / "train.txt"
    path.parent.mkdir()
    path.write_text("a sentence .\n")
    return path


def flat(text):
    return " ".join(text.split())


def test_a_training_card_says_what_how_and_how_to_load_without_local_paths(tmp_path, data_file):
    folder = tmp_path / ".my-model.staging"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "optimus"}')
    args = argparse.Namespace(model="org/base", train_file=str(data_file), learning_rate=1e-3, beta=None,
                              train=["sst=/nowhere/x.tsv", f"rte={data_file}"], token="hf_secret", handler=print,
                              overwrite=True, output_dir=str(tmp_path / "out" / "my-model"))
    log = [{"step": 2, "loss": 3.0}, {"step": 4, "loss": 2.0}, {"step": 4, "train_loss": 2.5}]
    card = write_training_card(folder, tmp_path / "out" / "my-model", args, "hf-ext optimus train", "org/base", log,
                               [SST])
    text = (folder / "README.md").read_text()
    assert card.data.base_model == "org/base" and {"hf-ext", "optimus"} <= set(card.data.tags)
    assert text.splitlines()[text.splitlines().index("---", 1) + 2] == "# my-model"
    assert "This Optimus model was trained with [hf-ext](https://github.com/hf-ext/hf-ext) " in flat(text)
    assert "from `org/base`." in flat(text) and "`hf-ext optimus train`, with these settings:" in text
    for row in ("| `train_file` | `train.txt` |", "| `train` | `sst=x.tsv, rte=train.txt` |",
                "| `learning_rate` | `0.001` |", "| `model` | `org/base` |", "| `output_dir` | `my-model` |",
                "| sst (dev.tsv) | accuracy | 0.75 |", "| sst (dev.tsv) | f1 | 0.5 |"):
        assert row in text, row
    assert "4 optimizer steps, final training loss 2.5;" in flat(text)
    assert 'model = AutoModel.from_pretrained("my-model", trust_remote_code=True)' in text
    for absent in (str(tmp_path), "hf_secret", "`beta`", "`handler`", "`overwrite`", "staging"):
        assert absent not in text, absent
    # pushed, it loads by the repo id
    assert 'AutoModel.from_pretrained("org/my-model"' in card_for_repo(text, "my-model", "org/my-model")


def test_a_card_of_fresh_weights_in_stages_and_of_an_adapter(tmp_path):
    folder = tmp_path / "adapter"
    folder.mkdir()
    (folder / "adapter_config.json").write_text("{}")
    stages = [{"step": 3, "loss": 1.0}, {"step": 5, "loss": 0.5}, {"step": 2, "loss": 0.9}, {"step": 4, "loss": 0.4}]
    card = write_training_card(folder, tmp_path / "adapter", argparse.Namespace(seed=1), "hf-ext x", None, stages)
    text = (folder / "README.md").read_text()
    assert card.data.base_model is None
    assert "This transformers model (a LoRA adapter, with the modules trained in full) was trained with" in flat(text)
    assert "from freshly initialised weights." in flat(text)
    assert "9 optimizer steps;" in flat(text)  # 5 in the first stage, 4 in the second
    assert "## Evaluation" not in text

    (folder / "README.md").unlink()
    write_training_card(folder, tmp_path / "adapter", argparse.Namespace(), "hf-ext x", str(tmp_path), stages)
    text = (folder / "README.md").read_text()
    assert f'base = AutoModel.from_pretrained("{tmp_path.name}", trust_remote_code=True)' in text
    assert 'model = PeftModel.from_pretrained(base, "adapter")' in text and str(tmp_path) not in text


def test_a_card_records_its_evaluations_as_model_index_and_eval_results_files(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    copy_task = Evaluation("text2text-generation", "copy, 8 generated examples", {"sequence_accuracy": 1.0})
    mnli = [Evaluation("text-classification", f"mnli_{split} ({split}.tsv)", {"accuracy": value},
                       ("nyu-mll/glue", "mnli"), split) for split, value in (("matched", 0.8), ("mismatched", 0.7))]
    write_training_card(folder, tmp_path / "model", argparse.Namespace(), "hf-ext mtdnn train", None, [],
                        [SST, copy_task, *mnli])
    card = ModelCard.load(folder / "README.md")
    assert card.data.model_name == "model"
    results = [(r.task_type, r.dataset_type, r.dataset_name, r.dataset_config, r.dataset_split, r.metric_type,
                r.metric_value) for r in card.data.eval_results]
    assert results == [
        ("text-classification", "nyu-mll/glue", "sst (dev.tsv)", "sst2", None, "accuracy", 0.75),
        ("text-classification", "nyu-mll/glue", "sst (dev.tsv)", "sst2", None, "f1", 0.5),
        ("text2text-generation", "copy, 8 generated examples", "copy, 8 generated examples", None, None,
         "sequence_accuracy", 1.0),
        ("text-classification", "nyu-mll/glue", "mnli_matched (matched.tsv)", "mnli", "matched", "accuracy", 0.8),
        ("text-classification", "nyu-mll/glue", "mnli_mismatched (mismatched.tsv)", "mnli", "mismatched", "accuracy",
         0.7)]
    # the Hub's format: one file per benchmark task, the first metric of each evaluation, not the generated data's
    files = sorted(path.name for path in (folder / ".eval_results").iterdir())
    assert files == ["mnli.yaml", "sst2.yaml"]
    sst2 = parse_eval_result_entries(yaml.safe_load((folder / ".eval_results" / "sst2.yaml").read_text()))
    assert [(e.dataset_id, e.task_id, e.value, e.notes) for e in sst2] == [
        ("nyu-mll/glue", "sst2", 0.75, "accuracy on sst (dev.tsv), measured by hf-ext mtdnn train")]
    mnli_entries = parse_eval_result_entries(yaml.safe_load((folder / ".eval_results" / "mnli.yaml").read_text()))
    assert [e.value for e in mnli_entries] == [0.8, 0.7]
    # pushed, the model-index names the model by its repo id
    published = ModelCard(card_for_repo((folder / "README.md").read_text(), "model", "org/model"))
    assert published.data.model_name == "org/model" and len(published.data.eval_results) == 5


def test_a_card_without_evaluations_has_no_model_index(tmp_path):
    write_training_card(tmp_path, tmp_path, argparse.Namespace(), "hf-ext x", None, [])
    assert "model-index" not in (tmp_path / "README.md").read_text()
    assert not (tmp_path / ".eval_results").exists()
