"""Chart geometry for server-rendered SVG (no script, so the portal's CSP stays strict): stacked bars
(GPU hours by month) and line charts (an attempt's utilisation). Templates draw what these return."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

WIDTH, HEIGHT, PAD = 640, 180, 28


@dataclass(frozen=True)
class Rect:
    x: float
    y: float
    w: float
    h: float
    css: str
    title: str


@dataclass(frozen=True)
class StackedBars:
    rects: list[Rect]
    labels: list[tuple[float, str]]  # x, text under each bar
    y_max: float
    width: int = WIDTH
    height: int = HEIGHT


def stacked_bars(bars: Sequence[tuple[str, Sequence[tuple[str, float, str]]]], unit: str) -> StackedBars:
    """``bars``: (label, [(css class, value, name), ...]) bottom up."""
    y_max = max((sum(v for _, v, _ in parts) for _, parts in bars), default=0.0) or 1.0
    inner_h = HEIGHT - 2 * PAD
    step = (WIDTH - PAD) / max(1, len(bars))
    rects, labels = [], []
    for i, (label, parts) in enumerate(bars):
        x = PAD + i * step + step * 0.15
        base = float(HEIGHT - PAD)
        for css, value, name in parts:
            h = inner_h * value / y_max
            if h > 0:
                rects.append(Rect(round(x, 1), round(base - h, 1), round(step * 0.7, 1), round(h, 1), css,
                                  f"{label}: {name} {value:.2f} {unit}"))
                base -= h
        labels.append((round(x + step * 0.35, 1), label))
    return StackedBars(rects, labels, y_max)


@dataclass(frozen=True)
class Line:
    css: str
    label: str
    points: str  # "x,y x,y ..."


@dataclass(frozen=True)
class LineChart:
    lines: list[Line]
    y_max: float
    unit: str
    first: str
    last: str
    width: int = WIDTH
    height: int = HEIGHT


def line_chart(series: Sequence[tuple[str, str, Sequence[tuple[float, float | None]]]], *, unit: str,
               y_max: float | None = None, first: str = "", last: str = "") -> LineChart:
    """``series``: (css class, label, [(x in seconds, value or None)]); x scales to the chart's width."""
    xs = [x for _, _, pts in series for x, v in pts if v is not None]
    values = [v for _, _, pts in series for _, v in pts if v is not None]
    top = y_max if y_max is not None else (max(values, default=0.0) or 1.0)
    lo, hi = (min(xs), max(xs)) if xs else (0.0, 1.0)
    span = (hi - lo) or 1.0
    inner_w, inner_h = WIDTH - 2 * PAD, HEIGHT - 2 * PAD
    lines = []
    for css, label, pts in series:
        coords = [f"{PAD + inner_w * (x - lo) / span:.1f},{HEIGHT - PAD - inner_h * min(v, top) / top:.1f}"
                  for x, v in pts if v is not None]
        if coords:
            lines.append(Line(css, label, " ".join(coords)))
    return LineChart(lines, top, unit, first, last)
