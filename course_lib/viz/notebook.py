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
    """Plain-text stand-in for a figure: its suptitle or first axes title."""
    title = fig.get_suptitle()
    if not title:
        title = next((ax.get_title() for ax in fig.axes if ax.get_title()), "untitled")
    return f"[figure: {title}]"


def setup_notebook() -> None:
    """Apply the course style and register the figure text form in IPython, if running."""
    mpl.rcParams.update(STYLE)
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover - IPython is a dependency
        return
    shell = get_ipython()
    if shell is not None:
        formatter = shell.display_formatter.formatters["text/plain"]
        formatter.for_type(Figure, lambda fig, printer, cycle: printer.text(figure_text(fig)))
