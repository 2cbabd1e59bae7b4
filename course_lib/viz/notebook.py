"""Notebook set-up for the course's figures: one style, and no ``<Figure size ...>`` text.

``setup_notebook()`` is the first call of every lecture. It fixes matplotlib's style so
figures look the same everywhere, and gives figures a stable plain-text form (their title)
so stored outputs carry no machine-dependent repr. A notebook progress bar gets a plain-text
form too: the finished bar. Its text is stored once, when the bar is first shown, and it is
all a stored notebook can show (no widget state is stored), so tqdm's own form would read
"0%" forever; a stored notebook ran every bar to its end, so the end is what it shows.
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


def progress_text(bar: object) -> str:
    """Plain-text stand-in for a tqdm notebook bar: the bar finished (what a stored notebook
    ran it to), not the state it had when it was displayed."""
    counter = getattr(bar, "pbar", None)
    if counter is None:
        return "progress: done"
    meter = counter.format_dict
    name = meter["prefix"] or "progress"
    if not meter["total"]:
        return f"{name}: done"
    total = f"{meter['total']:,}"
    return f"{name}: 100% {'█' * 20} {total}/{total} {meter['unit']}"


def setup_notebook() -> None:
    """Apply the course style, and register the figure and progress-bar text forms in
    IPython, if running."""
    mpl.rcParams.update(STYLE)
    from tqdm.notebook import TqdmHBox

    # A widget's text form is its repr (ipywidgets 7 and 8 alike), not a formatter's.
    TqdmHBox.__repr__ = lambda bar, pretty=False: progress_text(bar)
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
