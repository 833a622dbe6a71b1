"""MT-DNN training streamed from text (`data.read_task_stream` on GLUE TSV, Seqence TSV, CoNLL and SQuAD shards,
`hf-ext mtdnn train --streaming`): the streamed rows against the map-style readers' (`data.load_task_file`) for
every format, QNLI ranking groups paired file by file and split between processes by whole groups, an exact
mid-stream resume of SQuAD windows, TSV rows and ranking groups, damaged TSV shards named by file and line, and the
command on TSV shards with a falling loss that stops at a damaged shard with one line and resumes, and on a ranking
task's TSV shards."""

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import cli_run
from datasets.distributed import split_dataset_by_node
from transformers import BertConfig, BertTokenizer

from hf_ext.errors import HfExtError
from hf_ext.models.mtdnn import MTDNNModel
from hf_ext.models.mtdnn.data import STREAM_COLUMNS, load_task_file, read_task_stream, stream_corpus_error
from hf_ext.models.mtdnn.task_defs import config_from_task_def_yaml
from hf_ext.streaming import MalformedRowError

TASK_DEF = """\
sst:
  data_format: PremiseOnly
  labels: [negative, positive]
  n_class: 2
  task_type: Classification
cola:
  data_format: PremiseOnly
  n_class: 2
  task_type: Classification
mnli:
  data_format: PremiseAndOneHypothesis
  labels: [contradiction, neutral, entailment]
  n_class: 3
  task_type: Classification
stsb:
  data_format: PremiseAndOneHypothesis
  n_class: 1
  task_type: Regression
ner:
  data_format: Seqence
  labels: [O, B-PER, B-LOC, X]
  n_class: 4
  task_type: SeqenceLabeling
squad:
  data_format: CLUE_SPAN
  n_class: 2
  task_type: SpanClassification
"""
RANKING_TASK_DEF = """\
qnnli:
  data_format: PremiseAndMultiHypothesis
  labels: [not_entailment, entailment]
  n_class: 1
  task_type: Ranking
"""
PEOPLE, PLACES = ("john", "mary", "anna", "johns"), ("paris", "rome", "oslo", "london")  # johns: john ##s
WORDS = (*PEOPLE[:3], *PLACES, "went", "to", "the", "a", "city", "good", "bad", "film", "where", "did", "go", "?", ".",
         "##s", '"', "na", "123")
GLUE_SAMPLES = Path(__file__).parents[1] / "data" / "glue_samples"
MAX_LENGTH, DOC_STRIDE = 24, 8  # SQuAD contexts longer than a window: several windows per question


def tokenizer():
    return BertTokenizer(vocab={word: i for i, word in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", *WORDS])})


def config(ranking=False):
    """The tasks of TASK_DEF, and the ranking task qnnli after them where `ranking`."""
    encoder = BertConfig(vocab_size=4 + len(WORDS), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=24, max_position_embeddings=64)
    return config_from_task_def_yaml(TASK_DEF + (RANKING_TASK_DEF if ranking else ""), encoder)


def sentence(rng, words=5):
    return " ".join(str(rng.choice(WORDS[:-5])) for _ in range(words))


def glue_rows(task, count, seed=0):
    """The header (None: CoLA's headerless files) and `count` rows of a GLUE TSV file of `task`, with text that a
    CSV reader could take for something else: quotes, NA, a number, an empty field."""
    rng = np.random.default_rng(seed)
    odd = ['"good" film', 'a "bad" film', "NA", "123", "null"]
    rows = []
    for n in range(count):
        text = odd[n % len(odd)] if n % 3 == 0 else sentence(rng)
        if task == "sst":
            rows.append([text, str(n % 2)])
        elif task == "cola":
            rows.append(["gj04", str(n % 2), "" if n % 2 else "*", text])
        elif task == "mnli":
            rows.append([str(n), text, sentence(rng), "-" if n % 5 == 4 else ["contradiction", "neutral",
                                                                              "entailment"][n % 3]])
        else:
            rows.append([str(n), text, sentence(rng), f"{n % 5}.{n % 3}00"])
    header = {"sst": ["sentence", "label"], "cola": None, "mnli": ["index", "sentence1", "sentence2", "gold_label"],
              "stsb": ["index", "sentence1", "sentence2", "score"]}[task]
    return header, rows


def tagged_sentences(count, seed=0):
    rng = np.random.default_rng(seed)
    return [([str(rng.choice(PEOPLE)), "went", "to", str(rng.choice(PLACES)), "."], ["B-PER", "O", "O", "B-LOC", "O"])
            for _ in range(count)]


def squad_questions(count, seed=0):
    """Questions on contexts of some 30 tokens (several windows of MAX_LENGTH), each with an answer."""
    rng = np.random.default_rng(seed)
    questions = []
    for n in range(count):
        person, place = str(rng.choice(PEOPLE[:3])), str(rng.choice(PLACES))
        context = f"{sentence(rng, 12)} . {person} went to {place} . {sentence(rng, 12)} ."
        questions.append({"id": f"q{n}", "question": f"where did {person} go ?", "context": context,
                          "answers": {"text": [place], "answer_start": [context.index(f" {place} .") + 1]}})
    return questions


def squad_document(questions):
    return {"version": "1.1", "data": [{"title": q["id"], "paragraphs": [{"context": q["context"], "qas": [{
        "id": q["id"], "question": q["question"], "answers": [
            {"text": t, "answer_start": s} for t, s in zip(q["answers"]["text"], q["answers"]["answer_start"],
                                                         strict=True)]}]}]} for q in questions]}


def write_task(folder, task, fmt, shards=2, per_shard=7):
    """`(folder of `shards` shards, the same data as one file)` of `task` in format `fmt`."""
    folder.mkdir(parents=True)
    count = shards * per_shard
    parts = [slice(i * per_shard, (i + 1) * per_shard) for i in range(shards)]
    if fmt == "glue":
        header, rows = glue_rows(task, count)
        lines = ["\t".join(row) for row in rows]
        head = ["\t".join(header)] if header else []
        texts = ["\n".join([*head, *lines[part]]) + "\n" for part in parts]
        whole = "\n".join([*head, *lines]) + "\n"
        # the first shard starts with a byte-order mark and ends its lines with CRLF, as some GLUE files do
        texts[0] = "\ufeff" + texts[0].replace("\n", "\r\n")
        suffix = ".tsv"
    elif fmt == "seqence":
        lines = [f"{n}\t{tags!r}\t{words!r}" for n, (words, tags) in enumerate(tagged_sentences(count))]
        texts = ["\n".join(lines[part]) + "\n" for part in parts]
        whole, suffix = "\n".join(lines) + "\n", ".tsv"
    elif fmt == "conll":
        blocks = ["\n".join(f"{w} NNP B-NP {t}" for w, t in zip(words, tags, strict=True))
                  for words, tags in tagged_sentences(count)]
        # a blank line of spaces between two sentences, -DOCSTART- lines, CRLF in the second shard
        texts = ["-DOCSTART- -X- O O\n\n" + "\n  \n".join(blocks[part]) + "\n" for part in parts]
        whole = "".join(texts)
        texts[1] = texts[1].replace("\n", "\r\n")
        suffix = ".conll"
    elif fmt == "squad_document":
        questions = squad_questions(count)
        texts = [json.dumps(squad_document(questions[part]), indent=1 if i else None) for i, part in enumerate(parts)]
        whole, suffix = json.dumps(squad_document(questions)), ".json"
    else:  # SQuAD rows in the Hub's layout
        lines = [json.dumps(question) for question in squad_questions(count)]
        texts = ["\n".join(lines[part]) + "\n" for part in parts]
        whole, suffix = "\n".join(lines) + "\n", ".jsonl"
    for i, text in enumerate(texts):
        (folder / f"shard-{i}{suffix}").write_text(text, encoding="utf-8", newline="")
    (folder.parent / f"{folder.name}-whole{suffix}").write_text(whole, encoding="utf-8")
    return folder, folder.parent / f"{folder.name}-whole{suffix}"


def stream(source, task, **kwargs):
    return read_task_stream(source, config(ranking=task == "qnnli"), task, tokenizer(), MAX_LENGTH,
                            doc_stride=DOC_STRIDE, **kwargs)


@pytest.mark.parametrize("task, fmt", [("sst", "glue"), ("cola", "glue"), ("mnli", "glue"), ("stsb", "glue"),
                                       ("ner", "seqence"), ("ner", "conll"), ("squad", "squad_document"),
                                       ("squad", "squad_rows")])
def test_streamed_text_rows_are_the_map_style_rows(tmp_path, task, fmt):
    shards, whole = write_task(tmp_path / task, task, fmt)
    expected = list(load_task_file(whole, config(), task, tokenizer(), MAX_LENGTH, doc_stride=DOC_STRIDE)
                    .select_columns(list(STREAM_COLUMNS)))
    streamed = list(stream(shards, task))
    assert streamed == expected and expected
    assert list(stream(f"{shards}/shard-*", task)) == expected  # a glob
    if task == "mnli":  # rows without a gold label are left out, as the map-style reader does
        assert len(streamed) == sum(row[-1] != "-" for row in glue_rows(task, 14)[1])
    if task == "squad":  # a question gives several windows: the map emits more rows than it reads
        assert len(streamed) > len(squad_questions(14))
    if task == "ner":  # johns -> john ##s: the continuation piece has the X tag
        assert any(3 in row["labels"] for row in streamed)


def qnli_lines(count, seed=0):
    """`count` rows of a QNLI TSV file without its header: pairs of rows with one question, one sentence entailed and
    one not, in either order, with text that a CSV reader could take for something else (quotes, NA, a number);
    every fourth pair does not fit the ranking (two questions, or two entailed sentences)."""
    rng = np.random.default_rng(seed)
    odd = ['"good" film', "NA", "123"]
    lines = []
    for pair in range(-(-count // 2)):
        person, entailed_first = str(rng.choice(PEOPLE[:3])), rng.random() < 0.5
        for second in (False, True):
            n = 2 * pair + second
            entailed = entailed_first != second
            question = f"where did {person} go ?" + (" ?" if pair % 8 == 3 and second else "")  # two questions
            label = "entailment" if entailed or pair % 8 == 7 else "not_entailment"  # 7: two entailed
            text = odd[n % 3] if n % 5 == 0 else f"{person if entailed else 'anna'} went to {rng.choice(PLACES)} ."
            lines.append(f"{n}\t{question}\t{text}\t{label}")
    return lines[:count]


def qnli_shards(folder, sizes=(9, 12)):
    """A folder of QNLI TSV shards of `sizes` rows (an odd number in the first: its last row pairs with no other)."""
    folder.mkdir(parents=True)
    for shard, size in enumerate(sizes):
        lines = ["index\tquestion\tsentence\tlabel", *qnli_lines(size, seed=shard)]
        (folder / f"shard-{shard}.tsv").write_text("\n".join(lines) + "\n")
    return folder


def test_streamed_ranking_groups_are_the_map_style_groups_of_each_file(tmp_path):
    """A ranking task's TSV rows stream as `load_task_file` pairs them (the original's QNLI ranking), file by file:
    the groups of a folder of shards are those of each shard read alone, not those of the shards put end to end."""
    shards = qnli_shards(tmp_path / "qnnli")
    expected = [row for shard in sorted(shards.iterdir())
                for row in load_task_file(shard, config(True), "qnnli", tokenizer(), MAX_LENGTH)]
    streamed = list(stream(shards, "qnnli"))
    assert streamed == expected
    # the pairing kept 8 of 10 pairs, both orders of the candidates, one group per row
    assert len(streamed) == 8 and {row["labels"] for row in streamed} == {0, 1}
    assert all(len(row["input_ids"]) == 2 for row in streamed)
    whole = tmp_path / "qnnli-whole.tsv"
    whole.write_text("".join(shard.read_text().split("\n", 1)[1] if i else shard.read_text()
                             for i, shard in enumerate(sorted(shards.iterdir()))))
    assert list(load_task_file(whole, config(True), "qnnli", tokenizer(), MAX_LENGTH)) != streamed
    one = shards / "shard-1.tsv"
    assert list(stream(one, "qnnli")) == list(load_task_file(one, config(True), "qnnli", tokenizer(), MAX_LENGTH))
    sample = GLUE_SAMPLES / "QNLI" / "train.tsv"  # one row: no pair, in either reader
    with pytest.raises(HfExtError, match=re.escape(f"GLUE file {sample} has no pair of rows with one question and "
                                                   "one positive and one negative candidate")):
        load_task_file(sample, config(True), "qnnli", tokenizer(), MAX_LENGTH)
    with pytest.raises(HfExtError, match=re.escape(f"qnnli training data {sample} has no pair of rows with one "
                                                   "question and one positive and one negative candidate")):
        list(stream(sample, "qnnli"))


@pytest.mark.parametrize("sizes", [(9, 12), (9, 12, 6)])
def test_two_processes_split_a_ranking_stream_by_whole_groups(tmp_path, sizes):
    """Two ranks (`split_dataset_by_node`, as `hf_ext.streaming.split_for_process` splits a stream) read disjoint
    groups that together are the single process's: whole shards where their number divides by the ranks, else every
    other group."""
    shards = qnli_shards(tmp_path / "qnnli", sizes)
    single = list(stream(shards, "qnnli"))
    ranks = [list(split_dataset_by_node(stream(shards, "qnnli"), rank=rank, world_size=2)) for rank in (0, 1)]
    assert all(ranks) and sorted(map(json.dumps, ranks[0] + ranks[1])) == sorted(map(json.dumps, single))
    if len(sizes) == 3:  # every other group
        assert ranks[0] == single[::2] and ranks[1] == single[1::2]
    else:  # a shard each
        assert ranks[0] + ranks[1] == single and len(ranks[0]) == len(list(stream(shards / "shard-0.tsv", "qnnli")))


@pytest.mark.parametrize("task, fmt", [("squad", "squad_document"), ("sst", "glue"), ("qnnli", "qnli")])
def test_a_text_stream_resumes_exactly_from_its_state(tmp_path, task, fmt):
    shards = qnli_shards(tmp_path / task, (151, 60)) if fmt == "qnli" else write_task(tmp_path / task, task, fmt)[0]
    whole = list(stream(shards, task))
    for taken in (1, len(whole) // 2, len(whole) - 1):
        first = stream(shards, task)
        rows = iter(first)
        head = [next(rows) for _ in range(taken)]
        state = first.state_dict()
        resumed = stream(shards, task)
        resumed.load_state_dict(state)
        assert head + list(resumed) == whole, taken


def test_a_damaged_tsv_shard_is_named_by_file_and_line(tmp_path):
    shards, _ = write_task(tmp_path / "sst", "sst", "glue")
    bad = shards / "shard-1.tsv"
    lines = bad.read_text().splitlines()
    for damaged, fields in [("a film with no label", 1), ("a film\t1\textra", 3)]:
        bad.write_text("\n".join([*lines[:3], damaged, *lines[3:]]) + "\n")
        with pytest.raises(Exception) as failure:  # the reader's own error, not a row check's
            list(stream(shards, "sst"))
        assert not isinstance(failure.value, HfExtError)
        assert isinstance(failure.value, MalformedRowError) == (fields == 1)
        assert str(stream_corpus_error([("sst", shards)], config(), failure.value)) == (
            f"training data {bad}, line 4: {fields} tab-separated fields where its first line has 2")
    bad.write_text("\n".join([*lines[:3], "a film\tmaybe", *lines[3:]]) + "\n")
    with pytest.raises(HfExtError, match=re.escape("sst training data, the row whose sentence is 'a film': label "
                                                   "'maybe' is not one of negative, positive or a class id below 2")):
        list(stream(shards, "sst"))
    with pytest.raises(HfExtError, match=re.escape(f"{shards}: TSV data needs a tokenizer")):
        read_task_stream(shards, config(), "sst")


def learnable_shards(folder, task, shards, per_shard):
    """GLUE shards whose labels follow from one word: sst's from good/bad, stsb's score from the second sentence's
    place."""
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True)
    for shard in range(shards):
        lines = ["sentence\tlabel" if task == "sst" else "index\tsentence1\tsentence2\tscore"]
        for n in range(per_shard):
            if task == "sst":
                lines.append(f"{sentence(rng, 3)} {('bad', 'good')[n % 2]} film\t{n % 2}")
            else:
                place = n % 4
                lines.append(f"{n}\t{sentence(rng, 3)}\t{sentence(rng, 2)} {PLACES[place]}\t{place}.0")
        (folder / f"shard-{shard}.tsv").write_text("\n".join(lines) + "\n")
    return folder


@pytest.mark.slow
def test_the_command_streams_tsv_shards_with_a_falling_loss_and_resumes_after_a_damaged_shard(tmp_path, capsys):
    sources = {task: learnable_shards(tmp_path / task, task, 2, 100) for task in ("sst", "stsb")}
    bad = sources["sst"] / "shard-1.tsv"
    lines = bad.read_text().splitlines()
    bad.write_text("\n".join([*lines[:4], "a film with no label", *lines[4:]]) + "\n")
    folder = tmp_path / "model"
    torch.manual_seed(0)
    MTDNNModel(config()).save_pretrained(folder)
    tokenizer().save_pretrained(folder)
    out = tmp_path / "out"
    argv = ["mtdnn", "train", folder, *(f"--train={task}={source}" for task, source in sources.items()),
            "--streaming", "--max-steps", "60", "--batch-size", "4", "--learning-rate", "1e-2", "--logging-steps",
            "10", "--save-steps", "40", "--output-dir", out]
    code, _, err = cli_run(capsys, "--quiet", *argv)
    last = err.strip().splitlines()[-1]
    match = re.fullmatch(rf"hf-ext: error: cannot read the stream: training data {re.escape(str(bad))}, line 5: 1 "
                         r"tab-separated fields where its first line has 2; the (\d+) steps trained are kept in (.+): "
                         "correct the data and run the same command to resume", last)
    assert code == 1 and match, last
    kept = int(match.group(1))
    checkpoints = tmp_path / "out-checkpoints"
    # sst's first shard (100 rows, read 64 at a time: the second batch reaches the damaged shard) lasts some steps
    assert 0 < kept < 60 and match.group(2) == str(checkpoints / f"checkpoint-{kept}")
    assert (checkpoints / f"checkpoint-{kept}" / "stream_state-rank0.json").is_file() and not out.exists()
    bad.write_text("\n".join(lines) + "\n")
    code, stdout, err = cli_run(capsys, "--quiet", *argv)
    assert code == 0, err
    assert json.loads(stdout)["steps"] == 60 and not checkpoints.exists()
    windows = [entry for entry in json.loads((out / "log_history.json").read_text()) if "loss" in entry]
    assert len(windows) == 6 and windows[-1]["loss"] < 0.5 * windows[0]["loss"], windows


def test_a_damaged_ranking_shard_is_named_by_file_and_line(tmp_path):
    shards = qnli_shards(tmp_path / "qnnli")
    bad = shards / "shard-1.tsv"
    lines = bad.read_text().splitlines()
    for damaged, fields in [("9\twhere did john go ?\tjohn went to rome .", 3), (f"{lines[3]}\textra", 5)]:
        bad.write_text("\n".join([*lines[:3], damaged, *lines[3:]]) + "\n")
        with pytest.raises(Exception) as failure:  # the reader's own error, not a row check's
            list(stream(shards, "qnnli"))
        assert not isinstance(failure.value, HfExtError)
        assert isinstance(failure.value, MalformedRowError) == (fields == 3)
        assert str(stream_corpus_error([("qnnli", shards)], config(True), failure.value)) == (
            f"training data {bad}, line 4: {fields} tab-separated fields where its first line has 4")
    bad.write_text("\n".join([*lines[:3], "9\twhere ?\tjohn\tmaybe", *lines[3:]]) + "\n")
    with pytest.raises(HfExtError, match=re.escape("qnnli training data, the row whose question is 'where ?': label "
                                                   "'maybe' is not one of not_entailment, entailment or a class id "
                                                   "below 2")):
        list(stream(shards, "qnnli"))


@pytest.mark.slow
def test_the_command_streams_a_ranking_tasks_tsv_shards_with_a_falling_loss(tmp_path, capsys):
    """`hf-ext mtdnn train --streaming` of the QNLI ranking from TSV shards: the entailed sentence of each pair says
    "good", the other "bad"."""
    rng = np.random.default_rng(0)
    folder = tmp_path / "qnnli"
    folder.mkdir()
    for shard in range(2):
        lines = ["index\tquestion\tsentence\tlabel"]
        for n in range(0, 120, 2):
            question = f"where did {rng.choice(PEOPLE[:3])} go ?"
            pair = [(f"{sentence(rng, 3)} good", "entailment"), (f"{sentence(rng, 3)} bad", "not_entailment")]
            lines += [f"{n + i}\t{question}\t{text}\t{label}" for i, (text, label) in
                      enumerate(pair[::-1] if rng.random() < 0.5 else pair)]
        (folder / f"shard-{shard}.tsv").write_text("\n".join(lines) + "\n")
    model = tmp_path / "model"
    torch.manual_seed(0)
    MTDNNModel(config(ranking=True)).save_pretrained(model)
    tokenizer().save_pretrained(model)
    out = tmp_path / "out"
    code, stdout, err = cli_run(capsys, "--quiet", "mtdnn", "train", model, f"--train=qnnli={folder}", "--streaming",
                                "--max-steps", "40", "--batch-size", "4", "--learning-rate", "1e-2",
                                "--logging-steps", "10", "--output-dir", out)
    assert code == 0, err
    assert json.loads(stdout)["steps"] == 40
    windows = [entry for entry in json.loads((out / "log_history.json").read_text()) if "loss" in entry]
    assert len(windows) == 4 and windows[-1]["loss"] < 0.2 * windows[0]["loss"], windows
