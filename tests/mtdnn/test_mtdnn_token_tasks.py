"""MT-DNN's token-level tasks (issue 26 item 3): sequence labeling (NER-style tags, the original's SeqenceLabeling
with SeqCeCriterion), span classification (SQuAD v1.1, SpanCeCriterion) and span classification with unanswerable
questions (SQuAD v2.0, the original's SpanClassificationYN): the task definitions, the data (CoNLL, the original's
Seqence TSV and preprocessed JSON lines, SQuAD JSON and JSON lines), the losses, the per-task evaluation (entity F1,
exact match and F1), the Trainer path, pipelines, the app, ONNX export and the refusals."""

import json
import textwrap

import numpy as np
import pytest
import torch
from torch.nn import functional as F
from transformers import (
    AutoModelForQuestionAnswering,
    AutoModelForTokenClassification,
    BertConfig,
    BertTokenizer,
    TrainingArguments,
    pipeline,
)

import hf_ext  # noqa: F401  (registers the Auto classes)
from hf_ext.errors import HfExtError
from hf_ext.metrics import load_metric
from hf_ext.models.mtdnn import MTDNNConfig, MTDNNModel
from hf_ext.models.mtdnn.data import MTDNNCollator, load_mtdnn_json, load_task_file
from hf_ext.models.mtdnn.task_defs import config_from_task_def_yaml
from hf_ext.models.mtdnn.token_tasks import span_answers
from hf_ext.models.mtdnn.training import MTDNNTrainer, evaluate_task

# the original's definitions (experiments/ner/ner_task_def.yml with a smaller tag set, experiments/squad/
# squad_task_def.yml)
TOKEN_TASK_DEF_YAML = textwrap.dedent("""\
    ner:
      data_format: Seqence
      dropout_p: 0.3
      enable_san: false
      labels: [O, B-PER, I-PER, B-LOC, I-LOC, X, CLS, SEP]
      metric_meta: [SeqEval]
      n_class: 8
      loss: SeqCeCriterion
      kd_loss: MseCriterion
      adv_loss: SymKlCriterion
      split_names: [train, dev, test]
      task_type: SeqenceLabeling
    tags:
      data_format: Seqence
      labels: [O, B-PER, I-PER, B-LOC, I-LOC]
      n_class: 5
      task_type: SeqenceLabeling
    squad:
      data_format: CLUE_SPAN
      dropout_p: 0.1
      enable_san: false
      metric_meta: [EmF1]
      task_type: SpanClassification
      loss: SpanCeCriterion
      kd_loss: MseCriterion
      adv_loss: SymKlCriterion
      n_class: 2
      split_names: [train, dev]
    squad2:
      data_format: CLUE_SPAN
      dropout_p: 0.1
      enable_san: false
      metric_meta: [EmF12]
      task_type: SpanClassificationYN
      loss: SpanCeCriterion
      n_class: 2
    """)
PEOPLE, PLACES = ("john", "mary", "anna", "peter"), ("paris", "london", "rome", "oslo")
WORDS = (*PEOPLE, *PLACES, "went", "to", "the", "city", "of", "when", "where", "did", "go", "who", "?", ".", "new",
         "york", "##s")


def tokenizer():
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]
    return BertTokenizer(vocab={token: index for index, token in enumerate(vocab)})


def token_config(**encoder_changes):
    encoder = BertConfig(**{"vocab_size": 5 + len(WORDS), "hidden_size": 32, "num_hidden_layers": 2,
                            "num_attention_heads": 4, "intermediate_size": 37, "max_position_embeddings": 64,
                            **encoder_changes})
    return config_from_task_def_yaml(TOKEN_TASK_DEF_YAML, encoder)


def token_model(seed=0):
    torch.manual_seed(seed)
    return MTDNNModel(token_config()).eval()


def write_conll(path, sentences):
    path.write_text("-DOCSTART- -X- O O\n\n" + "\n\n".join(
        "\n".join(f"{word} NNP B-NP {tag}" for word, tag in zip(words, tags, strict=True)) for words, tags in sentences)
        + "\n")
    return path


def toy_sentences(count, seed=0):
    """`<person> went to <place>` and `<person> went to new york`: a person's tag is B-PER, a place's B-LOC (new york:
    B-LOC I-LOC)."""
    rng = np.random.default_rng(seed)
    sentences = []
    for _ in range(count):
        person = str(rng.choice(PEOPLE))
        place = [str(rng.choice(PLACES))] if rng.random() < 0.7 else ["new", "york"]
        tags = ["B-LOC"] + ["I-LOC"] * (len(place) - 1)
        sentences.append(([person, "went", "to", *place, "."], ["B-PER", "O", "O", *tags, "O"]))
    return sentences


def toy_questions(count, seed=0, unanswerable=0.0):
    """`<person> went to <place> .`: `where did <person> go ?` -> place, `who went to <place> ?` -> person; with
    `unanswerable`, that share asks `when did <person> go ?`, which the context does not say (no answer)."""
    rng = np.random.default_rng(seed)
    rows = []
    for index in range(count):
        person, place = str(rng.choice(PEOPLE)), str(rng.choice(PLACES))
        context = f"{person} went to {place} ."
        if rng.random() < unanswerable:
            question, answers = f"when did {person} go ?", {"text": [], "answer_start": []}
        elif rng.random() < 0.5:
            question, answers = f"where did {person} go ?", {"text": [place], "answer_start": [context.index(place)]}
        else:
            question, answers = f"who went to {place} ?", {"text": [person], "answer_start": [0]}
        rows.append({"id": f"q{index}", "question": question, "context": context, "answers": answers})
    return rows


def write_jsonl(path, rows):
    path.write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    return path


# ----- task definitions -----------------------------------------------------------------------------------------------

def test_the_originals_token_task_definitions_become_tasks():
    config = token_config()
    ner, tags, squad, squad2 = config.tasks
    assert (ner["type"], ner["num_labels"], ner["data_format"], ner["metrics"], ner["dropout"]) == (
        "sequence_labeling", 8, "Seqence", ["SeqEval"], 0.3)
    assert (tags["metrics"], tags["dropout"]) == (["SeqEval"], 0.1)  # the defaults
    assert (squad["type"], squad["num_labels"], squad["max_answer_length"], squad["metrics"]) == (
        "span_classification", 2, 30, ["EmF1"])
    assert (squad2["type"], squad2["null_score_diff_threshold"], squad2["metrics"]) == (
        "span_classification_yn", 0.0, ["EmF12"])
    assert MTDNNConfig.from_dict(config.to_dict()).tasks == config.tasks


@pytest.mark.parametrize("change, message", [
    ({"loss": "SpanYNCeCriterion"}, "loss SpanYNCeCriterion is not supported for SpanClassificationYN tasks (the port "
     "computes SpanCeCriterion) (the original's SpanYNCeCriterion reads a yes/no output its task never returns)"),
    ({"n_class": 3}, "a span_classification_yn task scores each token as the answer's start and end, so num_labels "
     "must be 2, got 3"),
    ({"data_format": "PremiseOnly"}, "data_format PremiseOnly does not fit a span_classification_yn task"),
    ({"metric_meta": ["ACC"]}, "a span_classification_yn task reports EmF12, not ACC"),
    ({"enable_san": True}, "a SAN head classifies sentence pairs"),
])
def test_a_span_definition_that_does_not_fit_is_one_line(change, message):
    definition = {"data_format": "CLUE_SPAN", "task_type": "SpanClassificationYN", "n_class": 2, **change}
    with pytest.raises(ValueError) as error:
        MTDNNConfig.from_task_defs({"qa": definition}, BertConfig())
    assert message in str(error.value) and "\n" not in str(error.value), error.value


@pytest.mark.parametrize("change, message", [
    ({"labels": None}, "a sequence labeling task needs its tag names (labels), e.g. [O, B-PER, I-PER]"),
    ({"n_class": 4}, "5 label names for 4 labels"),
    ({"labels": ["O", "B-PER", "O", "I-PER", "B-LOC"]}, "label names must be unique"),
    ({"data_format": "PremiseOnly"}, "data_format PremiseOnly does not fit a sequence_labeling task"),
    ({"loss": "CeCriterion"}, "loss CeCriterion is not supported for SeqenceLabeling tasks (the port computes "
     "SeqCeCriterion)"),
])
def test_a_sequence_labeling_definition_that_does_not_fit_is_one_line(change, message):
    definition = {"data_format": "Seqence", "task_type": "SeqenceLabeling", "n_class": 5,
                  "labels": ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"], **change}
    definition = {key: value for key, value in definition.items() if value is not None}
    with pytest.raises(ValueError) as error:
        MTDNNConfig.from_task_defs({"ner": definition}, BertConfig())
    assert message in str(error.value) and "\n" not in str(error.value), error.value


def test_a_sentence_task_cannot_read_token_data():
    with pytest.raises(ValueError, match="data_format Seqence does not fit a classification task"):
        MTDNNConfig(encoder=BertConfig(), tasks=[{"name": "a", "type": "classification", "num_labels": 2,
                                                  "data_format": "Seqence"}])


# ----- heads and losses -----------------------------------------------------------------------------------------------

def test_heads_and_losses_are_the_originals():
    """Sequence labeling: `Linear(dropout(h_t))` per token, SeqCeCriterion (cross-entropy over the labelled tokens);
    span tasks: `Linear(H, 2)` per token split into start and end scores, SpanCeCriterion (half the sum of the start
    and end cross-entropies)."""
    model = token_model()
    batch = tokenizer()(["john went to paris .", "mary went to new york ."], padding=True, return_tensors="pt")
    hidden = model.encode(**batch).last_hidden_state
    tags = torch.tensor([[6, 1, 0, 0, 3, 0, 7, -100], [6, 1, 0, 0, 3, 4, 0, 7]])
    output = model(**batch, task="ner", labels=tags)
    head = model.heads["ner"]
    torch.testing.assert_close(output.logits, hidden @ head.out_proj.weight.T + head.out_proj.bias)
    torch.testing.assert_close(output.loss, F.cross_entropy(output.logits.reshape(-1, 8), tags.view(-1),
                                                            ignore_index=-100))
    spans = torch.tensor([[4, 4], [4, 5]])
    output = model(**batch, task="squad", labels=spans)
    head = model.heads["squad"]
    scores = hidden @ head.out_proj.weight.T + head.out_proj.bias
    torch.testing.assert_close(output.start_logits, scores[..., 0])
    torch.testing.assert_close(output.end_logits, scores[..., 1])
    expected = 0.5 * (F.cross_entropy(scores[..., 0], spans[:, 0]) + F.cross_entropy(scores[..., 1], spans[:, 1]))
    torch.testing.assert_close(output.loss, expected)
    with pytest.raises(ValueError, match="an answer position lies outside the 8 tokens of its row"):
        model(**batch, task="squad", labels=torch.tensor([[4, 4], [4, 8]]))


# ----- data -----------------------------------------------------------------------------------------------------------

def test_conll_words_become_pieces_with_the_originals_tags(tmp_path):
    """A word's tag goes on its first piece; the other pieces and [CLS]/[SEP] get X/CLS/SEP where the task has those
    tags (the original's prepro_std.py), -100 where it does not."""
    sentences = [(["johns", "went", "to", "paris"], ["B-PER", "O", "O", "B-LOC"])]
    path = write_conll(tmp_path / "train.conll", sentences)
    config = token_config()
    ner = load_task_file(path, config, "ner", tokenizer())
    assert tokenizer().convert_ids_to_tokens(ner[0]["input_ids"]) == ["[CLS]", "john", "##s", "went", "to", "paris",
                                                                      "[SEP]"]
    assert ner[0]["labels"] == [6, 1, 5, 0, 0, 3, 7] and ner[0]["task"] == 0
    tags = load_task_file(path, config, "tags", tokenizer())
    assert tags[0]["labels"] == [-100, 1, -100, 0, 0, 3, -100] and tags[0]["task"] == 1
    # the original's Seqence TSV rows give the same
    tsv = tmp_path / "train.tsv"
    tsv.write_text("0\t['B-PER', 'O', 'O', 'B-LOC']\t['johns', 'went', 'to', 'paris']\n")
    assert load_task_file(tsv, config, "tags", tokenizer())[0] == tags[0]


def test_the_originals_preprocessed_tag_rows_load(tmp_path):
    path = write_jsonl(tmp_path / "ner.json", [{"uid": "0", "token_id": [2, 5, 9, 3], "type_id": [0, 0, 0, 0],
                                                "label": [6, 1, 3, 7]},
                                               {"uid": "1", "token_id": [2, 6, 3], "type_id": [0, 0, 0],
                                                "label": [6, -1, 7]}])
    dataset = load_mtdnn_json(path, token_config(), "ner")
    assert dataset["labels"] == [[6, 1, 3, 7], [6, -100, 7]]
    batch = MTDNNCollator()([dataset[0], dataset[1]])
    assert batch["labels"].tolist() == [[6, 1, 3, 7], [6, -100, 7, -100]]


def test_squad_windows_label_the_answer_tokens(tmp_path):
    """Both SQuAD layouts read alike; each window's labels point at the answer's tokens (or the first token where the
    window lacks it), and the offsets give back the answer's text."""
    rows = toy_questions(6, unanswerable=0.5)
    squad_json = {"version": "v2.0", "data": [{"title": "t", "paragraphs": [
        {"context": row["context"], "qas": [{"id": row["id"], "question": row["question"],
                                             "is_impossible": not row["answers"]["text"],
                                             "answers": [{"text": t, "answer_start": s} for t, s in
                                                         zip(*row["answers"].values(), strict=True)]}]}
        for row in rows]}]}
    (tmp_path / "dev.json").write_text(json.dumps(squad_json))
    config = token_config()
    from_json = load_task_file(tmp_path / "dev.json", config, "squad2", tokenizer())
    from_lines = load_task_file(write_jsonl(tmp_path / "dev.jsonl", rows), config, "squad2", tokenizer())
    assert from_json.to_dict() == from_lines.to_dict()
    for window, row in zip(from_lines, rows, strict=True):
        start, end = window["labels"]
        if row["answers"]["text"]:
            assert row["context"][window["offset_mapping"][start][0]:window["offset_mapping"][end][1]] == \
                row["answers"]["text"][0]
        else:
            assert (start, end) == (0, 0)
        assert window["task"] == 3 and window["example_id"] == row["id"]


def test_long_contexts_are_cut_into_overlapping_windows():
    from hf_ext.models.mtdnn.token_tasks import encode_squad_examples

    context = " ".join(["the city of rome"] * 10) + " . john went to oslo ."
    example = {"id": "long", "question": "where did john go ?", "context": context,
               "answers": {"text": ["oslo"], "answer_start": [context.index("oslo")]}}
    windows = encode_squad_examples([example], tokenizer(), max_length=24, doc_stride=8)
    assert len(windows["input_ids"]) > 2 and set(windows["example_id"]) == {"long"}
    holding = [i for i, (start, _) in enumerate(windows["labels"]) if start]
    assert holding and all(windows["labels"][i] == [0, 0] for i in range(len(windows["labels"])) if i not in holding)


@pytest.mark.parametrize("content, task, message", [
    ("john B-PER\nwent O\nto O\nparis B-CITY\n", "tags", "sentence 1: tag(s) 'B-CITY' are not labels of task tags"),
    ("john\n", "tags", "line 1: a word and its tag, separated by white space"),
    ('{"id": "a", "question": "who ?", "context": "john went", "answers": {"text": ["mary"], "answer_start": [0]}}',
     "squad", "the answer 'mary' is not the context's text at answer_start 0 (a span outside the text?)"),
    ('{"id": "a", "question": "who ?", "context": "john", "answers": {"text": ["john"], "answer_start": [3]}}',
     "squad", "is not the context's text at answer_start 3"),
    ('{"id": "a", "question": "who ?", "context": "john", "answers": {"text": [], "answer_start": []}}',
     "squad", "no answer, but task squad is span_classification (SQuAD v1.1: every question has one); use "
     "span_classification_yn for unanswerable questions"),
])
def test_bad_token_data_is_one_line(tmp_path, content, task, message):
    path = tmp_path / ("data.conll" if task == "tags" else "data.jsonl")
    path.write_text(content)
    with pytest.raises(HfExtError) as error:
        load_task_file(path, token_config(), task, tokenizer())
    assert message in str(error.value) and "\n" not in str(error.value), error.value


# ----- evaluation -----------------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_entity_scores_match_the_seqeval_package():
    from conftest import require_extra

    require_extra("test-slow", "seqeval")
    import seqeval.metrics as seqeval

    # IOB2 rows, consecutive chunks of one type (B after B or I), I- opening a chunk, and IOBES rows
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["O", "B-LOC", "I-LOC", "I-LOC", "O", "B-PER"], ["I-PER", "O", "B-LOC"],
            ["B-PER", "B-PER", "I-PER", "O"], ["S-LOC", "B-ORG", "E-ORG", "O"]]
    predicted = [["B-PER", "I-PER", "O", "B-PER"], ["O", "B-LOC", "I-LOC", "O", "O", "I-PER"], ["B-PER", "O", "B-LOC"],
                 ["B-PER", "I-PER", "I-PER", "O"], ["S-LOC", "B-ORG", "I-ORG", "E-ORG"]]
    scores = load_metric("seqeval").compute(predictions=predicted, references=gold)
    assert scores["overall_f1"] == pytest.approx(seqeval.f1_score(gold, predicted))
    assert scores["overall_precision"] == pytest.approx(seqeval.precision_score(gold, predicted))
    assert scores["overall_recall"] == pytest.approx(seqeval.recall_score(gold, predicted))
    assert scores["overall_accuracy"] == pytest.approx(seqeval.accuracy_score(gold, predicted))


def test_entity_scores_by_hand():
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["I-LOC", "I-LOC", "O", "B-PER"]]  # I- after O starts a chunk
    predicted = [["B-PER", "I-PER", "O", "B-PER"], ["B-LOC", "I-LOC", "O", "O"]]
    from hf_ext.metrics.seqeval.seqeval import entities

    assert entities(["B-PER", "B-PER", "I-PER", "O", "I-LOC"]) == [("PER", 0, 0), ("PER", 1, 2), ("LOC", 4, 4)]
    scores = load_metric("seqeval").compute(predictions=predicted, references=gold)
    # gold: PER(0-1), LOC(3), LOC(0-1), PER(3); predicted: PER(0-1), PER(3), LOC(0-1): 2 right of 3 and of 4
    assert (scores["overall_precision"], scores["overall_recall"]) == (pytest.approx(2 / 3), 0.5)
    assert scores["overall_f1"] == pytest.approx(2 * (2 / 3) * 0.5 / (2 / 3 + 0.5))
    assert scores["overall_accuracy"] == pytest.approx(5 / 8)
    assert scores["LOC"] == {"precision": 1.0, "recall": 0.5, "f1": pytest.approx(2 / 3), "number": 2}


def test_squad_scores_are_the_official_scripts():
    squad = load_metric("squad")
    assert squad.compute(predictions=["The Eiffel  tower!", "in paris"], references=[["eiffel tower"], ["paris"]]) \
        == {"exact_match": 50.0, "f1": pytest.approx(100 * (1 + 2 / 3) / 2)}
    v2 = load_metric("squad", config_name="v2").compute(predictions=["", "paris", ""],
                                                         references=[[], ["paris"], ["rome"]])
    assert v2 == {"exact_match": pytest.approx(200 / 3), "f1": pytest.approx(200 / 3), "has_answer_total": 2.0,
                  "has_answer_exact_match": 50.0, "has_answer_f1": 50.0, "no_answer_total": 1.0,
                  "no_answer_exact_match": 100.0, "no_answer_f1": 100.0}


def test_span_answers_take_the_best_span_over_the_windows():
    """The best start+end over an example's windows inside the context, at most max_answer_length tokens; SQuAD v2.0
    answers nothing where the first token's score beats it by more than the threshold."""
    context = "john went to paris ."
    windows = {"example_id": ["a", "a"], "context": [context] * 2, "answers": [["paris"]] * 2,
               "offset_mapping": [[[-1, -1], [0, 4], [5, 9], [-1, -1]], [[-1, -1], [10, 12], [13, 18], [19, 20]]]}
    logits = np.full((2, 4, 2), -5.0)
    logits[0, 1] = [3.0, 1.0]  # window 0: "john" scores 4
    logits[1, 2] = [2.0, 2.5]  # window 1: "paris" scores 4.5
    logits[1, 1, 0] = 4.0  # "to paris" scores 6.5 ...
    spec = {"type": "span_classification", "max_answer_length": 30}
    assert span_answers(spec, logits, windows) == ({"a": "to paris"}, {"a": ["paris"]})
    assert span_answers({**spec, "max_answer_length": 1}, logits, windows)[0] == {"a": "paris"}  # ... unless too long
    null = {"type": "span_classification_yn", "max_answer_length": 1, "null_score_diff_threshold": 0.0}
    logits[:, 0] = 2.2  # the no-answer score: 4.4 in both windows, below "paris"
    assert span_answers(null, logits, windows)[0] == {"a": "paris"}
    logits[0, 0] = 3.0  # 6 in window 0, but the lowest over the windows counts
    assert span_answers(null, logits, windows)[0] == {"a": "paris"}
    logits[1, 0] = 3.0
    assert span_answers(null, logits, windows)[0] == {"a": ""}
    assert span_answers({**null, "null_score_diff_threshold": 2.0}, logits, windows)[0] == {"a": "paris"}


def test_evaluation_leaves_out_the_originals_piece_and_special_tags():
    spec = token_config().task("ner")
    labels = np.array([[6, 1, 5, 0, 3, 7, -100]])
    logits = np.full((1, 7, 8), -1.0)
    for position, tag in enumerate([7, 1, 0, 0, 4, 5, 0]):  # special tags predicted where they are not scored
        logits[0, position, tag] = 1.0
    scores = evaluate_task(spec, logits, labels)
    # scored words: john (B-PER), went (O), paris (B-LOC predicted as I-LOC, which starts a LOC chunk after O)
    assert scores == {"precision": 1.0, "recall": 1.0, "f1": 1.0, "accuracy": pytest.approx(2 / 3)}


# ----- training -------------------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_trainer_learns_tags_and_answers_and_reports_their_metrics(tmp_path):
    """A few hundred steps over toy NER and toy SQuAD v2.0 data: the losses fall and the per-task metrics are the
    evaluation's."""
    config = token_config()
    train = {"tags": load_task_file(write_conll(tmp_path / "ner.conll", toy_sentences(160)), config, "tags",
                                    tokenizer()),
             "squad2": load_task_file(write_jsonl(tmp_path / "squad.jsonl", toy_questions(160, unanswerable=0.3)),
                                      config, "squad2", tokenizer())}
    evaluation = {"tags": load_task_file(write_conll(tmp_path / "dev.conll", toy_sentences(40, seed=1)), config,
                                         "tags", tokenizer()),
                  "squad2": load_task_file(write_jsonl(tmp_path / "dev.jsonl", toy_questions(40, 1, 0.3)), config,
                                           "squad2", tokenizer())}
    torch.manual_seed(0)
    model = MTDNNModel(config)
    args = TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=300, per_device_train_batch_size=16,
                             learning_rate=3e-3, warmup_steps=0.1, report_to=[], save_strategy="no", use_cpu=True,
                             logging_steps=300, disable_tqdm=True, seed=0)
    trainer = MTDNNTrainer(model=model, args=args, train_dataset=train, eval_dataset=evaluation,
                           optimizer_name="adamax")
    before = trainer.evaluate()
    trainer.train()
    after = trainer.evaluate()
    assert after["eval_tags_loss"] < 0.1 * before["eval_tags_loss"]
    assert after["eval_squad2_loss"] < 0.5 * before["eval_squad2_loss"]
    assert after["eval_tags_f1"] > 0.95 > before["eval_tags_f1"]
    assert after["eval_squad2_exact_match"] > max(70, before["eval_squad2_exact_match"] + 40)
    assert {"eval_squad2_f1", "eval_squad2_has_answer_exact_match", "eval_squad2_no_answer_exact_match",
            "eval_tags_precision", "eval_tags_recall", "eval_tags_accuracy"} <= set(after)


def test_smart_and_distillation_keep_to_sentence_level_tasks(tmp_path):
    from hf_ext.models.mtdnn.distillation import teacher_soft_labels
    from hf_ext.models.mtdnn.smart import SmartSettings, adversarial_loss

    config = token_config()
    model = MTDNNModel(config)
    dataset = load_task_file(write_conll(tmp_path / "ner.conll", toy_sentences(4)), config, "tags", tokenizer())
    batch = MTDNNCollator()([dataset[i] for i in range(4)])
    with pytest.raises(ValueError, match="SMART covers classification, regression, ranking tasks, as the original's "
                                         "SmartPerturbation; task tags is sequence_labeling"):
        adversarial_loss(model, config.task("tags"), model(**batch).logits, batch, SmartSettings())
    with pytest.raises(ValueError, match="task tags is sequence_labeling"):
        MTDNNTrainer(model=model, args=TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[]),
                     train_dataset={"tags": dataset}, smart=SmartSettings())
    with pytest.raises(HfExtError, match="task tags is a sequence_labeling task: distillation covers sentence-level"):
        teacher_soft_labels([model], dataset, "tags")


# ----- the transformers classes, the app, ONNX ------------------------------------------------------------------------

def test_token_and_span_tasks_as_transformers_classes(tmp_path):
    """`AutoModelForTokenClassification` (with the token-classification pipeline) and `AutoModelForQuestionAnswering`
    (transformers 5 has no question-answering pipeline) run one task of the multi-task model."""
    model = token_model()
    model.save_pretrained(tmp_path)
    tokenizer().save_pretrained(tmp_path)
    tagger = AutoModelForTokenClassification.from_pretrained(tmp_path, default_task="tags").eval()
    assert tagger.task == "tags" and tagger.config.id2label[3] == "B-LOC"
    batch = tokenizer()("john went to paris", return_tensors="pt")
    with torch.no_grad():
        torch.testing.assert_close(tagger(**batch).logits, model(**batch, task="tags").logits)
    entities = pipeline("token-classification", model=tagger, tokenizer=tokenizer())("john went to paris")
    assert [entity["word"] for entity in entities] == [w for w, tag in zip(
        ["john", "went", "to", "paris"], model(**batch, task="tags").logits[0, 1:-1].argmax(-1).tolist(), strict=True)
        if tag != 0]

    reader = AutoModelForQuestionAnswering.from_pretrained(tmp_path).eval()
    assert reader.task == "squad"  # the first span task
    pair = tokenizer()("where did john go ?", "john went to paris .", return_tensors="pt")
    with torch.no_grad():
        output = reader(**pair, start_positions=torch.tensor([8]), end_positions=torch.tensor([8]))
        expected = model(**pair, task="squad", labels=torch.tensor([[8, 8]]))
    torch.testing.assert_close(output.start_logits, expected.start_logits)
    torch.testing.assert_close(output.loss, expected.loss)
    with pytest.raises(ValueError, match="task squad is a span_classification task, not a sequence labeling task"):
        AutoModelForTokenClassification.from_pretrained(tmp_path, default_task="squad")


def test_the_app_tags_words_and_answers_questions():
    from hf_ext.models.mtdnn.app import MTDNNApp

    model = token_model()
    app = MTDNNApp(model, tokenizer())
    predictions = app.predict("johns went to new york", "")
    batch = tokenizer()("johns went to new york", return_tensors="pt")
    with torch.no_grad():
        tags = model(**batch, task="tags").logits[0].argmax(-1).tolist()  # [CLS] john ##s went to new york [SEP]
    names = model.config.task("tags")["labels"]
    assert predictions["tags"]["tags"] == [[word, names[tags[position]]] for word, position in
                                           zip(["johns", "went", "to", "new", "york"], [1, 3, 4, 5, 6], strict=True)]
    assert predictions["squad"] == {"type": "span_classification",
                                    "needs": "a question and a context (the text pair)"}
    answered = app.predict("where did john go ?", "john went to paris .")
    assert answered["squad"]["answer"] in "john went to paris ."
    assert MTDNNApp.views({"t": {"entities": [{"type": "PER", "text": "john"}]}, "q": {"answer": ""}}, ["t", "q"]) \
        == ["PER: john", "no answer"]


@pytest.mark.slow
def test_token_heads_export_to_onnx(tmp_path):
    from conftest import require_extra

    require_extra("onnx", "onnx", "onnxruntime", "onnxscript")
    from hf_ext.onnx_export import export_onnx, session

    model = token_model()
    model.save_pretrained(tmp_path / "model")
    report = export_onnx(tmp_path / "model", tmp_path / "onnx")
    assert report["graphs"][0]["outputs"] == [f"logits_{name}" for name in model.config.task_names]
    batch = tokenizer()(["john went to paris .", "who went to rome ?"], ["mary", "oslo ."], padding=True,
                        return_tensors="np")
    outputs = session(tmp_path / "onnx" / "model.onnx").run(None, {key: batch[key] for key in
                                                                   ("input_ids", "attention_mask", "token_type_ids")})
    with torch.no_grad():
        for name, values in zip(model.config.task_names, outputs, strict=True):
            expected = model(**{key: torch.from_numpy(value) for key, value in batch.items()}, task=name).logits
            np.testing.assert_allclose(values, expected.numpy(), atol=1e-4, rtol=0)


@pytest.mark.slow
def test_the_cli_trains_token_tasks_on_a_new_encoder(tmp_path, capsys):
    """`hf-ext mtdnn train ENCODER --task-def YAML` with CoNLL and SQuAD data: per-task evaluation, the best
    checkpoint by a span metric, and a folder that loads as the token classifier and the question-answering model."""
    from transformers import BertModel

    from hf_ext.cli import main

    encoder = tmp_path / "encoder"
    BertModel(token_config().encoder).save_pretrained(encoder)
    tokenizer().save_pretrained(encoder)
    (tmp_path / "tasks.yml").write_text(TOKEN_TASK_DEF_YAML)
    write_conll(tmp_path / "ner.conll", toy_sentences(64))
    write_conll(tmp_path / "ner_dev.conll", toy_sentences(16, seed=1))
    write_jsonl(tmp_path / "qa.jsonl", toy_questions(64))
    write_jsonl(tmp_path / "qa_dev.jsonl", toy_questions(16, seed=1))
    out = tmp_path / "out"
    code = main(["mtdnn", "train", str(encoder), "--task-def", str(tmp_path / "tasks.yml"),
                 "--train", f"tags={tmp_path / 'ner.conll'}", "--train", f"squad={tmp_path / 'qa.jsonl'}",
                 "--eval", f"tags={tmp_path / 'ner_dev.conll'}", "--eval", f"squad={tmp_path / 'qa_dev.jsonl'}",
                 "--max-steps", "20", "--eval-steps", "10", "--batch-size", "8", "--learning-rate", "1e-3",
                 "--metric-for-best-model", "squad_f1", "--output-dir", str(out), "--max-length", "32"])
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    assert {"eval_tags_f1", "eval_tags_precision", "eval_squad_exact_match", "eval_squad_f1"} <= set(summary["eval"])
    config = json.loads((out / "config.json").read_text())
    assert [task["name"] for task in config["tasks"]] == ["tags", "squad"]
    assert AutoModelForTokenClassification.from_pretrained(out).task == "tags"
    assert AutoModelForQuestionAnswering.from_pretrained(out).task == "squad"
