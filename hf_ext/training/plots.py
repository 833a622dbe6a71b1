"""Figures of an Optimus run: training curves from `trainer.state.log_history` and an interpolation table.

matplotlib is optional (`pip install hf-ext[plots]`); figures are drawn on the Agg canvas, so no display is needed and
the global pyplot backend is left alone.
"""

from pathlib import Path

from ..errors import HfExtError

CURVES = (("loss_rec", "reconstruction loss"), ("loss_kl", "KL"), ("beta", "beta"))


def require_matplotlib():
    """matplotlib's `Figure` and Agg canvas classes; one clear error when matplotlib is missing (call it before a
    long run that ends with plots)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise HfExtError("plots need matplotlib (pip install 'hf-ext[plots]')") from None
    return Figure, FigureCanvasAgg


def _figure(width, height):
    figure_class, canvas_class = require_matplotlib()
    figure = figure_class(figsize=(width, height), layout="constrained")
    canvas_class(figure)
    return figure


def curves_from_log_history(log_history, keys=tuple(key for key, _ in CURVES)):
    """`{key: (steps, values)}` of the training logs that carry `key`."""
    return {key: ([entry["step"] for entry in log_history if key in entry],
                  [entry[key] for entry in log_history if key in entry]) for key in keys}


def plot_training_curves(log_history, path, title=None):
    """PNG (or any matplotlib format, from `path`'s suffix) of the reconstruction loss, the KL term and beta over
    the training steps."""
    curves = curves_from_log_history(log_history)
    if not any(steps for steps, _ in curves.values()):
        raise HfExtError("the log history has no loss_rec, loss_kl or beta entries to plot")
    figure = _figure(4 * len(CURVES), 3.2)
    for axis, (key, label) in zip(figure.subplots(1, len(CURVES)), CURVES):
        steps, values = curves[key]
        axis.plot(steps, values, marker="." if len(steps) < 50 else None)
        axis.set_title(label)
        axis.set_xlabel("step")
        axis.grid(alpha=0.3)
    if title:
        figure.suptitle(title)
    figure.savefig(Path(path), dpi=100)
    return Path(path)


def plot_interpolation_table(rows, path, title="Latent interpolation"):
    """A table of `(t, decoded sentence)` rows, as `OptimusLatentSpace.interpolate` returns them."""
    rows = list(rows)
    if not rows:
        raise HfExtError("no interpolation rows to plot")
    figure = _figure(9, 0.45 * (len(rows) + 2))
    axis = figure.subplots()
    axis.axis("off")
    table = axis.table(cellText=[[f"{t:.2f}", text] for t, text in rows], colLabels=["t", "decoded sentence"],
                       colWidths=[0.08, 0.92], cellLoc="left", bbox=[0, 0, 1, 1])
    table.auto_set_font_size(False)
    table.set_fontsize(9)
    for (_, column), cell in table.get_celld().items():
        if column == 1:  # the default indent is a tenth of the cell width: far too much in the wide sentence column
            cell.PAD = 0.01
    if title:
        axis.set_title(title)
    figure.savefig(Path(path), dpi=100)
    return Path(path)


__all__ = ["curves_from_log_history", "plot_interpolation_table", "plot_training_curves", "require_matplotlib"]
