"""Char- and sequence-accuracy of predicted symbol sequences, as the Universal Transformer paper reports them for the
algorithmic tasks (Dehghani et al., ICLR 2019, Table 4). This script imports only evaluate, datasets and numpy so that
`evaluate.load(path)` works offline.
"""

import datasets
import evaluate
import numpy as np

_DESCRIPTION = """
Compares predicted symbol sequences with reference sequences (token ids, or any integers, end-of-sequence removed):

- char_accuracy: correct positions over all reference positions, summed over the examples. Position i of a reference
  is correct when the prediction has the same symbol at position i; a prediction that is too short misses the rest,
  one that is too long loses nothing here (tensor2tensor's `padded_accuracy` pads both to the longer length, which
  is the same for missing positions).
- sequence_accuracy: share of examples whose prediction equals the reference exactly (same length, same symbols).
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list[list[int]]`): predicted sequences.
    references (`list[list[int]]`): reference sequences, one per prediction.
Returns:
    char_accuracy (`float`), sequence_accuracy (`float`), num_examples (`int`).
Example:
    >>> metric.compute(predictions=[[1, 2, 3], [4, 5]], references=[[1, 2, 4], [4, 5]])
    {'char_accuracy': 0.8, 'sequence_accuracy': 0.5, 'num_examples': 2}
"""

_CITATION = """
@inproceedings{dehghani2019universal,
  title={Universal Transformers},
  author={Dehghani, Mostafa and Gouws, Stephan and Vinyals, Oriol and Uszkoreit, Jakob and Kaiser, {\\L}ukasz},
  booktitle={ICLR},
  year={2019}
}
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class AlgorithmicAccuracy(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features({
                "predictions": datasets.Sequence(datasets.Value("int64")),
                "references": datasets.Sequence(datasets.Value("int64")),
            }),
            reference_urls=["https://arxiv.org/abs/1807.03819"],
        )

    def _compute(self, predictions, references):
        if not references:
            raise ValueError("algorithmic_accuracy needs at least one example")
        correct = total = exact = 0
        for prediction, reference in zip(predictions, references, strict=True):
            overlap = min(len(prediction), len(reference))
            matches = int((np.asarray(prediction[:overlap]) == np.asarray(reference[:overlap])).sum())
            correct += matches
            total += len(reference)
            exact += int(len(prediction) == len(reference) == matches)
        sequence_accuracy = exact / len(references)
        # all references empty: a position-free char accuracy falls back to the exact matches
        return {"char_accuracy": correct / total if total else sequence_accuracy,
                "sequence_accuracy": sequence_accuracy, "num_examples": len(references)}
