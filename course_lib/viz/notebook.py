"""Notebook set-up for the course's figures: one style, and no ``<Figure size ...>`` text.

``setup_notebook()`` is the first call of every lecture. It fixes matplotlib's style so
figures look the same everywhere, and gives figures a stable plain-text form (their title)
so stored outputs carry no machine-dependent repr.
"""

from __future__ import annotations

import matplotlib as mpl
from matplotlib.figure import Figure

STYLE = {
    "figure.figsize": (9.0, 4.0),
    "figure.dpi": 100,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.titlesize": 12,
    "axes.titleweight": "bold",
    "legend.frameon": False,
    "svg.hashsalt": "course",
}


def figure_text(fig: Figure) -> str:
    """Plain-text stand-in for a figure: its suptitle or first axes title (any position)."""
    title = fig.get_suptitle()
    if not title:
        titles = (ax.get_title(loc) for ax in fig.axes for loc in ("center", "left", "right"))
        title = next((t for t in titles if t), "untitled")
    return f"[figure: {title}]"


def setup_notebook() -> None:
    """Apply the course style and register the figure text form in IPython, if running."""
    mpl.rcParams.update(STYLE)
    import matplotlib.pyplot as plt

    # The first figure activates the notebook backend, which resets every Figure formatter;
    # let that happen now, before registering ours.
    plt.close(plt.figure())
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover - IPython is a dependency
        return
    shell = get_ipython()
    if shell is not None:
        formatter = shell.display_formatter.formatters["text/plain"]
        formatter.for_type(Figure, lambda fig, printer, cycle: printer.text(figure_text(fig)))
