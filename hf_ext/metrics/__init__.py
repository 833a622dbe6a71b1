"""`evaluate` metrics shipped with hf-ext. Each is a local metric script `<name>/<name>.py` loaded by path, so it
works offline (`evaluate.load("<hub name>")` needs the Hub)."""

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # evaluate is imported only when a metric is loaded
    from evaluate import EvaluationModule

METRICS_DIR = Path(__file__).parent


def metric_path(name: str) -> str:
    """Path of the metric script `name` (e.g. `"optimus_lm"`), for `evaluate.load`."""
    path = METRICS_DIR / name / f"{name}.py"
    if not path.is_file():
        known = sorted(p.name for p in METRICS_DIR.iterdir() if (p / f"{p.name}.py").is_file())
        raise ValueError(f"no hf-ext metric named {name!r} (known: {', '.join(known)})")
    return str(path)


def load_metric(name: str, **kwargs: Any) -> "EvaluationModule":
    """`evaluate.load` of a bundled metric; kept in memory (no cache files) unless it runs over several processes."""
    import evaluate

    kwargs.setdefault("keep_in_memory", kwargs.get("num_process", 1) == 1)
    return evaluate.load(metric_path(name), **kwargs)


__all__ = ["METRICS_DIR", "load_metric", "metric_path"]
