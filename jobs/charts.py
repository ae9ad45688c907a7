"""Inline SVG charts for the run report (torchjob.jobs.report): line charts with axes from the
data's own range, and a heat map. Pure: data in, markup out. Every series, cell and marker
carries a ``data-*`` attribute, so that a test in a browser can find it."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape
from typing import Callable

WIDTH, HEIGHT = 470, 290
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 34, 46
PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e")
# light to dark: a cell's colour, from the fastest cell to the slowest
HEAT = ((255, 247, 236), (253, 212, 158), (252, 141, 89), (215, 48, 31), (127, 0, 0))
EMPTY = "#e4e4e4"  # a cell without steps: the rank was not training then
Scale = Callable[[float], float]


@dataclass(frozen=True)
class Series:
    """One line: ``name`` is its ``data-series`` (e.g. ``train-loss``), ``label`` its legend."""

    name: str
    label: str
    points: list[tuple[float, float]]
    dots: bool = False


@dataclass(frozen=True)
class Marker:
    """A vertical line across a chart at ``x`` (a restart, a hang), labelled."""

    x: float
    label: str
    kind: str  # its data-marker: restart, hang
    colour: str = "#888"


@dataclass(frozen=True)
class Axis:
    label: str
    lo: float
    hi: float
    ticks: list[float] = field(default_factory=list)


def nice_step(span: float, count: int = 5) -> float:
    """A tick spacing of 1, 2 or 5 times a power of ten giving about ``count`` ticks."""
    raw = span / max(count, 1) if span > 0 else 1.0
    power = 10 ** math.floor(math.log10(raw))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= raw)


def axis(label: str, values: Sequence[float], *, pad: float = 0.08,
         bounds: tuple[float, float] | None = None, integer: bool = False) -> Axis:
    """An axis spanning ``values`` (padded by ``pad`` of their range, kept within ``bounds``):
    zoomed to the data, so that accuracy between 0.95 and 1.0 is not a flat line."""
    finite = [v for v in values if math.isfinite(v)] or [0.0]
    lo, hi = min(finite), max(finite)
    margin = (hi - lo) * pad if hi > lo else (abs(hi) * 0.05 or 0.5)
    lo, hi = lo - margin, hi + margin
    if bounds is not None:
        lo, hi = max(lo, bounds[0]), min(hi, bounds[1])
    step = max(nice_step(hi - lo), 1.0) if integer else nice_step(hi - lo)
    first = math.ceil(lo / step - 1e-9) * step
    ticks = [first + i * step for i in range(int((hi - first) / step + 1e-9) + 1)]
    return Axis(label, lo, hi, ticks)


def number(value: float, step: float) -> str:
    """``value`` with as many decimals as the tick spacing ``step`` needs."""
    decimals = max(0, -math.floor(math.log10(step))) if step > 0 else 0
    return f"{value:.{decimals}f}"


def frame(x: Axis, y: Axis, title: str) -> list[str]:
    """The title, both axes with their ticks and labels, and the grid."""
    px, py = scale_x(x), scale_y(y)
    out = [f'<text x="{WIDTH / 2}" y="18" class="title">{escape(title)}</text>',
           f'<line x1="{LEFT}" y1="{HEIGHT - BOTTOM}" x2="{WIDTH - RIGHT}" '
           f'y2="{HEIGHT - BOTTOM}" class="axis"/>',
           f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{HEIGHT - BOTTOM}" class="axis"/>']
    for axis_, ticks, horizontal in ((x, x.ticks, True), (y, y.ticks, False)):
        step = ticks[1] - ticks[0] if len(ticks) > 1 else 1.0
        for t in ticks:
            text = escape(number(t, step))
            if horizontal:
                out.append(f'<line x1="{px(t):.1f}" y1="{HEIGHT - BOTTOM}" x2="{px(t):.1f}" '
                           f'y2="{HEIGHT - BOTTOM + 4}" class="axis"/><text x="{px(t):.1f}" '
                           f'y="{HEIGHT - BOTTOM + 16}" class="tick" text-anchor="middle">'
                           f'{text}</text>')
            else:
                out.append(f'<line x1="{LEFT}" y1="{py(t):.1f}" x2="{WIDTH - RIGHT}" '
                           f'y2="{py(t):.1f}" class="grid"/><text x="{LEFT - 6}" '
                           f'y="{py(t) + 4:.1f}" class="tick" text-anchor="end">{text}</text>')
    out.append(f'<text x="{(LEFT + WIDTH - RIGHT) / 2}" y="{HEIGHT - 8}" class="label">'
               f'{escape(x.label)}</text>')
    out.append(f'<text transform="translate(14 {(TOP + HEIGHT - BOTTOM) / 2}) rotate(-90)" '
               f'class="label">{escape(y.label)}</text>')
    return out


def scale_x(x: Axis) -> Scale:
    span = (x.hi - x.lo) or 1.0
    return lambda v: LEFT + (v - x.lo) / span * (WIDTH - LEFT - RIGHT)


def scale_y(y: Axis) -> Scale:
    span = (y.hi - y.lo) or 1.0
    return lambda v: HEIGHT - BOTTOM - (v - y.lo) / span * (HEIGHT - TOP - BOTTOM)


def markers(found: Sequence[Marker], x: Axis) -> list[str]:
    """Vertical lines, each labelled at its top."""
    px, out = scale_x(x), []
    for i, m in enumerate(found):
        if not x.lo <= m.x <= x.hi:
            continue
        at = px(m.x)
        out.append(f'<g data-marker="{escape(m.kind)}"><line x1="{at:.1f}" y1="{TOP}" '
                   f'x2="{at:.1f}" y2="{HEIGHT - BOTTOM}" stroke="{m.colour}" '
                   f'stroke-dasharray="4 3"/><text x="{at + 3:.1f}" y="{TOP + 10 + 11 * i}" '
                   f'class="note" fill="{m.colour}">{escape(m.label)}</text></g>')
    return out


def line_chart(chart: str, title: str, series: Sequence[Series], x: Axis, y: Axis,
               found: Sequence[Marker] = ()) -> str:
    """An SVG line chart (``data-chart=chart``): one polyline per series, a legend."""
    px, py = scale_x(x), scale_y(y)
    out = frame(x, y, title) + markers(found, x)
    for i, s in enumerate(series):
        colour = PALETTE[i % len(PALETTE)]
        shown = [(a, b) for a, b in s.points if math.isfinite(b)]
        points = " ".join(f"{px(a):.1f},{py(b):.1f}" for a, b in shown)
        out.append(f'<g data-series="{escape(s.name)}" data-points="{len(shown)}">'
                   f'<polyline points="{points}" fill="none" stroke="{colour}" '
                   'stroke-width="1.8"/>')
        for a, b in shown if s.dots else ():
            out.append(f'<circle cx="{px(a):.1f}" cy="{py(b):.1f}" r="3" fill="{colour}">'
                       f'<title>{escape(s.label)} at {a:g}: {b:.4g}</title></circle>')
        out.append("</g>")
        out.append(f'<g class="legend"><rect x="{WIDTH - RIGHT - 120}" y="{TOP + 4 + 16 * i}" '
                   f'width="12" height="3" fill="{colour}"/><text x="{WIDTH - RIGHT - 104}" '
                   f'y="{TOP + 9 + 16 * i}" class="note">{escape(s.label)}</text></g>')
    return svg(chart, WIDTH, HEIGHT, out)


def svg(chart: str, width: int, height: int, body: list[str]) -> str:
    return (f'<svg data-chart="{escape(chart)}" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" xmlns="http://www.w3.org/2000/svg" role="img">'
            + "".join(body) + "</svg>")


def heat_colour(share: float) -> str:
    """The colour of a cell at ``share`` (0: the fastest cell, 1: the slowest)."""
    share = min(max(share, 0.0), 1.0) * (len(HEAT) - 1)
    i = min(int(share), len(HEAT) - 2)
    t = share - i
    r, g, b = (round(a + (c - a) * t) for a, c in zip(HEAT[i], HEAT[i + 1]))
    return f"#{r:02x}{g:02x}{b:02x}"



@dataclass(frozen=True)
class Grid:
    """A heat map's data: ``cells[row][column]`` (None: no data there), its rows' labels,
    the time axis its columns divide evenly, the unit of its values, and each row's
    ``data-rank`` (default: its index)."""

    cells: list[list[float | None]]
    rows: list[str]
    x: Axis
    unit: str = "ms"
    ids: list[int] = field(default_factory=list)


def heat_map(chart: str, title: str, grid: Grid, found: Sequence[Marker] = ()) -> str:
    """An SVG heat map (``data-chart=chart``): a row per rank, a column per time bucket, the
    colour from the fastest cell to the slowest (its legend below), grey where none."""
    width, columns = 900, max((len(r) for r in grid.cells), default=1) or 1
    row_h = max(6, min(22, 320 // max(len(grid.rows), 1)))
    top = TOP + 12 * len(found)  # room for the markers' labels, one line each
    plot_w, bottom = width - LEFT - RIGHT, top + row_h * len(grid.rows)
    values = [v for row in grid.cells for v in row if v is not None]
    lo, hi = (min(values), max(values)) if values else (0.0, 0.0)
    px = scale_x(Axis(grid.x.label, grid.x.lo, grid.x.hi))
    stretch: Scale = lambda v: LEFT + (px(v) - LEFT) * plot_w / (WIDTH - LEFT - RIGHT)
    cell_w = plot_w / columns
    out = [f'<text x="{width / 2}" y="18" class="title">{escape(title)}</text>']
    for r, (label, row) in enumerate(zip(grid.rows, grid.cells)):
        y = top + r * row_h
        if row_h >= 10:
            out.append(f'<text x="{LEFT - 6}" y="{y + row_h / 2 + 4}" class="tick" '
                       f'text-anchor="end">{escape(label)}</text>')
        rank = grid.ids[r] if r < len(grid.ids) else r
        out.append(f'<g data-series="{escape(chart)}" data-rank="{rank}">')
        for c, value in enumerate(row):
            fill = EMPTY if value is None else heat_colour((value - lo) / ((hi - lo) or 1.0))
            data = "" if value is None else f' data-ms="{value:.3f}"'
            tip = "no steps" if value is None else f"{value:.3f} {grid.unit}"
            out.append(f'<rect x="{LEFT + c * cell_w:.2f}" y="{y}" width="{cell_w + 0.3:.2f}" '
                       f'height="{row_h - 1}" fill="{fill}" data-bucket="{c}"{data}>'
                       f'<title>{escape(label)}, column {c}: {escape(tip)}</title></rect>')
        out.append("</g>")
    for t in grid.x.ticks:
        out.append(f'<text x="{stretch(t):.1f}" y="{bottom + 14}" class="tick" '
                   f'text-anchor="middle">{t:g}</text>')
    out.append(f'<text x="{LEFT + plot_w / 2}" y="{bottom + 30}" class="label">'
               f'{escape(grid.x.label)}</text>')
    for i, m in enumerate(found):
        if grid.x.lo <= m.x <= grid.x.hi:
            at = stretch(m.x)
            out.append(f'<g data-marker="{escape(m.kind)}"><line x1="{at:.1f}" '
                       f'y1="{TOP + 12 * i - 8}" x2="{at:.1f}" y2="{bottom}" stroke="{m.colour}" '
                       'stroke-width="2" '
                       f'stroke-dasharray="4 3"/><text x="{at + 3:.1f}" y="{TOP + 12 * i}" '
                       f'class="note" fill="{m.colour}">{escape(m.label)}</text></g>')
    out += legend(lo, hi, grid.unit, LEFT, bottom + 42)
    return svg(chart, width, bottom + 70, out)


def legend(lo: float, hi: float, unit: str, x: int, y: int) -> list[str]:
    """The heat map's colour scale: the fastest cell's value to the slowest's, and grey."""
    out = ['<g class="legend" data-legend="heat">']
    for i in range(20):
        out.append(f'<rect x="{x + 10 * i}" y="{y}" width="10" height="10" '
                   f'fill="{heat_colour(i / 19)}"/>')
    out.append(f'<text x="{x}" y="{y + 22}" class="note">{lo:.1f} {escape(unit)}</text>'
               f'<text x="{x + 200}" y="{y + 22}" class="note" text-anchor="end">'
               f'{hi:.1f} {escape(unit)}</text>'
               f'<rect x="{x + 230}" y="{y}" width="10" height="10" fill="{EMPTY}"/>'
               f'<text x="{x + 246}" y="{y + 9}" class="note">no steps (not training)</text>'
               '</g>')
    return out
