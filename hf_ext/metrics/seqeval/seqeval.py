"""Entity-level precision, recall and F1 of tag sequences (IOB1, IOB2/BIO, IOE, IOBES tags), as the `seqeval`
package's default (conlleval) mode computes them, in plain Python so that `evaluate.load(path)` works offline and
without the package (whose last release is from 2020 and which needs scikit-learn).

This is what MT-DNN's original reports for sequence labeling (`data_utils/metrics.py` `compute_seqacc`: seqeval's
`classification_report`, micro average). Nothing here is specific to one model.
"""

from collections import Counter

import datasets
import evaluate

_DESCRIPTION = """
Entity-level scores of predicted tag sequences against gold ones. An entity is a chunk of tags of one type, found
as CoNLL's conlleval script finds them (seqeval's default mode): `B-` starts a chunk, `I-` continues one of the same
type (and starts one after `O` or after a chunk of another type), `E-`/`S-` end one, `O` is outside.

Returns the micro-averaged `overall_precision`, `overall_recall`, `overall_f1`, the token `overall_accuracy`, and per
entity type a dict of `precision`, `recall`, `f1` and `number` (gold entities of that type), as the Hub's `seqeval`
metric does.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list[list[str]]`): predicted tags, one list per sentence.
    references (`list[list[str]]`): gold tags, as long as the predictions.
    suffix (`bool`, defaults to False): the tag's position marker comes last (`PER-B`) instead of first (`B-PER`).
Returns:
    a dict of floats and per-type dicts.
Example:
    >>> seqeval = evaluate.load("hf_ext/metrics/seqeval/seqeval.py")
    >>> seqeval.compute(predictions=[["B-PER", "I-PER", "O"]], references=[["B-PER", "I-PER", "O"]])["overall_f1"]
    1.0
"""

_CITATION = """
@misc{seqeval,
  title={{seqeval}: A Python framework for sequence labeling evaluation},
  url={https://github.com/chakki-works/seqeval},
  author={Hiroki Nakayama},
  year={2018}
}
"""


def end_of_chunk(previous_tag: str, tag: str, previous_type: str, entity_type: str) -> bool:
    """Whether the chunk before this token ends here (conlleval's endOfChunk)."""
    return (previous_tag in ("E", "S")
            or (previous_tag in ("B", "I") and tag in ("B", "S", "O"))
            or (previous_tag not in ("O", ".") and previous_type != entity_type))


def start_of_chunk(previous_tag: str, tag: str, previous_type: str, entity_type: str) -> bool:
    """Whether a chunk starts at this token (conlleval's startOfChunk)."""
    return (tag in ("B", "S")
            or (previous_tag in ("E", "S", "O") and tag in ("E", "I"))
            or (tag not in ("O", ".") and previous_type != entity_type))


def entities(tags: list[str], suffix: bool = False) -> list[tuple[str, int, int]]:
    """The chunks `(type, first, last)` of one tag sequence."""
    found = []
    previous_tag, previous_type, begin = "O", "", 0
    for index, chunk in enumerate([*tags, "O"]):
        if suffix:
            tag, entity_type = chunk[-1], chunk[:-1].rsplit("-", maxsplit=1)[0] or "_"
        else:
            tag, entity_type = chunk[0], chunk[1:].split("-", maxsplit=1)[-1] or "_"
        if end_of_chunk(previous_tag, tag, previous_type, entity_type):
            found.append((previous_type, begin, index - 1))
        if start_of_chunk(previous_tag, tag, previous_type, entity_type):
            begin = index
        previous_tag, previous_type = tag, entity_type
    return found


def _scores(correct: int, predicted: int, gold: int) -> tuple[float, float, float]:
    precision = correct / predicted if predicted else 0.0
    recall = correct / gold if gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return precision, recall, f1


def entity_scores(predictions: list[list[str]], references: list[list[str]], suffix: bool = False) -> dict:
    """The metric's result (see the module's description)."""
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predicted sequences for {len(references)} gold ones")
    correct: Counter[str] = Counter()
    predicted: Counter[str] = Counter()
    gold: Counter[str] = Counter()
    tokens = right = 0
    for number, (predicted_tags, gold_tags) in enumerate(zip(predictions, references, strict=True)):
        if len(predicted_tags) != len(gold_tags):
            raise ValueError(f"sequence {number}: {len(predicted_tags)} predicted tags for {len(gold_tags)} gold ones")
        tokens += len(gold_tags)
        right += sum(p == g for p, g in zip(predicted_tags, gold_tags, strict=True))
        predicted_chunks = set(entities(list(predicted_tags), suffix))
        gold_chunks = set(entities(list(gold_tags), suffix))
        for chunk in predicted_chunks:
            predicted[chunk[0]] += 1
        for chunk in gold_chunks:
            gold[chunk[0]] += 1
        for chunk in predicted_chunks & gold_chunks:
            correct[chunk[0]] += 1
    result: dict = {}
    for entity_type in sorted(set(gold) | set(predicted)):
        precision, recall, f1 = _scores(correct[entity_type], predicted[entity_type], gold[entity_type])
        result[entity_type] = {"precision": precision, "recall": recall, "f1": f1, "number": gold[entity_type]}
    precision, recall, f1 = _scores(sum(correct.values()), sum(predicted.values()), sum(gold.values()))
    result.update({"overall_precision": precision, "overall_recall": recall, "overall_f1": f1,
                   "overall_accuracy": right / tokens if tokens else 0.0})
    return result


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class Seqeval(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features({"predictions": datasets.Sequence(datasets.Value("string")),
                                        "references": datasets.Sequence(datasets.Value("string"))}),
            reference_urls=["https://github.com/chakki-works/seqeval", "https://www.clips.uantwerpen.be/conll2000/"],
        )

    def _compute(self, predictions, references, suffix=False):
        return entity_scores(predictions, references, suffix)
