"""One timeline for every view: a list of frames, a frame -> SVG function, a slider with Play.

The static form (``at(step)``, or the timeline itself at its ``step``) is an SVG picture
with a PNG copy, which is what stored notebook outputs show on GitHub and in nbval.
``widget()`` layers ipywidgets on top: a ``Play`` button jslinked to a slider, optional
extra controls whose values are passed to the draw function, and an ``HTML`` element
holding the frame. Only widgets and calls common to ipywidgets 7 and 8 are used.

Frames are indexed from 0 (``at(step)``, ``data-step``), but a frame may be known by
another number, such as the simulator step it shows: pass ``numbers`` and the slider reads
that number, so the slider and the frame's own label agree.

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
        numbers: Sequence[int] | None = None,
        interval_ms: int = 500,
    ) -> None:
        """``step`` is the frame the static form shows (default: the last) and the widget
        opens on (default: the first, so Play and a drag to the right move forward);
        ``numbers`` are what the slider calls each frame (default: its index)."""
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
        self._opening = 0 if step is None else self.step
        given = numbers if isinstance(numbers, Sequence) else ()
        self.numbers = tuple(range(len(self.frames))) if numbers is None else tuple(given)
        if len(self.numbers) != len(self.frames) or not all(
                isinstance(n, int) and not isinstance(n, bool) for n in self.numbers):
            raise ValueError(f"numbers must be {len(self.frames)} integers, one per frame, "
                             f"got {numbers!r}")
        self._numbered = numbers is not None

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
        where = (f"step {self.numbers[step]} (frame {step + 1} of {len(self)})"
                 if self._numbered else f"step {step} of {len(self) - 1}")
        return f"{self.name} {where}: {self._describe(frame)}"

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
        """Play button, step slider, the extra controls and the drawn frame, wired up.

        The slider's value is the frame index and its readout the frame's number.
        """
        slider = widgets.SelectionSlider(
            options=[(str(n), i) for i, n in enumerate(self.numbers)], value=self._opening,
            description="step", layout=widgets.Layout(width="520px"),
        )
        play = widgets.Play(
            value=self._opening, min=0, max=len(self) - 1, step=1, interval=self.interval_ms,
            description="play",
        )
        widgets.jslink((play, "value"), (slider, "index"))
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

