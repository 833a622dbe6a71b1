"""What every figure of hf-ext shares. matplotlib is optional (the `plots` extra); figures are drawn on the
Agg canvas, so no display is needed and the global pyplot backend is left alone."""

from typing import TYPE_CHECKING

from .errors import HfExtError
from .extras import install_command

if TYPE_CHECKING:  # matplotlib is optional
    from matplotlib.figure import Figure


def require_matplotlib() -> tuple[type, type]:
    """matplotlib's `Figure` and Agg canvas classes; one clear error when matplotlib is missing (call it before a
    long run that ends with plots)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise HfExtError(f"plots need matplotlib: {install_command('plots')}") from None
    return Figure, FigureCanvasAgg


def new_figure(width: float, height: float) -> "Figure":
    """A matplotlib `Figure` of `width` x `height` inches on its own Agg canvas, with the constrained layout."""
    figure_class, canvas_class = require_matplotlib()
    figure = figure_class(figsize=(width, height), layout="constrained")
    canvas_class(figure)
    return figure


__all__ = ["new_figure", "require_matplotlib"]
