"""Server-rendered SVG charts: geometry computed here, drawn by the templates.

Hand-written rather than a charting library: the dashboard draws stacked bars and a few
lines, which is some arithmetic; a library would add a dependency to the Lambda layer
and most of them render in the browser with JavaScript fetched from a CDN, which the
page does not load (its Content-Security-Policy allows no script at all, and there may
be no internet where it runs). Every label goes through the templates' autoescaping.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

WIDTH = 640
HEIGHT = 180
LEFT = 48  # room for the y-axis labels
BOTTOM = 22  # room for the x-axis labels
TOP = 8


@dataclass(frozen=True)
class Bar:
    """One rectangle of a stacked bar, with its tooltip."""

    x: float
    y: float
    width: float
    height: float
    series: str
    title: str


@dataclass(frozen=True)
class Line:
    """One polyline series (points as an SVG ``points`` attribute)."""

    series: str
    label: str
    points: str
    dots: list[tuple[float, float, str]]


@dataclass(frozen=True)
class Tick:
    """An axis label at a position."""

    position: float
    label: str


@dataclass
class Chart:
    """Everything a template needs to draw one chart."""

    title: str
    width: int = WIDTH
    height: int = HEIGHT
    bars: list[Bar] = field(default_factory=list)
    lines: list[Line] = field(default_factory=list)
    y_ticks: list[Tick] = field(default_factory=list)
    x_ticks: list[Tick] = field(default_factory=list)
    legend: list[tuple[str, str]] = field(default_factory=list)
    empty: bool = False
    summary: str = ""

    @property
    def plot_left(self) -> int:
        """Where the plot area starts (right of the y labels)."""
        return LEFT

    @property
    def plot_bottom(self) -> int:
        """The y of the x axis."""
        return self.height - BOTTOM


def _nice_max(value: float) -> float:
    """The smallest 1, 2 or 5 times a power of ten at or above ``value``."""
    if value <= 0:
        return 1.0
    scale = 1.0
    while scale * 10 <= value:
        scale *= 10
    while scale > value:
        scale /= 10
    for step in (1, 2, 5, 10):
        if step * scale >= value:
            return step * scale
    return 10 * scale


def _x_ticks(labels: Sequence[str], slot: float) -> list[Tick]:
    every = max(1, len(labels) // 6)
    return [Tick(LEFT + slot * i + slot / 2, label)
            for i, label in enumerate(labels) if i % every == 0]


def _y_ticks(top: float, fmt: Callable[[float], str]) -> list[Tick]:
    plot = HEIGHT - BOTTOM - TOP
    return [Tick(HEIGHT - BOTTOM - plot * f, fmt(top * f)) for f in (0.0, 0.5, 1.0)]


def stacked_bars(title: str, labels: Sequence[str], series: Sequence[tuple[str, str]],
                 values: Sequence[dict[str, float]],
                 fmt: Callable[[float], str] = lambda v: f"{v:g}") -> Chart:
    """Bars of ``values[i][key]`` stacked in ``series`` order (key, label), one per label."""
    chart = Chart(title, legend=list(series))
    totals = [sum(v.get(key, 0) for key, _ in series) for v in values]
    top = _nice_max(max(totals, default=0))
    chart.empty = not any(totals)
    slot = (WIDTH - LEFT) / max(1, len(labels))
    plot = HEIGHT - BOTTOM - TOP
    for i, row in enumerate(values):
        base = float(HEIGHT - BOTTOM)
        for key, label in series:
            value = row.get(key, 0)
            if not value:
                continue
            height = plot * value / top
            base -= height
            chart.bars.append(Bar(LEFT + slot * i + slot * 0.1, base, slot * 0.8, height, key,
                                  f"{labels[i]}: {fmt(value)} {label}"))
    chart.x_ticks = _x_ticks(labels, slot)
    chart.y_ticks = _y_ticks(top, fmt)
    chart.summary = f"{fmt(sum(totals))} in total"
    return chart


def lines(title: str, labels: Sequence[str], series: Sequence[tuple[str, str]],
          values: Sequence[dict[str, float | None]], fmt: Callable[[float], str]) -> Chart:
    """One line per series; a None value leaves a gap in that line's dots."""
    chart = Chart(title, legend=list(series))
    present = [float(v[key]) for v in values for key, _ in series  # type: ignore[arg-type]
               if v.get(key) is not None]
    top = _nice_max(max(present, default=0))
    chart.empty = not present
    slot = (WIDTH - LEFT) / max(1, len(labels))
    plot = HEIGHT - BOTTOM - TOP
    for key, label in series:
        points: list[tuple[float, float, str]] = []
        for i, row in enumerate(values):
            value = row.get(key)
            if value is None:
                continue
            points.append((LEFT + slot * i + slot / 2, HEIGHT - BOTTOM - plot * value / top,
                           f"{labels[i]}: {label} {fmt(value)}"))
        chart.lines.append(Line(key, label, " ".join(f"{x:.1f},{y:.1f}" for x, y, _ in points),
                                points))
    chart.x_ticks = _x_ticks(labels, slot)
    chart.y_ticks = _y_ticks(top, fmt)
    return chart


def share(part: Any, whole: Any) -> float | None:
    """``part / whole`` as a fraction, None when there is no whole."""
    return float(part) / float(whole) if whole else None
