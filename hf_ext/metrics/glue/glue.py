"""GLUE metrics with the MT-DNN paper's per-task table: accuracy, F1, Matthews correlation, Pearson and Spearman
correlation, computed with numpy only so that `evaluate.load(path)` works offline and without scikit-learn or scipy.

The definitions are those of the original's `data_utils/metrics.py` (scikit-learn's `accuracy_score`, binary
`f1_score`, `matthews_corrcoef`, scipy's `pearsonr`, `spearmanr`), as fractions rather than the original's percentages.
Nothing here is specific to one model.
"""

from collections.abc import Sequence

import datasets
import evaluate
import numpy as np

_DESCRIPTION = """
The metrics of each GLUE task as MT-DNN reports them (namisan/mt-dnn `experiments/glue/glue_task_def.yml`
`metric_meta`), or any of them for a task of your own:

| config | metrics |
|---|---|
| cola | accuracy, matthews_correlation |
| sst2 (sst) | accuracy |
| mrpc, qqp | accuracy, f1 |
| stsb | pearson, spearmanr |
| mnli, mnli_matched, mnli_mismatched, qnli, rte, wnli | accuracy |
| classification | accuracy unless `metrics` says otherwise |
| regression | pearson, spearmanr unless `metrics` says otherwise |

- accuracy: share of predictions equal to the reference;
- f1: binary F1 of class 1 (0 when class 1 is neither predicted nor present);
- matthews_correlation: the multi-class Matthews correlation coefficient (0 when predictions or references are
  constant);
- pearson, spearmanr: Pearson's r of the values and of their ranks (ties get their average rank); NaN for constant
  inputs, as scipy gives.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions: predicted class ids (classification configs) or scores (stsb, regression).
    references: gold class ids or scores.
    metrics (`list[str]`, *optional*): which metrics to compute instead of the config's, by name (`accuracy`, `f1`,
        `matthews_correlation`, `pearson`, `spearmanr`) or by the original MT-DNN name (`ACC`, `F1`, `MCC`,
        `Pearson`, `Spearman`).
Returns:
    a dict with one float per metric.
Example:
    >>> glue = evaluate.load("hf_ext/metrics/glue/glue.py", "mrpc")
    >>> glue.compute(predictions=[1, 0, 1, 1], references=[1, 0, 0, 1])
    {'accuracy': 0.75, 'f1': 0.8}
"""

_CITATION = """
@inproceedings{wang2019glue,
  title={{GLUE}: A Multi-Task Benchmark and Analysis Platform for Natural Language Understanding},
  author={Wang, Alex and Singh, Amanpreet and Michael, Julian and Hill, Felix and Levy, Omer and Bowman, Samuel R.},
  booktitle={ICLR},
  year={2019}
}
@inproceedings{liu2019mtdnn,
  title={Multi-Task Deep Neural Networks for Natural Language Understanding},
  author={Liu, Xiaodong and He, Pengcheng and Chen, Weizhu and Gao, Jianfeng},
  booktitle={ACL},
  year={2019}
}
"""

CONFIG_METRICS = {
    "cola": ("accuracy", "matthews_correlation"),
    "sst2": ("accuracy",),
    "mrpc": ("accuracy", "f1"),
    "qqp": ("accuracy", "f1"),
    "stsb": ("pearson", "spearmanr"),
    "mnli": ("accuracy",),
    "mnli_matched": ("accuracy",),
    "mnli_mismatched": ("accuracy",),
    "qnli": ("accuracy",),
    "rte": ("accuracy",),
    "wnli": ("accuracy",),
    "classification": ("accuracy",),
    "regression": ("pearson", "spearmanr"),
}
CONFIG_ALIASES = {"sst": "sst2", "sts-b": "stsb", "sst-2": "sst2"}  # MT-DNN's task names and GLUE's folder names
REGRESSION_CONFIGS = ("stsb", "regression")
ORIGINAL_NAMES = {"ACC": "accuracy", "F1": "f1", "MCC": "matthews_correlation", "Pearson": "pearson",
                  "Spearman": "spearmanr"}


def accuracy(predictions: np.ndarray, references: np.ndarray) -> float:
    return float(np.mean(predictions == references))


def f1(predictions: np.ndarray, references: np.ndarray) -> float:
    if not set(np.unique(np.concatenate([predictions, references]))) <= {0, 1}:
        raise ValueError("f1 is the binary F1 of class 1: predictions and references must be 0 or 1")
    true_positives = np.sum((predictions == 1) & (references == 1))
    wrong = np.sum(predictions != references)
    denominator = 2 * true_positives + wrong
    return float(2 * true_positives / denominator) if denominator else 0.0


def matthews_correlation(predictions: np.ndarray, references: np.ndarray) -> float:
    classes, encoded = np.unique(np.concatenate([references, predictions]), return_inverse=True)
    count = len(references)
    confusion = np.zeros((len(classes), len(classes)), dtype=np.float64)
    np.add.at(confusion, (encoded[:count], encoded[count:]), 1)
    true_sums, predicted_sums = confusion.sum(1), confusion.sum(0)
    covariance = np.trace(confusion) * count - true_sums @ predicted_sums
    variance_predicted = count ** 2 - predicted_sums @ predicted_sums
    variance_true = count ** 2 - true_sums @ true_sums
    if variance_predicted * variance_true == 0:
        return 0.0
    return float(covariance / np.sqrt(variance_true * variance_predicted))


def pearson(predictions: np.ndarray, references: np.ndarray) -> float:
    x = predictions.astype(np.float64) - predictions.mean()
    y = references.astype(np.float64) - references.mean()
    norm = np.sqrt((x @ x) * (y @ y))
    return float(x @ y / norm) if norm else float("nan")


def average_ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks, ties sharing their average rank (scipy's `rankdata(method="average")`)."""
    order = np.argsort(values, kind="mergesort")
    sorted_values = values[order]
    starts = np.flatnonzero(np.r_[True, sorted_values[1:] != sorted_values[:-1]])
    ends = np.r_[starts[1:], len(values)]
    ranks = np.empty(len(values), dtype=np.float64)
    ranks[order] = np.repeat((starts + ends + 1) / 2, ends - starts)
    return ranks


def spearmanr(predictions: np.ndarray, references: np.ndarray) -> float:
    return pearson(average_ranks(predictions), average_ranks(references))


METRICS = {"accuracy": accuracy, "f1": f1, "matthews_correlation": matthews_correlation, "pearson": pearson,
           "spearmanr": spearmanr}


def metric_names(names: Sequence[str]) -> list[str]:
    """Metric names (ours or the original's) as ours; `ValueError` for unknown ones."""
    resolved = [ORIGINAL_NAMES.get(name, name) for name in names]
    unknown = [name for name, key in zip(names, resolved, strict=True) if key not in METRICS]
    if unknown:
        raise ValueError(f"unknown GLUE metric(s) {', '.join(map(str, unknown))} (known: {', '.join(METRICS)}, or "
                         f"the original's {', '.join(ORIGINAL_NAMES)})")
    return list(dict.fromkeys(resolved))


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class Glue(evaluate.Metric):
    def _info(self):
        name = CONFIG_ALIASES.get(self.config_name, self.config_name)
        if name not in CONFIG_METRICS:
            raise KeyError(f"unknown GLUE metric config {self.config_name!r} (known: {', '.join(CONFIG_METRICS)})")
        value = datasets.Value("float64" if name in REGRESSION_CONFIGS else "int64")
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features({"predictions": value, "references": value}),
            reference_urls=["https://gluebenchmark.com", "https://github.com/namisan/mt-dnn"],
        )

    def _compute(self, predictions, references, metrics=None):
        predictions = np.asarray(predictions)
        references = np.asarray(references)
        if len(references) == 0:
            raise ValueError("the GLUE metrics need at least one example")
        names = metric_names(metrics) if metrics else CONFIG_METRICS[CONFIG_ALIASES.get(self.config_name,
                                                                                         self.config_name)]
        return {name: METRICS[name](predictions, references) for name in names}
