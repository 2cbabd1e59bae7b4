"""Chapter 01's capacity calculator and the concurrency-against-context plot.

Every number comes from :mod:`course_lib.kv_math`; this module only chooses inputs and
draws. :class:`CapacityCalculator` shows as a static figure (SVG with a PNG copy: the curve
of maximum concurrency against maximum length, with the numbers beside it) and, through
``.widget()``, as sliders and dropdowns whose numbers update live in the HTML element
``#capacity-numbers`` (cells ``td[data-key=bytes_per_token|request_bytes|blocks|tokens|
max_requests]``, raw values in ``data-*`` attributes) beside the curve (``.capacity-figure``).
"""

from __future__ import annotations

import base64
import html
import io
import math
from collections.abc import Sequence
from typing import Any

import ipywidgets as widgets
import matplotlib
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullFormatter, NullLocator

from course_lib.kv_math import (
    DTYPE_BYTES,
    GIB,
    HYBRID_MODELS,
    MODELS,
    Capacity,
    HybridModel,
    ModelShape,
    blocks_needed,
    capacity,
    hybrid_capacity,
    hybrid_model,
    model_shape,
)
from course_lib.viz.palette import OWNER_COLORS
from course_lib.viz.raster import figure_png
from course_lib.viz.summary_box import SummaryBox

DEFAULT_MODELS: tuple[str, ...] = ("opt-13b", "llama-2-7b", "llama-3-8b", "qwen2.5-7b",
                                   "llama-3-70b")
"""Models compared by default: no GQA, 4x GQA, 7x GQA, and a large GQA model."""

CONTEXT_LENGTHS: tuple[int, ...] = tuple(round(2 ** (9 + k / 4)) for k in range(33))
"""Maximum lengths on the x axis: 512 to 131,072, four points per doubling."""

BLOCK_SIZES: tuple[int, ...] = (8, 16, 32, 64, 128, 256, 512)
MAX_LENS: tuple[int, ...] = tuple(2**k for k in range(8, 18))
CUSTOM = "custom"


def _shape(model: str | ModelShape) -> ModelShape:
    """A preset by name, or the shape itself."""
    return model_shape(model) if isinstance(model, str) else model


def _budget_bytes(budget_gib: float) -> float:
    """The budget in bytes; a non-positive or non-numeric budget raises naming it."""
    ok = isinstance(budget_gib, int | float) and not isinstance(budget_gib, bool)
    if not ok or not math.isfinite(budget_gib) or budget_gib <= 0:
        raise ValueError(f"budget_gib must be a positive number, got {budget_gib!r}")
    return budget_gib * GIB


def _log_log_axes(ax: Any, xlabel: str, ylabel: str) -> None:
    """Concurrency against length, both on log scales, with one request marked by a line."""
    ax.axhline(1.0, color="#8c959f", linestyle=":", linewidth=1)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ticks = [2**k for k in range(9, 18)]
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticks(ticks, [_length_label(t) for t in ticks])
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)


def _length_label(tokens: int) -> str:
    """Compact axis label: 512, 2K, 128K."""
    return f"{tokens // 1024}K" if tokens >= 1024 and tokens % 1024 == 0 else f"{tokens:,}"


def _bytes_label(count: float) -> str:
    """Bytes in the largest binary unit that keeps the number at least one."""
    for unit, size in (("GiB", GIB), ("MiB", 2**20), ("KiB", 2**10)):
        if count >= size:
            return f"{count / size:,.2f}".rstrip("0").rstrip(".") + f" {unit}"
    return f"{count:,.0f} B"


def plot_concurrency_vs_context(
    models: Sequence[str | ModelShape] = DEFAULT_MODELS,
    *,
    dtype: str = "fp16",
    budget_gib: float = 60.0,
    block_size: int = 16,
    mark: int | None = None,
    ax: Axes | None = None,
) -> Figure:
    """Maximum concurrent full-length requests against the maximum length, one line a model.

    Log-log: halving the context doubles the concurrency, and grouped-query attention
    shifts a model's whole line up. ``mark`` dots each line at that maximum length and
    puts the whole requests that fit in the legend. Draws into ``ax`` when given, else
    into a new pyplot figure (end the cell with ``plt.show()``). Returns the figure.
    """
    if not models:
        raise ValueError("models is empty: name at least one model to plot")
    budget = _budget_bytes(budget_gib)
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 4.2), layout="constrained")
    for i, shape in enumerate(_shape(m) for m in models):
        per_token = shape.bytes_per_token(dtype)
        color = OWNER_COLORS[i % len(OWNER_COLORS)]
        curve = [capacity(per_token, budget, block_size, n).max_concurrency
                 for n in CONTEXT_LENGTHS]
        label = f"{shape.name} ({_bytes_label(per_token)}/token)"
        if mark is not None:
            point = capacity(per_token, budget, block_size, mark)
            ax.plot([mark], [point.max_concurrency], "o", color=color, markersize=7)
            label += f": {point.max_requests:,} at {_length_label(mark)}"
        ax.plot(CONTEXT_LENGTHS, curve, color=color, linewidth=2, label=label)
    _log_log_axes(ax, "maximum length per request (tokens)", "max concurrent requests")
    ax.set_title(f"{budget_gib:g} GiB of KV cache, {dtype}, blocks of {block_size}",
                 fontsize=11, loc="left")
    ax.grid(True, which="major", color="#e6e9ed", linewidth=0.8)
    ax.spines[["top", "right"]].set_visible(False)
    ax.legend(frameon=False, fontsize=9)
    return ax.figure


def plot_hybrid_concurrency(
    models: Sequence[HybridModel] = tuple(HYBRID_MODELS.values()),
    *,
    dtype: str = "bf16",
    budget_gib: float = 60.0,
    block_size: int = 16,
    mark: int | None = None,
    ax: Axes | None = None,
) -> Figure:
    """Chapter 08's version of the curve: requests of each length that fit at once, for
    hybrid models with window freeing (solid) and without (dashed, which is what the same
    model with every layer full holds when its groups are as large). Log-log, as
    :func:`plot_concurrency_vs_context`, whose ``mark`` it shares; returns the figure (call
    ``plt.show()``)."""
    if not models:
        raise ValueError("models is empty: name at least one hybrid model to plot")
    budget = _budget_bytes(budget_gib)
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 4.2), layout="constrained")
    for i, model in enumerate(models):
        color = OWNER_COLORS[i % len(OWNER_COLORS)]
        caps = [hybrid_capacity(model, budget, n, block_size, dtype) for n in CONTEXT_LENGTHS]
        label = f"{model.name}, window blocks freed"
        if mark is not None:
            point = hybrid_capacity(model, budget, mark, block_size, dtype)
            ax.plot([mark], [point.blocks / point.blocks_per_request], "o", color=color,
                    markersize=7)
            label += f": {point.max_requests:,} at {_length_label(mark)}"
        ax.plot(CONTEXT_LENGTHS, [c.blocks / c.blocks_per_request for c in caps], color=color,
                linewidth=2, label=label)
        ax.plot(CONTEXT_LENGTHS, [c.blocks / c.blocks_per_request_no_freeing for c in caps],
                color=color, linewidth=1.5, linestyle="--", label=f"{model.name}, kept")
    _log_log_axes(ax, "tokens per request", "concurrent requests")
    ax.set_title(f"Hybrid models: {budget_gib:g} GiB of KV cache, {dtype}, blocks of "
                 f"{block_size}", fontsize=11, loc="left")
    ax.legend(frameon=False, fontsize=8.5)
    return ax.figure


def figure_svg(fig: Figure) -> str:
    """A figure as SVG text, byte-identical across runs (fixed id salt, no date)."""
    buffer = io.StringIO()
    with matplotlib.rc_context({"svg.hashsalt": "course_lib", "svg.fonttype": "none"}):
        fig.savefig(buffer, format="svg", metadata={"Date": None, "Creator": None})
    svg = buffer.getvalue()
    return svg[svg.index("<svg"):]


class CapacityCalculator:
    """What a KV budget holds for one model, dtype, block size and maximum length.

    Displayed, it is a static figure (which is what stored notebook outputs show);
    ``widget()`` returns the interactive calculator. Bad inputs raise ``ValueError``
    naming the value, through :mod:`course_lib.kv_math`.
    """

    def __init__(
        self,
        model: str | ModelShape = "guide-8kv",
        *,
        dtype: str = "fp16",
        budget_gib: float = 60.0,
        block_size: int = 16,
        max_len: int = 8192,
    ) -> None:
        self.shape = _shape(model)
        self.dtype = dtype
        self.budget_gib = budget_gib
        self.block_size = block_size
        self.max_len = max_len
        self.numbers: Capacity = capacity(
            self.shape.bytes_per_token(dtype), _budget_bytes(budget_gib), block_size, max_len
        )

    def __repr__(self) -> str:
        n = self.numbers
        return (
            f"{self.shape.name}, {self.dtype}, {self.budget_gib:g} GiB, blocks of "
            f"{self.block_size}, max {self.max_len:,}: {n.bytes_per_token:,} B/token · "
            f"{n.blocks:,} blocks · {n.tokens:,} tokens · {n.max_requests:,} requests"
        )

    def rows(self) -> list[tuple[str, str, str]]:
        """(key, label, value) for each number the calculator shows."""
        n = self.numbers
        slots = blocks_needed(self.max_len, self.block_size) * self.block_size
        request = n.bytes_per_token * slots
        return [
            ("bytes_per_token", "KV bytes per token",
             f"{n.bytes_per_token:,} B ({_bytes_label(n.bytes_per_token)})"),
            ("request_bytes", f"one {self.max_len:,}-token request", _bytes_label(request)),
            ("blocks", f"blocks of {self.block_size} tokens", f"{n.blocks:,}"),
            ("tokens", "tokens that fit", f"{n.tokens:,}"),
            ("max_requests", f"{self.max_len:,}-token requests at once",
             f"{n.max_requests:,} ({n.max_concurrency:.2f}x)"),
        ]

    def _data(self) -> dict[str, int]:
        """The raw numbers the HTML carries in ``data-*`` attributes."""
        n = self.numbers
        return {"bytes-per-token": n.bytes_per_token, "blocks": n.blocks, "tokens": n.tokens,
                "max-requests": n.max_requests}

    def _header(self) -> str:
        """The line above the numbers: the model and the budget."""
        return (f"{html.escape(self.shape.name)}: {self.shape.layers} layers x "
                f"{self.shape.kv_heads} KV heads x {self.shape.head_dim} dims, {self.dtype}, "
                f"{self.budget_gib:g} GiB")

    def numbers_html(self, dom_id: str = "capacity-numbers") -> str:
        """The numbers as an HTML table with stable ids and raw values in data attributes."""
        cells = "".join(
            f'<tr><th style="text-align:left;font-weight:normal;color:#57606a;'
            f'padding:2px 14px 2px 0">{label}</th>'
            f'<td data-key="{key}" style="text-align:right;font-weight:600">{value}</td></tr>'
            for key, label, value in self.rows()
        )
        data = "".join(f'data-{key}="{value}" ' for key, value in self._data().items())
        return (
            f'<div id="{dom_id}" class="capacity-numbers" {data}'
            f'style="font-size:13px;line-height:1.5">'
            f'<div style="font-weight:600;margin-bottom:4px">{self._header()}</div>'
            f"<table>{cells}</table></div>"
        )

    def _draw(self, fig: Figure, *, with_numbers: bool) -> Figure:
        """The curve for this model, marked at ``max_len``; the numbers to its right."""
        ax = fig.add_axes((0.08, 0.15, 0.5 if with_numbers else 0.88, 0.74))
        self._plot(ax)
        if with_numbers:
            fig.text(0.63, 0.89, f"{self.name}, {self.dtype}, {self.budget_gib:g} GiB",
                     fontsize=11, fontweight="bold", va="top")
            for i, (_, label, value) in enumerate(self.rows()):
                y = 0.72 - i * 0.09
                fig.text(0.63, y, label, fontsize=9.5, va="baseline", color="#57606a")
                fig.text(0.985, y, value, fontsize=9.5, va="baseline", ha="right",
                         fontweight="bold")
        return fig

    @property
    def name(self) -> str:
        """The model's name."""
        return self.shape.name

    def _plot(self, ax: Axes) -> None:
        """The curve for this model, marked at ``max_len``."""
        plot_concurrency_vs_context([self.shape], dtype=self.dtype, budget_gib=self.budget_gib,
                                    block_size=self.block_size, mark=self.max_len, ax=ax)

    def figure(self) -> Figure:
        """The static figure as a pyplot figure (end the cell with ``plt.show()``)."""
        return self._draw(plt.figure(figsize=(9, 3.4)), with_numbers=True)

    def _repr_svg_(self) -> str:
        return figure_svg(self._draw(Figure(figsize=(9, 3.4)), with_numbers=True))

    def _repr_png_(self) -> tuple[bytes, dict[str, int]]:
        return figure_png(self._draw(Figure(figsize=(9, 3.4)), with_numbers=True))

    def widget(self) -> SummaryBox:
        """Dropdowns and sliders for every input, the numbers, and the curve, wired up."""
        style = {"description_width": "initial"}
        model = widgets.Dropdown(options=[*MODELS, *HYBRID_MODELS, CUSTOM], description="model",
                                 style=style, value=self.name if self.name in MODELS
                                 or self.name in HYBRID_MODELS else CUSTOM)
        dtype = widgets.Dropdown(options=list(DTYPE_BYTES), value=self.dtype,
                                 description="dtype", style=style)
        shape_sliders = {
            "layers": widgets.IntSlider(value=self.shape.layers, min=1, max=128,
                                        description="layers", style=style),
            "kv_heads": widgets.IntSlider(value=self.shape.kv_heads, min=1, max=128,
                                          description="KV heads", style=style),
            "head_dim": widgets.IntSlider(value=self.shape.head_dim, min=8, max=256, step=8,
                                          description="head dim", style=style),
        }
        budget = widgets.FloatSlider(value=self.budget_gib, min=0.5,
                                     max=max(160.0, self.budget_gib), step=0.5,
                                     description="KV budget (GiB)", style=style,
                                     continuous_update=False)
        block = widgets.Dropdown(options=sorted({*BLOCK_SIZES, self.block_size}),
                                 value=self.block_size, description="block size", style=style)
        max_len = widgets.SelectionSlider(
            options=[(f"{n:,}", n) for n in sorted({*MAX_LENS, self.max_len})],
            value=self.max_len, description="max length", style=style,
            continuous_update=False,
        )
        for slider in shape_sliders.values():
            slider.continuous_update = False
        numbers = widgets.HTML(self.numbers_html())
        chart = widgets.HTML()
        numbers.add_class("capacity-numbers-box")
        chart.add_class("capacity-figure")
        syncing = False

        def current_shape() -> ModelShape:
            if model.value != CUSTOM:
                return MODELS[model.value]
            values = {key: s.value for key, s in shape_sliders.items()}
            return ModelShape(CUSTOM, q_heads=values["kv_heads"], source="set by hand",
                              **values)

        def update(_change: object = None) -> None:
            chosen = HYBRID_MODELS.get(model.value) or current_shape()
            calc = calculator(chosen, dtype=dtype.value, budget_gib=budget.value,
                              block_size=block.value, max_len=max_len.value)
            numbers.value = calc.numbers_html()
            svg = figure_svg(calc._draw(Figure(figsize=(5.6, 3.2)), with_numbers=False))
            encoded = base64.b64encode(svg.encode()).decode()
            alt = html.escape(repr(calc))
            chart.value = f'<img alt="{alt}" src="data:image/svg+xml;base64,{encoded}">'
            box.summary = f"capacity calculator: {calc!r}"

        def preset_chosen(_change: object) -> None:
            nonlocal syncing
            if syncing:
                return
            if model.value != CUSTOM:
                syncing = True
                preset = MODELS.get(model.value) or HYBRID_MODELS[model.value]
                for key, slider in shape_sliders.items():
                    slider.value = getattr(preset, key)
                syncing = False
            update()

        def shape_moved(_change: object) -> None:
            nonlocal syncing
            if syncing:
                return
            preset = MODELS.get(model.value) or HYBRID_MODELS.get(model.value)
            if preset is None or any(getattr(preset, k) != s.value
                                     for k, s in shape_sliders.items()):
                syncing = True
                model.value = CUSTOM
                syncing = False
            update()

        model.observe(preset_chosen, names="value")
        for slider in shape_sliders.values():
            slider.observe(shape_moved, names="value")
        for control in (dtype, budget, block, max_len):
            control.observe(update, names="value")
        for key, control in {"model": model, "dtype": dtype, **shape_sliders, "budget": budget,
                             "block-size": block, "max-len": max_len}.items():
            control.add_class(f"capacity-{key.replace('_', '-')}")
        box = SummaryBox([
            widgets.HBox([model, dtype]),
            widgets.HBox(list(shape_sliders.values())),
            widgets.HBox([budget, block, max_len]),
            widgets.HBox([numbers, chart]),
        ])
        update()
        return box



class HybridCapacityCalculator(CapacityCalculator):
    """The calculator for a hybrid model (chapter 08): requests of ``max_len`` tokens, with
    window layers handing back the blocks their window has passed, and without."""

    def __init__(self, model: str | HybridModel, *, dtype: str = "bf16",
                 budget_gib: float = 60.0, block_size: int = 16, max_len: int = 8192) -> None:
        self.model = hybrid_model(model) if isinstance(model, str) else model
        self.shape = ModelShape(self.model.name, self.model.layers, self.model.q_heads,
                                self.model.kv_heads, self.model.head_dim, self.model.source)
        self.dtype, self.budget_gib = dtype, budget_gib
        self.block_size, self.max_len = block_size, max_len
        self.hybrid = hybrid_capacity(self.model, _budget_bytes(budget_gib), max_len,
                                      block_size, dtype)

    @property
    def name(self) -> str:
        """The model's name."""
        return self.model.name

    def __repr__(self) -> str:
        n = self.hybrid
        return (f"{self.name}, {self.dtype}, {self.budget_gib:g} GiB, blocks of "
                f"{self.block_size}, {self.max_len:,} tokens: "
                f"{n.kv_bytes_exact / self.max_len:,.0f} B/token · {n.blocks:,} blocks · "
                f"{n.max_requests:,} requests ({n.max_requests_no_freeing:,} without freeing)")

    def rows(self) -> list[tuple[str, str, str]]:
        """(key, label, value) for each number the calculator shows."""
        n = self.hybrid
        return [
            ("bytes_per_token", f"KV bytes per token at {self.max_len:,}",
             f"{n.kv_bytes_exact / self.max_len:,.0f} B"),
            ("request_bytes", f"one {self.max_len:,}-token request", _bytes_label(
                n.blocks_per_request * n.block_bytes)),
            ("blocks", f"blocks of {_bytes_label(n.block_bytes)}", f"{n.blocks:,}"),
            ("tokens", "blocks per request", f"{n.blocks_per_request:,} "
                                             f"({n.blocks_per_request_no_freeing:,} kept)"),
            ("max_requests", f"{self.max_len:,}-token requests at once",
             f"{n.max_requests:,}"),
            ("max_requests_no_freeing", "the same, window blocks kept",
             f"{n.max_requests_no_freeing:,}"),
        ]

    def _data(self) -> dict[str, int]:
        n = self.hybrid
        return {"bytes-per-token": n.kv_bytes_exact // self.max_len, "blocks": n.blocks,
                "tokens": n.blocks * self.block_size, "max-requests": n.max_requests}

    def _header(self) -> str:
        groups = ", ".join(g.kind for g in self.model.kv_cache_groups())
        return (f"{html.escape(self.name)}: {self.model.layers} layers in groups [{groups}], "
                f"{self.dtype}, {self.budget_gib:g} GiB")

    def _plot(self, ax: Axes) -> None:
        plot_hybrid_concurrency([self.model], dtype=self.dtype, budget_gib=self.budget_gib,
                                block_size=self.block_size, mark=self.max_len, ax=ax)


def calculator(model: str | ModelShape | HybridModel, **options: Any) -> CapacityCalculator:
    """The calculator for ``model``: a preset name (plain or hybrid) or a shape."""
    hybrid = isinstance(model, HybridModel) or (isinstance(model, str) and model in HYBRID_MODELS)
    return (HybridCapacityCalculator if hybrid else CapacityCalculator)(model, **options)
