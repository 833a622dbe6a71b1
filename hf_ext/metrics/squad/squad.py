"""SQuAD's exact match and F1 of predicted answer texts, as the official evaluation scripts compute them (v1.1:
`evaluate-v1.1.py`; v2.0, where a question may have no answer: `evaluate-v2.0.py`), in plain Python so that
`evaluate.load(path)` works offline.

MT-DNN's original reports these for its span tasks (`data_utils/metrics.py` `compute_emf1` / `compute_emf12`, which
call the official scripts' functions). Nothing here is specific to one model.
"""

import collections
import re
import string

import datasets
import evaluate

_DESCRIPTION = """
Exact match and F1 of predicted answers against the gold answers of each question (the best over the gold answers),
in percent, as SQuAD's official scripts report them. Answers are compared after normalisation (lower case, no
punctuation, no articles `a`/`an`/`the`, single spaces); F1 counts the shared tokens.

- config `v1` (default, SQuAD v1.1): every question has gold answers.
- config `v2` (SQuAD v2.0): a question without gold answers expects the empty answer ""; the result adds the scores
  over the answerable (`has_answer_*`) and unanswerable (`no_answer_*`) questions and their counts.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list[str]`): the predicted answer of each question ("" for no answer).
    references (`list[list[str]]`): the gold answers of each question (an empty list: no answer, v2 only).
Returns:
    `exact_match` and `f1` (percent); with config `v2` also `has_answer_exact_match`, `has_answer_f1`,
    `has_answer_total`, `no_answer_exact_match`, `no_answer_f1`, `no_answer_total`.
Example:
    >>> squad = evaluate.load("hf_ext/metrics/squad/squad.py")
    >>> squad.compute(predictions=["the Eiffel tower"], references=[["Eiffel Tower", "the tower"]])
    {'exact_match': 100.0, 'f1': 100.0}
"""

_CITATION = """
@inproceedings{rajpurkar2016squad,
  title={{SQuAD}: 100,000+ Questions for Machine Comprehension of Text},
  author={Rajpurkar, Pranav and Zhang, Jian and Lopyrev, Konstantin and Liang, Percy},
  booktitle={EMNLP},
  year={2016}
}
@inproceedings{rajpurkar2018know,
  title={Know What You Don't Know: Unanswerable Questions for {SQuAD}},
  author={Rajpurkar, Pranav and Jia, Robin and Liang, Percy},
  booktitle={ACL},
  year={2018}
}
"""

ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
PUNCTUATION = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """Lower case, punctuation and articles removed, white space collapsed (the official scripts')."""
    text = "".join(character for character in text.lower() if character not in PUNCTUATION)
    return " ".join(ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def f1(prediction: str, gold: str) -> float:
    """Token-overlap F1; with an empty side (v2's no-answer), 1 when both are empty, else 0."""
    predicted, wanted = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if not predicted or not wanted:
        return float(predicted == wanted)
    shared = sum((collections.Counter(predicted) & collections.Counter(wanted)).values())
    if shared == 0:
        return 0.0
    precision, recall = shared / len(predicted), shared / len(wanted)
    return 2 * precision * recall / (precision + recall)


def squad_scores(predictions: list[str], references: list[list[str]], version: str = "v1") -> dict[str, float]:
    """The metric's result (see the module's description)."""
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions for {len(references)} questions")
    if not references:
        raise ValueError("the SQuAD metric needs at least one question")
    exact, overlap, answerable = [], [], []
    for number, (prediction, golds) in enumerate(zip(predictions, references, strict=True)):
        golds = [gold for gold in golds if normalize_answer(gold)] if version == "v2" else list(golds)
        if not golds:
            if version == "v1":
                raise ValueError(f"question {number} has no gold answer (config v1; use v2 for unanswerable ones)")
            golds = [""]
        exact.append(max(exact_match(prediction, gold) for gold in golds))
        overlap.append(max(f1(prediction, gold) for gold in golds))
        answerable.append(golds != [""])
    result = {"exact_match": 100 * sum(exact) / len(exact), "f1": 100 * sum(overlap) / len(overlap)}
    if version == "v2":
        for name, wanted in (("has_answer", True), ("no_answer", False)):
            chosen = [i for i, has in enumerate(answerable) if has == wanted]
            result[f"{name}_total"] = float(len(chosen))
            if chosen:
                result[f"{name}_exact_match"] = 100 * sum(exact[i] for i in chosen) / len(chosen)
                result[f"{name}_f1"] = 100 * sum(overlap[i] for i in chosen) / len(chosen)
    return result


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class Squad(evaluate.Metric):
    def _info(self):
        if self.config_name not in ("default", "v1", "v2"):
            raise KeyError(f"unknown SQuAD metric config {self.config_name!r} (known: v1, v2)")
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features({"predictions": datasets.Value("string"),
                                        "references": datasets.Sequence(datasets.Value("string"))}),
            reference_urls=["https://rajpurkar.github.io/SQuAD-explorer/"],
        )

    def _compute(self, predictions, references):
        return squad_scores(predictions, references, "v2" if self.config_name == "v2" else "v1")
