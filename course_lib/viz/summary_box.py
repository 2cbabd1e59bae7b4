"""An ipywidgets box whose plain-text form is one line saying what it shows.

The default widget repr lists every child's traits, so a stored notebook output's
``text/plain`` would repeat a whole SVG; this box says what it is instead, and that line
is also what a frontend without widget support shows.
"""

from __future__ import annotations

import ipywidgets as widgets


class SummaryBox(widgets.VBox):
    """A ``VBox`` (ipywidgets 7 and 8) whose repr is its ``summary`` attribute."""

    summary = ""

    def __repr__(self) -> str:
        return self.summary
