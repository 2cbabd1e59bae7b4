"""One timeline for every view: a list of frames, a frame -> SVG function, a slider with Play.

The static form (``at(step)``, or the timeline itself at its ``step``) is an SVG picture,
which is what stored notebook outputs show on GitHub and in nbval. ``widget()`` layers
ipywidgets on top: a ``Play`` button jslinked to an ``IntSlider``, optional extra controls
whose values are passed to the draw function, and an ``HTML`` element holding the frame.
Only widgets and calls common to ipywidgets 7 and 8 are used.

DOM contract for browser tests, with ``name`` the timeline's name (e.g. ``"pool"``):
``#<name>-view`` is a div with ``data-step`` (the frame drawn) and ``data-steps`` (frame
count) around the SVG; the widgets carry the classes ``<name>-play``, ``<name>-slider``,
``<name>-frame`` and ``<name>-<control>`` for each extra control.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Generic, TypeVar

import ipywidgets as widgets

from course_lib.viz.raster import svg_to_png
from course_lib.viz.summary_box import SummaryBox
from course_lib.viz.svg import SvgPicture

F = TypeVar("F")

Draw = Callable[..., str]
"""``draw(frame, dom_id=..., **options) -> str``: the SVG of one frame."""

Controls = Callable[[], Mapping[str, widgets.ValueWidget]]
"""Builds fresh extra controls; each control's ``value`` is passed to ``draw`` by its key."""


class Timeline(Generic[F]):
    """Frames drawn by ``draw``: a static picture at any step, and an interactive widget."""

    def __init__(
        self,
        frames: Sequence[F],
        draw: Draw,
        *,
        name: str,
        describe: Callable[[F], str],
        controls: Controls | None = None,
        step: int | None = None,
        interval_ms: int = 500,
    ) -> None:
        if len(frames) == 0:
            raise ValueError("frames is empty: a timeline needs at least one frame")
        if not re.fullmatch(r"[a-z][a-z0-9-]*", name):
            raise ValueError(f"name must be lowercase letters, digits and '-', got {name!r}")
        if isinstance(interval_ms, bool) or not isinstance(interval_ms, int) or interval_ms <= 0:
            raise ValueError(f"interval_ms must be a positive integer, got {interval_ms!r}")
        self.frames: tuple[F, ...] = tuple(frames)
        self.name = name
        self.interval_ms = interval_ms
        self._draw = draw
        self._describe = describe
        self._controls = controls
        self.step = len(self.frames) - 1 if step is None else self._check_step(step)

    def __len__(self) -> int:
        return len(self.frames)

    def _check_step(self, step: int) -> int:
        """``step`` if it indexes a frame, else a ValueError naming it."""
        if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < len(self):
            raise ValueError(f"step must be an integer in [0, {len(self) - 1}], got {step!r}")
        return step

    def svg(self, step: int, **options: object) -> str:
        """The SVG text of frame ``step`` drawn with ``options``."""
        return self._draw(self.frames[self._check_step(step)], dom_id=self.name, **options)

    def html(self, step: int, **options: object) -> str:
        """Frame ``step`` wrapped in the div a browser test reads (id, ``data-step``)."""
        return (
            f'<div id="{self.name}-view" class="course-view {self.name}-view" '
            f'data-step="{step}" data-steps="{len(self)}" style="overflow-x:auto">'
            f"{self.svg(step, **options)}</div>"
        )

    def describe(self, step: int) -> str:
        """One line saying what frame ``step`` shows."""
        frame = self.frames[self._check_step(step)]
        return f"{self.name} step {step} of {len(self) - 1}: {self._describe(frame)}"

    def at(self, step: int, **options: object) -> SvgPicture:
        """The static picture of frame ``step`` (what a stored notebook output shows)."""
        return SvgPicture(self.svg(step, **options), self.describe(step))

    def _repr_svg_(self) -> str:
        return self.svg(self.step)

    def _repr_png_(self) -> tuple[bytes, dict[str, int]]:
        return svg_to_png(self.svg(self.step))

    def __repr__(self) -> str:
        return self.describe(self.step)

    def widget(self) -> SummaryBox:
        """Play button, step slider, the extra controls and the drawn frame, wired up."""
        last = len(self) - 1
        slider = widgets.IntSlider(
            value=self.step, min=0, max=last, step=1, description="step",
            layout=widgets.Layout(width="520px"),
        )
        play = widgets.Play(
            value=self.step, min=0, max=last, step=1, interval=self.interval_ms,
            description="play",
        )
        widgets.jslink((play, "value"), (slider, "value"))
        controls = dict(self._controls()) if self._controls else {}
        view = widgets.HTML(layout=widgets.Layout(width="100%"))

        def redraw(_change: object = None) -> None:
            options = {key: control.value for key, control in controls.items()}
            view.value = self.html(slider.value, **options)
            box.summary = f"{self.describe(slider.value)} (interactive)"

        play.add_class(f"{self.name}-play")
        slider.add_class(f"{self.name}-slider")
        view.add_class(f"{self.name}-frame")
        rows: list[widgets.Widget] = [widgets.HBox([play, slider])]
        for key, control in controls.items():
            control.add_class(f"{self.name}-{key.replace('_', '-')}")
            control.observe(redraw, names="value")
        if controls:
            rows.append(widgets.HBox(list(controls.values())))
        box = SummaryBox([*rows, view])
        slider.observe(redraw, names="value")
        redraw()
        return box

