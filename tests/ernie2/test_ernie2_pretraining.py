"""ERNIE 2.0 continual multi-task pre-training: the seven-head model (losses against hand-computed cross-entropy, the
reordering enumeration, loading a converted fixture folder and exporting back to plain ernie, remote code), the data
builders (labels checked against the documents they come from), the schedule and its sampler, continual runs whose
per-task losses fall and whose resumption equals an uninterrupted run, GLUE fine-tuning with task ids and offline
GLUE metrics, and the CLI's refusals."""

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from conftest import PROCESS_TIMEOUT, REPO_ROOT, cli_run, torchrun_cli
from fsdp2_training import TOLERANCE, fsdp2_and_ddp_command_runs, fsdp2_and_ddp_runs
from huggingface_hub import ModelCard
from safetensors.torch import load_file
from streaming_corpus import CORPUS
from torch.nn import functional as F
from transformers import (
    AutoModelForPreTraining,
    BertTokenizer,
    ErnieConfig,
    ErnieForPreTraining,
    ErnieForSequenceClassification,
    TrainerCallback,
    TrainingArguments,
)
from transformers.trainer_utils import EvalPrediction

from hf_ext.errors import HfExtError
from hf_ext.models.ernie2 import (
    PRETRAINING_TASKS,
    Ernie2ForPreTraining,
    Ernie2PreTrainingConfig,
    sentence_reordering_classes,
    sentence_reordering_label,
    sentence_reordering_permutation,
)
from hf_ext.models.ernie2.conversion import convert_ernie2_checkpoint
from hf_ext.models.ernie2.data import (
    DOCUMENT_TASKS,
    Ernie2DataBuilder,
    Ernie2PreTrainingCollator,
    SpanFinder,
    documents_from_records,
    load_documents,
    load_labelled_pairs,
    word_splitter,
)
from hf_ext.models.ernie2.schedule import PAPER_SCHEDULE, ContinualSchedule
from hf_ext.models.ernie2.training import (
    StageBatchSampler,
    continual_pretraining,
    finetune_glue,
    glue_metrics,
    load_glue_dataset,
)

pytestmark = pytest.mark.slow

TINY = REPO_ROOT / "tests/fixtures/ernie2/tiny"
GLUE = REPO_ROOT / "tests/data/glue_samples"


@pytest.fixture(scope="module")
def documents():
    return documents_from_records(CORPUS)


@pytest.fixture(scope="module")
def tokenizer(documents):
    split = word_splitter(BertTokenizer(vocab={"[UNK]": 0}))
    words = sorted({word.lower() for doc in CORPUS for paragraph in doc["paragraphs"] for sentence in paragraph
                    for word in split(sentence)})
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]
    return BertTokenizer(vocab={token: i for i, token in enumerate(tokens)}, do_lower_case=True)


def tiny_config(tokenizer, **overrides):
    settings = dict(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                    intermediate_size=37, max_position_embeddings=64)
    return Ernie2PreTrainingConfig(**{**settings, **overrides})


@pytest.fixture(scope="module")
def task_data(documents, tokenizer):
    builder = Ernie2DataBuilder(tokenizer, max_length=48, seed=0)
    return builder.build(documents, DOCUMENT_TASKS)


# ----- the model ---------------------------------------------------------------------------------------------------

def test_reordering_classes_enumerate_every_order_of_every_split():
    assert [sentence_reordering_classes(m) for m in range(1, 6)] == [1, 3, 9, 33, 153]
    assert [sentence_reordering_permutation(k, 3) for k in range(9)] == [
        [0], [0, 1], [1, 0], [0, 1, 2], [0, 2, 1], [1, 0, 2], [1, 2, 0], [2, 0, 1], [2, 1, 0]]
    labels = [sentence_reordering_label(sentence_reordering_permutation(k, 5)) for k in range(153)]
    assert labels == list(range(153))
    assert sentence_reordering_label([3, 2, 1, 0]) == 1 + 2 + 6 + 23  # the last 4-segment order
    with pytest.raises(ValueError, match="not a permutation"):
        sentence_reordering_label([0, 2])
    with pytest.raises(ValueError, match="only 9 reordering classes"):
        sentence_reordering_permutation(9, 3)


def test_config_validates_and_round_trips_task_settings(tmp_path):
    ids = {task: 6 - i for i, task in enumerate(PRETRAINING_TASKS)}
    config = Ernie2PreTrainingConfig(hidden_size=16, num_attention_heads=2, task_ids=ids, max_reorder_segments=4,
                                     num_discourse_relations=5, task_type_vocab_size=8)
    config.save_pretrained(tmp_path)
    loaded = Ernie2PreTrainingConfig.from_pretrained(tmp_path)
    assert loaded.task_ids == ids and loaded.task_type_vocab_size == 8
    assert loaded.task_num_labels == {"knowledge_masking": 30522, "capitalization": 2, "token_document_relation": 2,
                                      "sentence_reordering": 33, "sentence_distance": 3, "discourse_relation": 5,
                                      "ir_relevance": 3}
    for bad, message in (({"use_task_id": False}, "use_task_id must be true"),
                         ({"task_ids": {"knowledge_masking": 0}}, "task_ids must give an id to each"),
                         ({"task_type_vocab_size": 6}, r"task id 6 of ir_relevance is not in \[0, "),
                         ({"max_reorder_segments": 9}, "max_reorder_segments must be an integer in"),
                         ({"num_discourse_relations": 1}, "num_discourse_relations must be an integer at least 2")):
        with pytest.raises(ValueError, match=message):
            Ernie2PreTrainingConfig(**bad)


def test_each_task_loss_is_the_cross_entropy_of_its_head_and_the_total_their_sum():
    torch.manual_seed(0)
    config = Ernie2PreTrainingConfig(vocab_size=40, hidden_size=24, num_hidden_layers=1, num_attention_heads=3,
                                     intermediate_size=30, hidden_act="relu", max_position_embeddings=16,
                                     max_reorder_segments=4, num_discourse_relations=5)
    model = Ernie2ForPreTraining(config).eval()
    assert model.cls.predictions.decoder.weight is model.ernie.embeddings.word_embeddings.weight
    ids = torch.randint(5, 40, (4, 9))
    tasks = torch.tensor([config.task_ids["knowledge_masking"], config.task_ids["capitalization"],
                          config.task_ids["sentence_reordering"], config.task_ids["discourse_relation"]])
    task_type_ids = tasks[:, None].expand(-1, 9)
    mlm = torch.full((4, 9), -100)
    mlm[0, [2, 5]] = ids[0, [2, 5]]
    caps = torch.full((4, 9), -100)
    caps[1, 1:7] = torch.tensor([1, 0, 0, 1, 0, 1])
    reorder = torch.tensor([-100, -100, 32, -100])
    discourse = torch.tensor([-100, -100, -100, 4])
    out = model(input_ids=ids, task_type_ids=task_type_ids, knowledge_masking_labels=mlm,
                capitalization_labels=caps, sentence_reordering_labels=reorder, discourse_relation_labels=discourse)
    with torch.no_grad():
        encoded = model.ernie(ids, task_type_ids=task_type_ids)
    hidden, pooled = encoded.last_hidden_state, encoded.pooler_output
    expected = {
        "knowledge_masking": F.cross_entropy(model.cls(hidden)[0, [2, 5]], ids[0, [2, 5]]),
        "capitalization": F.cross_entropy(model.heads.capitalization(hidden)[1, 1:7], caps[1, 1:7]),
        "sentence_reordering": F.cross_entropy(model.heads.sentence_reordering(pooled)[2:3], reorder[2:3]),
        "discourse_relation": F.cross_entropy(model.heads.discourse_relation(pooled)[3:], discourse[3:]),
    }
    for task, value in expected.items():
        torch.testing.assert_close(out[f"{task}_loss"], value, atol=1e-6, rtol=0)
    torch.testing.assert_close(out.loss, sum(expected.values()), atol=1e-5, rtol=0)
    assert out.sentence_distance_loss is None and out.sentence_distance_logits is None
    assert out.sentence_reordering_logits.shape == (4, 33) and out.discourse_relation_logits.shape == (4, 5)
    # without labels every head runs; the task id changes the encoding
    plain = model(input_ids=ids)
    assert plain.loss is None
    assert [name for name in plain.keys() if name.endswith("_logits")] == [f"{t}_logits" for t in PRETRAINING_TASKS]
    assert plain.knowledge_masking_logits.shape == (4, 9, 40)
    assert not torch.allclose(plain.sentence_distance_logits,
                              model(input_ids=ids, task_type_ids=task_type_ids).sentence_distance_logits)
    # a batch whose labels are all ignored has no loss for that task
    assert model(input_ids=ids, sentence_distance_labels=torch.full((4,), -100)).loss is None


@pytest.fixture(scope="module")
def converted_fixture(tmp_path_factory):
    out = tmp_path_factory.mktemp("ernie2") / "converted"
    convert_ernie2_checkpoint(TINY / "paddle_static", out)
    return out


def test_continues_from_a_converted_fixture_and_exports_back_to_plain_ernie(converted_fixture, tmp_path):
    reference = load_file(str(TINY / "reference.safetensors"))
    inputs = {k: reference[k] for k in ("input_ids", "attention_mask", "token_type_ids", "position_ids",
                                        "task_type_ids")}
    model = Ernie2ForPreTraining.from_ernie_pretrained(converted_fixture).eval()
    assert model.config.task_type_vocab_size == 7 and model.config.hidden_act == "gelu"
    with torch.no_grad():
        out = model(**inputs)
    mlm = out.knowledge_masking_logits
    assert (mlm - reference["mlm_logits_key_mask"]).abs().max() < 1e-5  # the original's MLM output
    # the fixture's three task embedding rows are kept; the new rows start as copies of row 0
    rows = model.ernie.embeddings.task_type_embeddings.weight
    source = ErnieForPreTraining.from_pretrained(converted_fixture).ernie.embeddings.task_type_embeddings.weight
    assert torch.equal(rows[:3], source) and all(torch.equal(rows[i], source[0]) for i in range(3, 7))

    model.save_pretrained(tmp_path / "pretraining")
    assert type(AutoModelForPreTraining.from_pretrained(tmp_path / "pretraining")) is Ernie2ForPreTraining
    model.save_ernie_pretrained(tmp_path / "ernie")
    config = json.loads((tmp_path / "ernie" / "config.json").read_text())
    assert config["model_type"] == "ernie" and "task_ids" not in config and "auto_map" not in config
    exported = ErnieForPreTraining.from_pretrained(tmp_path / "ernie").eval()
    with torch.no_grad():
        again = exported(**inputs)
    assert torch.equal(again.prediction_logits, mlm)
    assert torch.equal(again.seq_relationship_logits, torch.zeros_like(again.seq_relationship_logits))
    state = model.state_dict()
    assert all(torch.equal(t, state[k]) for k, t in exported.state_dict().items() if k.startswith("ernie."))


def test_a_source_without_task_embeddings_keeps_its_function_for_every_task_id(tmp_path):
    """Another configuration: no task embedding (as the released English checkpoints), relu, an untied decoder."""
    torch.manual_seed(1)
    source = ErnieForPreTraining(ErnieConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                             intermediate_size=20, hidden_act="relu", max_position_embeddings=20,
                                             tie_word_embeddings=False, task_type_vocab_size=16)).eval()
    source.save_pretrained(tmp_path)
    model = Ernie2ForPreTraining.from_ernie_pretrained(tmp_path, {"max_reorder_segments": 2}).eval()
    assert model.config.task_type_vocab_size == 16 and not model.config.tie_word_embeddings
    assert model.heads.sentence_reordering.out_features == 3
    assert torch.equal(model.cls.predictions.decoder.weight, source.cls.predictions.decoder.weight)
    ids = torch.randint(5, 50, (2, 7))
    with torch.no_grad():
        expected = source(ids).prediction_logits
        for task_id in (0, 6):
            logits = model(input_ids=ids, task_type_ids=torch.full_like(ids, task_id)).knowledge_masking_logits
            torch.testing.assert_close(logits, expected, atol=1e-6, rtol=0)


REMOTE_CHECK = textwrap.dedent("""
    import json, sys
    import torch
    from transformers import AutoModelForPreTraining, AutoModelForSequenceClassification
    pretraining, ernie = sys.argv[1:3]
    ids = torch.tensor([[2, 7, 9, 11, 3]])
    model = AutoModelForPreTraining.from_pretrained(pretraining, trust_remote_code=True).eval()
    classifier = AutoModelForSequenceClassification.from_pretrained(ernie, num_labels=3).eval()
    with torch.no_grad():
        out = model(input_ids=ids, task_type_ids=torch.full_like(ids, 4))
        pooled = classifier.ernie(ids, task_type_ids=torch.full_like(ids, 4)).pooler_output
    print(json.dumps({"classes": [type(model).__name__, type(classifier).__name__],
                      "keys": [k for k in out.keys() if k.endswith("_logits")],
                      "logits": out.sentence_distance_logits.tolist(),
                      "pooled": pooled.tolist(),
                      "hf_ext": any(name.split(".")[0] == "hf_ext" for name in sys.modules)}))
""")


@pytest.mark.slow
def test_saved_folders_load_without_hf_ext(converted_fixture, tmp_path):
    model = Ernie2ForPreTraining.from_ernie_pretrained(converted_fixture).eval()
    model.save_pretrained(tmp_path / "pretraining")
    model.save_ernie_pretrained(tmp_path / "ernie")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run([sys.executable, "-c", REMOTE_CHECK, str(tmp_path / "pretraining"),
                             str(tmp_path / "ernie")], env=env, cwd=tmp_path, capture_output=True, text=True,
                            timeout=PROCESS_TIMEOUT)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["hf_ext"] is False
    assert report["classes"] == ["Ernie2ForPreTraining", "ErnieForSequenceClassification"]
    assert report["keys"] == [f"{task}_logits" for task in PRETRAINING_TASKS]
    ids = torch.tensor([[2, 7, 9, 11, 3]])
    with torch.no_grad():
        encoded = model.ernie(ids, task_type_ids=torch.full_like(ids, 4))
        logits = model.heads.sentence_distance(encoded.pooler_output)
    torch.testing.assert_close(torch.tensor(report["logits"]), logits, atol=1e-6, rtol=0)
    torch.testing.assert_close(torch.tensor(report["pooled"]), encoded.pooler_output, atol=1e-6, rtol=0)


# ----- data --------------------------------------------------------------------------------------------------------

def test_documents_load_from_text_and_json_lines(tmp_path):
    text = tmp_path / "docs.txt"
    text.write_text("First sentence.\nSecond one.\n \nNew paragraph.\n\n\n\nOther document.\n\n")
    jsonl = tmp_path / "docs.jsonl"
    jsonl.write_text(json.dumps({"paragraphs": [["First sentence.", "Second one."], ["New paragraph."]]}) + "\n\n"
                     + json.dumps({"paragraphs": [["Other document."]], "entities": ["Other"]}) + "\n")
    for path in (text, jsonl):
        assert load_documents(path)["paragraphs"] == [[["First sentence.", "Second one."], ["New paragraph."]],
                                                      [["Other document."]]]
    assert load_documents(jsonl)["entities"] == [[], ["Other"]]
    for content, message in (('{"paragraphs": [["a"]]}\n{oops\n', r"line 2: not JSON"),
                             ('{"paragraphs": [[]]}\n', "document 1: the document has no sentences"),
                             ('{"paragraphs": [["a"]], "title": "x"}\n', r"unknown field\(s\) title"),
                             ('{"paragraphs": ["a"]}\n', "each paragraph must be a list of strings"),
                             ("\n\n", "holds no documents")):
        jsonl.write_text(content)
        with pytest.raises(HfExtError, match=message):
            load_documents(jsonl)
    with pytest.raises(HfExtError, match="does not exist"):
        load_documents(tmp_path / "missing.txt")


def test_span_finder_heuristics_lexicons_and_given_spans(tokenizer):
    split = word_splitter(tokenizer)

    def spans(finder, sentence, **given):
        words = split(sentence)
        return [" ".join(words[a:b]) for a, b in finder.find(words, **given)]

    heuristic = SpanFinder(split_words=split)
    assert spans(heuristic, "In New York the Bank of America opened a branch.") == ["New York", "Bank of America"]
    # content-word runs: a crude stand-in for noun chunks, verbs included
    assert spans(heuristic, "The red ball rolled under the old table.") == ["red ball rolled", "old table"]
    assert spans(heuristic, "Her work on radioactive decay won two Nobel prizes.") == ["radioactive decay won two"]
    assert spans(heuristic, "He met Ada Lovelace, and Charles Babbage.") == ["Ada Lovelace", "Charles Babbage"]
    lexicon = SpanFinder(entities=["nobel prizes"], phrases=["won two nobel"], split_words=split, heuristics=False)
    assert spans(lexicon, "Her work on radioactive decay won two Nobel prizes.") == ["Nobel prizes"]
    assert spans(lexicon, "The red ball rolled under the old table.", phrases=["old table"]) == ["old table"]


def test_knowledge_masking_hides_whole_units_and_labels_the_original_tokens(documents, tokenizer, task_data):
    masked, plain = task_data["knowledge_masking"], task_data["capitalization"]  # the same windows, unmasked
    assert len(masked) == len(plain) == 8
    builder = Ernie2DataBuilder(tokenizer, max_length=48, seed=0)
    mask_id = tokenizer.mask_token_id
    replaced = kept = 0
    for row, original in zip(masked, plain, strict=True):
        ids, labels, source = row["input_ids"], np.array(row["labels"]), original["input_ids"]
        chosen = np.flatnonzero(labels != -100)
        pieces = len(source) - 2
        assert 1 <= len(chosen) <= max(1, round(0.15 * pieces))
        assert all(labels[i] == source[i] for i in chosen)
        assert all(ids[i] == source[i] for i in range(len(ids)) if labels[i] == -100)
        replaced += sum(ids[i] == mask_id for i in chosen)
        kept += sum(ids[i] != mask_id for i in chosen)
    assert replaced > kept  # 80% [MASK]
    # units are masked whole: every entity or phrase of the lexicon is either fully chosen or not at all
    finder = SpanFinder(entities=["Marie Curie", "Albert Einstein", "Charles Babbage", "Ada Lovelace"],
                        phrases=["radioactive decay", "analytical engine"], split_words=builder.split_words,
                        heuristics=False)
    rows = Ernie2DataBuilder(tokenizer, max_length=48, seed=3, span_finder=finder,
                             mask_probability=0.3).knowledge_masking(documents)
    units = [tokenizer(text, add_special_tokens=False)["input_ids"]
             for text in ("marie curie", "albert einstein", "charles babbage", "ada lovelace", "radioactive decay",
                          "analytical engine")]
    whole = 0
    for row, original in zip(rows, plain, strict=True):
        source, chosen = original["input_ids"], [label != -100 for label in row["labels"]]
        for unit in units:
            for start in range(len(source) - len(unit) + 1):
                if source[start:start + len(unit)] == unit and any(chosen[start:start + len(unit)]):
                    assert all(chosen[start:start + len(unit)])
                    whole += 1
    assert whole >= 2


def test_word_labels_follow_the_cased_text_and_the_other_segments(tokenizer):
    documents = documents_from_records([{"paragraphs": [["Paris is in Brazil with London."],
                                                        ["Brazil won 12 prizes.", "paris is large."]]}])
    builder = Ernie2DataBuilder(tokenizer, max_length=48)
    capital = builder.capitalization(documents)
    tokens = [tokenizer.convert_ids_to_tokens(row["input_ids"]) for row in capital]
    assert tokens == [["[CLS]", "paris", "is", "in", "brazil", "with", "london", ".", "[SEP]"],
                      ["[CLS]", "brazil", "won", "[UNK]", "prizes", ".", "paris", "is", "large", ".", "[SEP]"]]
    assert capital["labels"] == [[-100, 1, 0, 0, 1, 0, 1, -100, -100],
                                 [-100, 1, 0, -100, 0, -100, 0, 0, 0, -100, -100]]  # "12" has no case
    relation = builder.token_document_relation(documents)
    # the segments are the two paragraphs: "paris", "is" and "brazil" occur in both
    assert relation["input_ids"] == capital["input_ids"]
    assert relation["labels"] == [[-100, 1, 1, 0, 1, 0, 0, -100, -100],
                                  [-100, 1, 0, 0, 0, -100, 1, 1, 0, -100, -100]]
    single = builder.token_document_relation(documents_from_records([{"paragraphs": [["Paris is large.",
                                                                                      "Brazil is large."]]}]))
    assert single["labels"] == [[-100, 0, 1, 1, -100, -100], [-100, 0, 1, 1, -100, -100]]  # sentences as segments
    numbers = builder.capitalization(documents_from_records([{"paragraphs": [["12 34 ."], ["Paris is large."]]}]))
    assert numbers["labels"] == [[-100, 1, 0, 0, -100, -100]]  # a window with nothing to label is left out


def test_reordering_and_distance_labels_describe_the_examples(documents, tokenizer, task_data):
    sentences = [[s for paragraph in doc for s in paragraph] for doc in documents["paragraphs"]]
    encode = {tuple(tokenizer(s, add_special_tokens=False)["input_ids"]): (d, i)
              for d, doc in enumerate(sentences) for i, s in enumerate(doc)}

    def split_at_sep(ids):
        parts, current = [], []
        for token in ids[1:]:
            if token == tokenizer.sep_token_id:
                parts.append(current)
                current = []
            else:
                current.append(token)
        return parts

    def sentence_positions(segment):
        """The (document, index) of the consecutive sentences a segment is made of."""
        found, start = [], 0
        for end in range(1, len(segment) + 1):
            if tuple(segment[start:end]) in encode:
                found.append(encode[tuple(segment[start:end])])
                start = end
        assert start == len(segment)
        return found

    labels = set()
    for row in task_data["sentence_reordering"]:
        segments = [sentence_positions(segment) for segment in split_at_sep(row["input_ids"])]
        order = sorted(range(len(segments)), key=lambda k: segments[k][0])
        permutation = [order.index(k) for k in range(len(segments))]
        assert row["labels"] == [sentence_reordering_label(permutation)]
        labels.add(row["labels"][0])
    assert len(labels) >= 3 and max(labels) < 9
    counts = [0, 0, 0]
    for row in task_data["sentence_distance"]:
        (first,), (second,) = (sentence_positions(part) for part in split_at_sep(row["input_ids"]))
        label = row["labels"][0]
        counts[label] += 1
        if first[0] != second[0]:
            assert label == 2
        elif second[1] == first[1] + 1:
            assert label == 0
        else:
            assert label == 1 and abs(second[1] - first[1]) > 1
        assert row["token_type_ids"].count(1) == len(tokenizer(sentences[second[0]][second[1]])["input_ids"]) - 1
    assert len(task_data["sentence_distance"]) == sum(map(len, sentences)) and min(counts) >= 2


def test_builder_is_deterministic_per_seed(documents, tokenizer, task_data):
    again = Ernie2DataBuilder(tokenizer, max_length=48, seed=0).build(documents, ["knowledge_masking",
                                                                                   "sentence_reordering"])
    other = Ernie2DataBuilder(tokenizer, max_length=48, seed=5).knowledge_masking(documents)
    assert again["knowledge_masking"][:] == task_data["knowledge_masking"][:]
    assert again["sentence_reordering"][:] == task_data["sentence_reordering"][:]
    assert other["input_ids"] != task_data["knowledge_masking"]["input_ids"]


def test_labelled_pairs_and_the_collator(tmp_path, tokenizer, task_data):
    pairs = tmp_path / "ir.jsonl"
    pairs.write_text('{"sentence1": "brazil capital", "sentence2": "Its capital is Brasilia.", "label": 0}\n'
                     '{"sentence1": "brazil capital", "sentence2": "The red ball rolled.", "label": 2}\n')
    builder = Ernie2DataBuilder(tokenizer, max_length=16)
    examples = builder.labelled_pairs(load_labelled_pairs(pairs, "ir_relevance"), "ir_relevance")
    assert examples["labels"] == [[0], [2]] and examples[0]["token_type_ids"].count(1) == 6
    for content, message in (('{"sentence1": "a", "sentence2": "b", "label": 3}', "label 3 is not a class id below 3"),
                             ('{"sentence1": "a", "label": 0}', "non-empty sentence1, sentence2")):
        pairs.write_text(content + "\n")
        with pytest.raises(HfExtError, match=message):
            load_labelled_pairs(pairs, "ir_relevance")
    with pytest.raises(HfExtError, match="ir_relevance needs labelled pairs"):
        builder.build(documents_from_records(CORPUS[:1]), ["ir_relevance"])

    task_ids = {task: 10 + i for i, task in enumerate(PRETRAINING_TASKS)}
    rows = [task_data["capitalization"][0], examples[1], task_data["sentence_distance"][0]]
    batch = Ernie2PreTrainingCollator(task_ids)(rows)
    width = max(len(row["input_ids"]) for row in rows)
    assert set(batch) == {"input_ids", "token_type_ids", "attention_mask", "task_type_ids", "capitalization_labels",
                          "ir_relevance_labels", "sentence_distance_labels"}
    assert batch["attention_mask"].sum(1).tolist() == [len(row["input_ids"]) for row in rows]
    assert batch["task_type_ids"][:, 0].tolist() == [11, 16, 14] and batch["input_ids"].shape == (3, width)
    assert batch["capitalization_labels"][0, :len(rows[0]["labels"])].tolist() == rows[0]["labels"]
    assert (batch["capitalization_labels"][1:] == -100).all()
    assert batch["ir_relevance_labels"].tolist() == [-100, 2, -100]
    assert batch["sentence_distance_labels"].tolist() == [-100, -100, rows[2]["labels"][0]]


# ----- the schedule ------------------------------------------------------------------------------------------------

def test_schedule_files_and_the_paper_default(tmp_path):
    totals = {}
    for stage in PAPER_SCHEDULE.stages:
        for task, steps in stage.steps.items():
            totals[task] = totals.get(task, 0) + steps
    assert totals == dict.fromkeys(["knowledge_masking", "capitalization", "token_document_relation",
                                    "sentence_reordering"], 50000)
    path = tmp_path / "stages.yml"
    path.write_text("stages:\n  - steps: {knowledge_masking: 3}\n  - name: two\n"
                    "    steps: {capitalization: 2, knowledge_masking: 1}\n")
    schedule = ContinualSchedule.from_file(path)
    assert [stage.total_steps for stage in schedule.stages] == [3, 3]
    assert schedule.tasks == ["knowledge_masking", "capitalization"]
    assert ContinualSchedule.from_dict(json.loads(json.dumps(schedule.to_dict()))) == schedule
    for text, message in (("stages: []", "a non-empty list of stages"),
                          ("stages:\n  - steps: {masking: 2}", r"stage 1: unknown task\(s\) masking"),
                          ("stages:\n  - steps: {capitalization: 0}", "steps of capitalization must be a positive"),
                          ("stages:\n  - {capitalization: 2}", "a stage is a mapping with `steps`"),
                          ("stages: [", "is not YAML/JSON")):
        path.write_text(text)
        with pytest.raises(HfExtError, match=message):
            ContinualSchedule.from_file(path)


def test_stage_sampler_gives_each_task_its_steps_in_single_task_batches():
    rows = {"knowledge_masking": list(range(0, 5)), "capitalization": list(range(5, 8)),
            "sentence_distance": list(range(8, 15))}
    steps = {"knowledge_masking": 6, "capitalization": 2, "sentence_distance": 4}
    sampler = StageBatchSampler(rows, steps, batch_size=2, batches_per_step=2, seed=(3, 1))
    batches = list(sampler)
    assert len(batches) == len(sampler) == 24 and batches == list(sampler)
    owner = {row: task for task, indices in rows.items() for row in indices}
    tasks = [{owner[row] for row in batch} for batch in batches]
    assert all(len(task) == 1 and len(batch) == 2 for task, batch in zip(tasks, batches, strict=True))
    assert {task: sum(t == {task} for t in tasks) for task in steps} == {t: 2 * s for t, s in steps.items()}
    assert [t.pop() for t in tasks[:12]] != sorted(steps, key=list(steps).index)  # mixed, not task after task
    stream = [row for batch in batches for row in batch if owner[row] == "knowledge_masking"]
    for start in range(0, len(stream) - 4, 5):  # whole passes over the task's rows
        assert sorted(stream[start:start + 5]) == rows["knowledge_masking"]
    assert list(StageBatchSampler(rows, steps, 2, 2, seed=(3, 2))) != batches
    halves = [list(StageBatchSampler(rows, steps, 2, 2, seed=(3, 1), rank=r, world_size=2)) for r in (0, 1)]
    assert [a + b for a, b in zip(*halves, strict=True)] == batches
    with pytest.raises(HfExtError, match="no examples for task"):
        StageBatchSampler({"capitalization": []}, {"capitalization": 1}, 2)


# ----- continual runs ----------------------------------------------------------------------------------------------

SCHEDULE = ContinualSchedule.from_dict({"stages": [
    {"steps": {"knowledge_masking": 8}},
    {"steps": {"knowledge_masking": 4, "capitalization": 8}},
    {"steps": {"knowledge_masking": 3, "capitalization": 3, "token_document_relation": 8, "sentence_reordering": 8,
               "sentence_distance": 8}},
]})


class Interrupt(Exception):
    pass


class InterruptAt(TrainerCallback):
    """Stops a run like a crash, after the checkpoint of `step` of stage `stage` was written and a step more."""

    def __init__(self, stage, step):
        self.stage, self.step = stage, step

    def on_step_end(self, args, state, control, **kwargs):
        if Path(args.output_dir).name == f"stage-{self.stage}" and state.global_step == self.step:
            raise Interrupt


def run_schedule(out, tokenizer, task_data, callbacks=None, save_steps=None):
    torch.manual_seed(0)
    model = Ernie2ForPreTraining(tiny_config(tokenizer))
    args = TrainingArguments(output_dir=str(out), per_device_train_batch_size=4, learning_rate=3e-3, logging_steps=2,
                             lr_scheduler_type="constant", seed=11, report_to=[], disable_tqdm=True, use_cpu=True,
                             save_strategy="steps" if save_steps else "no", save_steps=save_steps or 500)
    return continual_pretraining(model, SCHEDULE, task_data, args, processing_class=tokenizer, callbacks=callbacks)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, tokenizer, task_data):
    out = tmp_path_factory.mktemp("ernie2_run")
    model, histories = run_schedule(out, tokenizer, task_data)
    return out, model, histories


def mean_task_losses(model, task_data, tasks):
    collator = Ernie2PreTrainingCollator(model.config.task_ids)
    model.eval()
    with torch.no_grad():
        return {task: model(**collator(list(task_data[task])))[f"{task}_loss"].item() for task in tasks}


def test_each_stage_lowers_the_loss_of_every_task_it_trains(uninterrupted, tokenizer, task_data):
    out, model, histories = uninterrupted
    assert json.loads((out / "schedule.json").read_text()) == SCHEDULE.to_dict()
    torch.manual_seed(0)
    before = Ernie2ForPreTraining(tiny_config(tokenizer))
    for index, (stage, history) in enumerate(zip(SCHEDULE.stages, histories, strict=True)):
        after = Ernie2ForPreTraining.from_pretrained(out / f"stage-{index + 1}" / "model")
        start, end = (mean_task_losses(m, task_data, stage.steps) for m in (before, after))
        assert all(end[task] < start[task] for task in stage.steps), (index, start, end)
        logged = {key.removeprefix("loss_") for entry in history for key in entry if key.startswith("loss_")}
        assert logged == set(stage.steps)
        assert {entry["stage"] for entry in history if "loss" in entry} == {index + 1}
        assert history[-1]["step"] == stage.total_steps
        before = after
    final = Ernie2ForPreTraining.from_pretrained(out / "stage-3" / "model")
    assert all(torch.equal(t, final.state_dict()[k]) for k, t in model.state_dict().items())


def test_a_run_resumed_from_the_middle_equals_an_uninterrupted_one(uninterrupted, tmp_path, tokenizer, task_data):
    _, expected, expected_histories = uninterrupted
    with pytest.raises(Interrupt):
        run_schedule(tmp_path, tokenizer, task_data, [InterruptAt(stage=2, step=7)], save_steps=5)
    assert (tmp_path / "stage-1" / "model").is_dir() and not (tmp_path / "stage-2" / "model").exists()
    assert sorted(p.name for p in (tmp_path / "stage-2").iterdir()) == ["checkpoint-5"]
    model, histories = run_schedule(tmp_path, tokenizer, task_data, save_steps=5)
    state = model.state_dict()
    assert all(torch.equal(t, state[k]) for k, t in expected.state_dict().items())

    def losses(history):
        return [{k: v for k, v in entry.items() if k.startswith("loss")} for entry in history if "loss" in entry]

    assert losses(histories[1])[-1] == losses(expected_histories[1])[-1]  # a window after the resume point
    assert losses(histories[2]) == losses(expected_histories[2])
    # another schedule in the same folder is refused
    with pytest.raises(HfExtError, match="holds a run of another schedule"):
        continual_pretraining(model, PAPER_SCHEDULE, task_data, TrainingArguments(output_dir=str(tmp_path)))


def test_a_save_interrupted_midway_resumes_from_the_previous_checkpoint(uninterrupted, tmp_path, tokenizer,
                                                                         task_data, monkeypatch):
    """Ctrl-C while checkpoint-10 of stage 2 is being written leaves its weights without trainer_state.json: the
    next run removes it and resumes from checkpoint-5, ending where an uninterrupted run ends."""
    from transformers import TrainerState

    _, expected, _ = uninterrupted
    save_state = TrainerState.save_to_json

    def interrupted(state, path):
        if f"stage-2{os.sep}checkpoint-10" in str(path):
            raise KeyboardInterrupt
        save_state(state, path)

    monkeypatch.setattr(TrainerState, "save_to_json", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_schedule(tmp_path, tokenizer, task_data, save_steps=5)
    stage = tmp_path / "stage-2"
    assert sorted(p.name for p in stage.iterdir()) == ["checkpoint-10", "checkpoint-5"]
    assert (stage / "checkpoint-10" / "model.safetensors").is_file()
    assert not (stage / "checkpoint-10" / "trainer_state.json").exists()
    monkeypatch.setattr(TrainerState, "save_to_json", save_state)
    model, _ = run_schedule(tmp_path, tokenizer, task_data, save_steps=5)
    state = model.state_dict()
    assert all(torch.equal(t, state[k]) for k, t in expected.state_dict().items())


@pytest.mark.slow
def test_fsdp2_training_through_accelerate_matches_ddp(tmp_path):
    """`continual_pretraining` (the run of `hf-ext ernie2 pretrain`) over two stages under 2 processes over gloo,
    sharded by accelerate's FSDP2 plan with the settings of docs/launch/accelerate_fsdp2_gpu.yaml: a unit per encoder
    layer, the word embeddings with the tied MLM decoder, the rest in the model's; every parameter sharded, the second
    stage going on with the model the first sharded; the run trains exactly as DDP does on the same batches (losses and
    weights within float rounding), and each stage's saved model, gathered from the shards, equals DDP's."""
    runs, _ = fsdp2_and_ddp_runs("ernie2/ernie2_fsdp2_train.py", out=tmp_path)
    fsdp2 = runs["fsdp2"]
    assert fsdp2["units"] == ["", "cls.predictions.decoder", "ernie.embeddings.word_embeddings",
                              "ernie.encoder.layer.0", "ernie.encoder.layer.1"]
    assert fsdp2["stages"] == [1, 1, 1, 1, 2, 2, 2, 2]
    for stage in (1, 2):
        saved = {mode: load_file(tmp_path / mode / "run" / f"stage-{stage}" / "model" / "model.safetensors")
                 for mode in ("fsdp2", "ddp")}
        assert saved["fsdp2"].keys() == saved["ddp"].keys()
        for name, weight in saved["fsdp2"].items():
            torch.testing.assert_close(weight, saved["ddp"][name], atol=TOLERANCE, rtol=TOLERANCE, msg=name)
    first, second = (Ernie2ForPreTraining.from_pretrained(tmp_path / "fsdp2" / "run" / f"stage-{stage}" / "model")
                     for stage in (1, 2))
    assert not torch.equal(first.ernie.encoder.layer[0].output.dense.weight,
                           second.ernie.encoder.layer[0].output.dense.weight)


# ----- GLUE fine-tuning --------------------------------------------------------------------------------------------

def test_glue_files_of_every_task_are_read_in_their_layout(tokenizer):
    expected = {"CoLA": [1, 1], "SST-2": [0], "MRPC": [1], "STS-B": [5.0], "QQP": [0], "MNLI": [1], "QNLI": [0],
                "RTE": [0], "WNLI": [1]}
    for task, labels in expected.items():
        train = load_glue_dataset(GLUE / task / "train.tsv", task, tokenizer)
        assert train["labels"] == labels, task
        assert all(ids[0] == tokenizer.cls_token_id for ids in train["input_ids"])
        pair = task not in ("CoLA", "SST-2")
        assert all((1 in types) == pair for types in train["token_type_ids"]), task
    test = load_glue_dataset(GLUE / "MNLI" / "test_matched.tsv", "mnli", tokenizer)
    assert "labels" not in test.column_names and len(test) == 1
    with pytest.raises(HfExtError, match="no GLUE TSV layout named 'sst'"[:20]):
        load_glue_dataset(GLUE / "SST-2" / "train.tsv", "nope", tokenizer)


def test_glue_metrics_read_class_ids_or_scores():
    logits = np.array([[0.1, 0.9], [2.0, -1.0], [0.0, 1.0]])
    assert glue_metrics("MRPC")(EvalPrediction(logits, np.array([1, 0, 0]))) == {"accuracy": 2 / 3, "f1": 2 / 3}
    scores, gold = np.array([[1.0], [2.0], [4.0]]), np.array([1.5, 2.0, 3.5])
    result = glue_metrics("STS-B")(EvalPrediction(scores, gold))
    assert result["spearmanr"] == pytest.approx(1.0)
    assert result["pearson"] == pytest.approx(np.corrcoef(scores[:, 0], gold)[0, 1])


SENTIMENT = [("Brazil is a large country .", 1), ("The theory changed physics forever .", 1),
             ("The analytical engine was never built .", 0), ("The red ball rolled under the old table .", 0),
             ("Many strange fish live in the river .", 1), ("Her notes describe how it would compute numbers .", 0)]


@pytest.fixture(scope="module")
def ernie_folder(tmp_path_factory, tokenizer):
    folder = tmp_path_factory.mktemp("ernie2_ft") / "ernie"
    torch.manual_seed(2)
    Ernie2ForPreTraining(tiny_config(tokenizer)).save_ernie_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.mark.slow
def test_finetune_under_torchrun_writes_its_output_once_from_the_main_process(tmp_path, ernie_folder):
    """`hf-ext ernie2 finetune` under `torchrun --nproc-per-node 2`: both processes end with exit code 0 and only the
    main one writes the output folder, once, with one summary line; the folder holds a trained classifier."""
    out = tmp_path / "runs" / "mrpc"
    code, stdout, err = torchrun_cli(["ernie2", "finetune", ernie_folder, "--task", "MRPC", "--train-file",
                                      GLUE / "MRPC" / "train.tsv", "--eval-file", GLUE / "MRPC" / "dev.tsv",
                                      "--output-dir", out, "--max-steps", "2", "--task-id", "4", "--device", "cpu"],
                                     timeout=PROCESS_TIMEOUT)
    assert code == 0, err[-3000:]
    [summary] = [json.loads(line) for line in stdout.splitlines()]
    assert summary["output_dir"] == str(out) and {"eval_accuracy", "eval_f1"} <= set(summary)
    assert sorted(path.name for path in out.parent.iterdir()) == ["mrpc"]  # no other process's staging folder
    classifier = ErnieForSequenceClassification.from_pretrained(out)
    assert classifier.config.num_labels == 2 and (out / "tokenizer.json").is_file()
    encoder = load_file(ernie_folder / "model.safetensors")
    trained = classifier.state_dict()
    assert any(not torch.equal(trained[name], weight) for name, weight in encoder.items() if name in trained)


@pytest.mark.slow
def test_finetune_under_fsdp2_saves_the_whole_trained_classifier_as_ddp_does(tmp_path, ernie_folder):
    """`hf-ext ernie2 finetune` under 2 processes over gloo, sharded by accelerate's FSDP2 plan
    (tests/fsdp2_command.py): both processes exit 0, the main one writes the folder once, the classifier's weights
    whole (gathered from the shards by every process) and equal to the same command's under DDP, as are the
    evaluation's metrics."""
    runs = fsdp2_and_ddp_command_runs(["ernie2", "finetune", ernie_folder, "--task", "MRPC", "--train-file",
                                       GLUE / "MRPC" / "train.tsv", "--eval-file", GLUE / "MRPC" / "dev.tsv",
                                       "--max-steps", "3", "--task-id", "4", "--device", "cpu"], out=tmp_path,
                                      model_class=ErnieForSequenceClassification)
    fsdp2, ddp = runs["fsdp2"], runs["ddp"]
    assert fsdp2["eval_loss"] == pytest.approx(ddp["eval_loss"], rel=TOLERANCE)
    encoder = load_file(ernie_folder / "model.safetensors")
    name = "ernie.encoder.layer.0.output.dense.weight"
    assert name in encoder and not torch.equal(fsdp2["weights"][name], encoder[name])


def test_finetune_feeds_the_task_id_and_reports_glue_metrics(tmp_path, ernie_folder):
    train = tmp_path / "train.tsv"
    train.write_text("sentence\tlabel\n" + "".join(f"{text}\t{label}\n" for text, label in SENTIMENT))
    args = TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=25, per_device_train_batch_size=6,
                             learning_rate=5e-3, logging_steps=5, seed=0, report_to=[], disable_tqdm=True,
                             use_cpu=True, save_strategy="no")
    trainer, metrics = finetune_glue(ernie_folder, "SST-2", train, args, eval_file=train, task_id=5)
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert losses[-1] < losses[0] / 2
    predictions = trainer.predict(trainer.eval_dataset)
    accuracy = float(np.mean(predictions.predictions.argmax(-1) == np.array([label for _, label in SENTIMENT])))
    assert metrics["eval_accuracy"] == accuracy == 1.0
    model = trainer.model.eval()
    batch = trainer.data_collator([trainer.eval_dataset[i] for i in range(len(SENTIMENT))])
    assert batch["task_type_ids"].unique().tolist() == [5]
    with torch.no_grad():
        as_task_5 = model(**batch).logits
        batch["task_type_ids"].fill_(0)
        as_task_0 = model(**batch).logits
    torch.testing.assert_close(as_task_5, torch.as_tensor(predictions.predictions), atol=1e-5, rtol=0)
    assert not torch.allclose(as_task_0, as_task_5)
    with pytest.raises(HfExtError, match="task id 7 is not available: the model has 7 task ids"):
        finetune_glue(ernie_folder, "SST-2", train, args, task_id=7)
    with pytest.raises(HfExtError, match="the evaluation file has no labels"):
        finetune_glue(ernie_folder, "SST-2", train, args, eval_file=GLUE / "SST-2" / "test.tsv")


# ----- the command line --------------------------------------------------------------------------------------------

def test_cli_refuses_bad_input_with_one_line_and_writes_nothing(tmp_path, capsys, tokenizer, ernie_folder,
                                                                converted_fixture):
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps(doc) + "\n" for doc in CORPUS))
    stages = tmp_path / "stages.yml"
    stages.write_text("stages:\n  - steps: {knowledge_masking: 2, discourse_relation: 2}\n")
    out = tmp_path / "out"
    pretraining_folder = tmp_path / "pretraining"
    Ernie2ForPreTraining(tiny_config(tokenizer)).save_pretrained(pretraining_folder)
    cases = [
        (["ernie2", "pretrain", ernie_folder, "--documents", docs, "--stages", stages, "--output-dir", out],
         "the schedule trains discourse_relation: give its labelled pairs with --discourse-pairs"),
        (["ernie2", "pretrain", ernie_folder, "--documents", tmp_path / "none.txt", "--output-dir", out],
         "documents file .*none.txt does not exist"),
        (["ernie2", "pretrain", ernie_folder, "--documents", docs, "--output-dir", out, "--max-length", "65"],
         "--max-length 65 exceeds the model's 64 positions"),
        (["ernie2", "pretrain", pretraining_folder, "--documents", docs, "--output-dir", out, "--max-length", "32",
          "--max-reorder-segments", "2"], "is already an ERNIE 2.0 pre-training model; its task settings stay"),
        (["ernie2", "pretrain", tmp_path, "--documents", docs, "--output-dir", out],
         "cannot load a model config from"),
        (["ernie2", "pretrain", ernie_folder, "--documents", docs, "--output-dir", out, "--batch-size", "0"],
         "argument --batch-size: must be at least 1"),
        (["ernie2", "export", ernie_folder, out], "holds a 'ernie' model, not an ERNIE 2.0 pre-training model"),
        (["ernie2", "finetune", ernie_folder, "--task", "glue", "--train-file", GLUE / "RTE" / "train.tsv",
          "--output-dir", out], "no GLUE TSV layout named 'glue'"),
        (["ernie2", "finetune", converted_fixture, "--task", "RTE", "--train-file", GLUE / "RTE" / "train.tsv",
          "--output-dir", out, "--task-id", "3"], "task id 3 is not available: the model has 3 task ids"),
    ]
    for argv, message in cases:
        code, stdout, stderr = cli_run(capsys, *argv)
        lines = stderr.strip().splitlines()
        assert code != 0 and lines and lines[-1].startswith("hf-ext: error: "), (argv, stderr)
        assert re.search(message, lines[-1]), (message, lines[-1])
        assert not out.exists() and not stdout, argv
    assert sorted(p.name for p in tmp_path.iterdir()) == ["docs.jsonl", "pretraining", "stages.yml"]


def test_cli_pretrains_resumes_exports_and_finetunes(tmp_path, capsys, converted_fixture, tokenizer):
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps(doc) + "\n" for doc in CORPUS))
    stages = tmp_path / "stages.yml"
    stages.write_text("stages:\n  - steps: {knowledge_masking: 2}\n"
                      "  - steps: {knowledge_masking: 1, sentence_distance: 2}\n")
    out = tmp_path / "run"
    argv = ["ernie2", "pretrain", converted_fixture, "--documents", docs, "--stages", stages, "--output-dir", out,
            "--batch-size", "2", "--logging-steps", "1", "--max-length", "32", "--max-reorder-segments", "2"]
    code, stdout, stderr = cli_run(capsys, *argv)
    assert code == 0, stderr
    report = json.loads(stdout)
    assert report["step"] == 3 and report["stage_models"] == [str(out / "stage-1/model"), str(out / "stage-2/model")]
    logs = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    assert [entry["stage"] for entry in logs if "loss" in entry] == [1, 1, 2, 2, 2]
    assert sum("loss_sentence_distance" in entry for entry in logs) == 2
    weights = (out / "ernie" / "model.safetensors").read_bytes()
    pretraining = Ernie2ForPreTraining.from_pretrained(out / "stage-2" / "model")
    assert pretraining.heads.sentence_reordering.out_features == 3
    # a second run finds both stages done and only writes the ernie folder again
    code, stdout, stderr = cli_run(capsys, *argv)
    assert code == 0 and "stage 1/2" not in stderr and (out / "ernie" / "model.safetensors").read_bytes() == weights
    code, stdout, _ = cli_run(capsys, "ernie2", "export", out / "stage-2" / "model", tmp_path / "exported")
    assert code == 0 and (tmp_path / "exported" / "model.safetensors").read_bytes() == weights
    code, stdout, stderr = cli_run(capsys, "ernie2", "finetune", out / "ernie", "--task", "MRPC", "--train-file",
                                   GLUE / "MRPC" / "train.tsv", "--eval-file", GLUE / "MRPC" / "dev.tsv",
                                   "--output-dir", tmp_path / "mrpc", "--max-steps", "2", "--task-id", "4")
    assert code == 0, stderr
    result = json.loads(stdout)
    assert set(result) >= {"eval_accuracy", "eval_f1"} and result["eval_accuracy"] in (0.0, 1.0)
    card = ModelCard.load(tmp_path / "mrpc" / "README.md")
    assert [(r.dataset_type, r.dataset_config, r.dataset_name, r.metric_type, r.metric_value)
            for r in card.data.eval_results] == [("nyu-mll/glue", "mrpc", "MRPC (dev.tsv)", "accuracy",
                                                  result["eval_accuracy"]),
                                                 ("nyu-mll/glue", "mrpc", "MRPC (dev.tsv)", "f1", result["eval_f1"])]
    assert yaml.safe_load((tmp_path / "mrpc" / ".eval_results" / "mrpc.yaml").read_text())[0]["value"] == \
        result["eval_accuracy"]
    classifier = ErnieForSequenceClassification.from_pretrained(tmp_path / "mrpc")
    assert classifier.config.num_labels == 2 and (tmp_path / "mrpc" / "tokenizer.json").is_file()
