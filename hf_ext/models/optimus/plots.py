"""Figures of an Optimus run: training curves from `trainer.state.log_history`, a map of the latent space (posterior
means on their principal axes, with an interpolation path) and an interpolation table.

matplotlib is optional (the `plots` extra); see `hf_ext.plots`.
"""

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ...errors import HfExtError
from ...plots import new_figure, require_matplotlib

if TYPE_CHECKING:  # numpy and matplotlib are imported only when a figure is drawn
    import numpy as np
    from matplotlib.figure import Figure
    from numpy.typing import ArrayLike

# panels of the training curves: (title, (log key, legend label), ...)
CURVE_PANELS = (
    ("reconstruction loss", (("loss_rec", None),)),
    ("KL", (("kl", "KL(q(z|x) || p(z))"), ("loss_kl", "KL term after free bits"))),
    ("beta", (("beta", None),)),
)
CURVE_KEYS = tuple(key for _, keys in CURVE_PANELS for key, _ in keys)


# below this share of the variance on the second axis, the points lie on a line
ONE_LINE_SHARE = 1e-6


def curves_from_log_history(log_history: Sequence[dict[str, float]], keys: Iterable[str] = CURVE_KEYS,
                            ) -> dict[str, tuple[list[float], list[float]]]:
    """`{key: (steps, values)}` of the training logs that carry `key`."""
    return {key: ([entry["step"] for entry in log_history if key in entry],
                  [entry[key] for entry in log_history if key in entry]) for key in keys}


def _draw_training_curves(axes, log_history):
    """One panel of `CURVE_PANELS` per axis; the KL panel shows the plain KL beside the thresholded term the loss
    uses, which free bits hold at 0 while every dimension stays under its target."""
    curves = curves_from_log_history(log_history)
    if not any(steps for steps, _ in curves.values()):
        raise HfExtError("the log history has no loss_rec, loss_kl or beta entries to plot")
    for axis, (title, keys) in zip(axes, CURVE_PANELS, strict=True):
        for key, label in keys:
            steps, values = curves[key]
            if steps:
                axis.plot(steps, values, marker="." if len(steps) < 50 else None, label=label)
        if any(label and curves[key][0] for key, label in keys):
            axis.legend(fontsize=8)
        axis.set_title(title)
        axis.set_xlabel("step")
        axis.grid(alpha=0.3)


def plot_training_curves(log_history: list[dict[str, float]], path: str | Path, title: str | None = None) -> Path:
    """PNG (or any matplotlib format, from `path`'s suffix) of the reconstruction loss, the KL (plain and as the
    loss's free-bits term) and beta over the training steps."""
    figure = new_figure(4 * len(CURVE_PANELS), 3.2)
    _draw_training_curves(figure.subplots(1, len(CURVE_PANELS)), log_history)
    if title:
        figure.suptitle(title)
    figure.savefig(Path(path), dpi=100)
    return Path(path)


def project_to_plane(points: "ArrayLike", *others: "ArrayLike", first_axis: "ArrayLike | None" = None,
                     ) -> "tuple[list[np.ndarray], np.ndarray]":
    """`points` ([n, d]) and each of `others` ([m, d]) on a plane through the mean of `points`, with the share of
    `points`' variance along each axis. The axes are the first two principal axes of `points`; with `first_axis`
    (a [d] direction), that direction and the principal axis of `points` orthogonal to it."""
    import numpy as np

    points = np.asarray(points, dtype=np.float64)
    centre = points.mean(0)
    centred = points - centre
    if first_axis is None:
        axes = np.linalg.svd(centred, full_matrices=False)[2][:2]
    else:
        first = np.asarray(first_axis, dtype=np.float64)
        first = first / np.linalg.norm(first)
        rest = centred - np.outer(centred @ first, first)
        axes = np.stack([first, np.linalg.svd(rest, full_matrices=False)[2][0]])
    explained = ((centred @ axes.T) ** 2).sum(0) / (centred ** 2).sum()
    projected = [(np.asarray(other, dtype=np.float64) - centre) @ axes.T for other in (points, *others)]
    return projected, explained


def plot_latent_space(means: "np.ndarray", texts: Sequence[str], path: str | Path,
                      interpolation: "tuple[np.ndarray, list[tuple[float, str]]] | None" = None,
                      labelled: Iterable[int] | None = None, log_history: list[dict[str, float]] | None = None,
                      title: str | None = None) -> Path:
    """PNG (or any matplotlib format, from `path`'s suffix) of `latent_space_figure`."""
    latent_space_figure(means, texts, interpolation, labelled, log_history, title).savefig(Path(path), dpi=100)
    return Path(path)


def latent_space_figure(means: "np.ndarray", texts: Sequence[str],
                        interpolation: "tuple[np.ndarray, list[tuple[float, str]]] | None" = None,
                        labelled: Iterable[int] | None = None, log_history: list[dict[str, float]] | None = None,
                        title: str | None = None) -> "Figure":
    """A figure of the posterior means of `texts` ([n, latent_size]) on a plane, with the sentences of `labelled`
    (indices; default all) written beside their points, and optionally:

    - `interpolation`: `(latents, [(t, decoded text)])`; the plane then runs along the interpolation (its first axis
      is the line from the first latent to the last, its second the principal axis of the means orthogonal to it),
      the path is drawn with numbered steps, each step's decoded text is listed under the map, and a sentence that
      a step decodes to is marked with the step's number instead of its text;
    - `log_history`: the training curves (`plot_training_curves`' panels) in a column on the right.

    Without an interpolation the plane is the means' first two principal axes.
    """
    import numpy as np

    if len(texts) < 2 or len(means) != len(texts):
        raise HfExtError("the latent map needs a posterior mean for each of at least 2 sentences")
    path_latents, steps = interpolation if interpolation is not None else (np.zeros((0, len(means[0]))), [])
    direction = np.asarray(path_latents[-1]) - np.asarray(path_latents[0]) if steps else None
    (points, path_points), explained = project_to_plane(means, path_latents, first_axis=direction)
    # two sentences, or an interpolation between the only two, lie on a line: the second axis would only scale
    # rounding noise (a "0% of the variance" axis of 1e-8), so the map keeps one axis
    on_a_line = explained[1] < ONE_LINE_SHARE
    if on_a_line:
        points[:, 1], path_points[:, 1] = 0.0, 0.0
    figure = new_figure(16 if log_history is not None else 11, 9 if steps else 8)
    grid = (figure.add_gridspec(len(CURVE_PANELS), 2, width_ratios=(3, 1)) if log_history is not None
            else figure.add_gridspec(len(CURVE_PANELS), 1))
    map_rows = slice(0, len(CURVE_PANELS) - 1) if steps else slice(None)
    axis = figure.add_subplot(grid[map_rows, 0])
    if log_history is not None:
        _draw_training_curves([figure.add_subplot(grid[row, 1]) for row in range(len(CURVE_PANELS))], log_history)
    step_numbers: dict[str, list[str]] = {}
    for number, (_, text) in enumerate(steps):
        step_numbers.setdefault(text, []).append(str(number))
    shown = list(range(len(texts))) if labelled is None else list(labelled)
    unlabelled = sorted(set(range(len(texts))) - set(shown))
    if unlabelled:
        axis.scatter(points[unlabelled, 0], points[unlabelled, 1], s=18, color="0.65",
                     label="posterior means of other sentences")
    axis.scatter(points[shown, 0], points[shown, 1], s=30, color="tab:blue",
                 label="posterior means of the sentences written beside them" if unlabelled
                 else "posterior means of the sentences")
    for index in shown:
        label = ",".join(step_numbers[texts[index]]) if texts[index] in step_numbers else texts[index]
        axis.annotate(label, points[index], xytext=(5, 5), textcoords="offset points", fontsize=8, color="tab:blue")
    if steps:
        axis.plot(path_points[:, 0], path_points[:, 1], "-o", color="tab:red", markersize=5, label="interpolation")
        for number, point in enumerate(path_points):
            axis.annotate(str(number), point, xytext=(-3, -13), textcoords="offset points", fontsize=9,
                          color="tab:red", weight="bold")
        listing_axis = figure.add_subplot(grid[-1, 0])
        listing_axis.axis("off")
        listing = "\n".join(f"{number}  t={t:.2f}  {text}" for number, (t, text) in enumerate(steps))
        listing_axis.text(0, 1, "interpolation (red), and the sentences its steps decode to (blue numbers):\n"
                          + listing, va="top", fontsize=9, family="monospace", color="tab:red")
        axis.set_xlabel(f"along the interpolation ({explained[0]:.0%} of the variance)")
        axis.set_ylabel(f"principal axis orthogonal to it ({explained[1]:.0%} of the variance)")
    else:
        axis.set_xlabel(f"principal axis 1 ({explained[0]:.0%} of the variance)")
        axis.set_ylabel(f"principal axis 2 ({explained[1]:.0%} of the variance)")
    if on_a_line:
        axis.set_ylabel("(the means lie on one line)")
        axis.set_yticks([])
    axis.set_title("latent space: posterior means")
    axis.legend(loc="best", fontsize=8)
    axis.grid(alpha=0.3)
    if title:
        figure.suptitle(title)
    return figure


def plot_interpolation_table(rows: Iterable[tuple[float, str]], path: str | Path, title: str = "Latent interpolation",
                             ) -> Path:
    """A table of `(t, decoded sentence)` rows, as `OptimusLatentSpace.interpolate` returns them."""
    rows = list(rows)
    if not rows:
        raise HfExtError("no interpolation rows to plot")
    figure = new_figure(9, 0.45 * (len(rows) + 2))
    from matplotlib.transforms import Bbox  # matplotlib is there: new_figure asked for it

    axis = figure.subplots()
    axis.axis("off")
    table = axis.table(cellText=[[f"{t:.2f}", text] for t, text in rows], colLabels=["t", "decoded sentence"],
                       colWidths=[0.08, 0.92], cellLoc="left", bbox=Bbox.from_bounds(0, 0, 1, 1))
    table.auto_set_font_size(False)
    table.set_fontsize(9)
    for (_, column), cell in table.get_celld().items():
        if column == 1:  # the default indent is a tenth of the cell width: far too much in the wide sentence column
            cell.PAD = 0.01
    if title:
        axis.set_title(title)
    figure.savefig(Path(path), dpi=100)
    return Path(path)


def plot_attribute_map(latent_map: dict, path: str | Path, title: str | None = None) -> Path:
    """PNG of an attribute operator's regions on a plane of the latent space, with posterior means coloured by their
    label and an edit's path. `latent_map`: `x`, `y` (the grid's coordinates), `regions` ([y][x] label ids),
    `labels`, `points` ([n, 2]), `point_labels`, `path` ([m, 2]), `path_texts` (decoded along the path), `part`,
    `source` and `request`; optionally `gaussian_path` and `gaussian_path_texts`, the same edit by the `gaussian`
    method, drawn beside it."""
    import numpy as np

    figure = new_figure(11, 8.5)
    grid = figure.add_gridspec(4, 1)
    axis = figure.add_subplot(grid[:3, 0])
    labels = latent_map["labels"]
    colours = [f"C{index}" for index in range(len(labels))]
    from matplotlib.colors import ListedColormap  # matplotlib is there: new_figure asked for it

    axis.contourf(latent_map["x"], latent_map["y"], np.asarray(latent_map["regions"]),
                  levels=np.arange(len(labels) + 1) - 0.5, cmap=ListedColormap(colours), alpha=0.18)
    points = np.asarray(latent_map["points"])
    for index, label in enumerate(labels):
        chosen = [label == point_label for point_label in latent_map["point_labels"]]
        axis.scatter(points[chosen, 0], points[chosen, 1], s=14, color=colours[index], label=label)
    paths = [("path", "edit path (flow)" if "gaussian_path" in latent_map else "edit path", "black", "-")]
    if "gaussian_path" in latent_map:
        paths.append(("gaussian_path", "edit path (gaussian)", "dimgrey", "--"))
    for key, name, colour, style in paths:
        path_points = np.asarray(latent_map[key])
        axis.plot(path_points[:, 0], path_points[:, 1], style, color=colour, linewidth=2, label=name)
        axis.scatter(path_points[0, 0], path_points[0, 1], marker="o", s=80, facecolors="none", edgecolors=colour)
        axis.scatter(path_points[-1, 0], path_points[-1, 1], marker="*", s=160, color=colour)
    axis.set_xlabel("along the edit")
    axis.set_ylabel("principal axis orthogonal to it")
    axis.set_title(f"regions of the {latent_map['part']} operator (shaded) and posterior means (dots, by their "
                   f"{latent_map['part']})")
    axis.legend(loc="best", fontsize=8)
    listing_axis = figure.add_subplot(grid[3, 0])
    listing_axis.axis("off")
    request = ", ".join(f"{name} = {label}" for name, label in latent_map["request"].items())
    listing_axis.text(0, 1, f"edit of \"{latent_map['source']}\" to {request}, decoded along the path (o to *):",
                      va="top", fontsize=9, family="monospace")
    columns = [("flow", "path_texts"), ("gaussian", "gaussian_path_texts")] if "gaussian_path" in latent_map \
        else [("", "path_texts")]
    for column, (name, key) in enumerate(columns):  # the paths' texts side by side
        listing_axis.text(column / len(columns), 0.85, (f"{name}:\n" if name else "") + "\n".join(latent_map[key]),
                          va="top", fontsize=8 if name else 9, family="monospace")
    if title:
        figure.suptitle(title)
    figure.savefig(Path(path), dpi=100)
    return Path(path)


__all__ = ["curves_from_log_history", "latent_space_figure", "plot_attribute_map", "plot_interpolation_table",
           "plot_latent_space", "plot_training_curves", "project_to_plane", "require_matplotlib"]
