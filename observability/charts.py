"""Server-rendered SVG line charts: coordinates computed here, drawn by a template. No JavaScript, no CDN."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class LineChart:
    title: str
    unit: str
    width: int
    height: int
    polyline: str
    dots: list[tuple[float, float, str]]
    y_max: float
    y_max_label: str
    latest: float | None
    latest_label: str
    first_label: str
    last_label: str
    threshold_y: float | None
    empty: bool


def _fmt(value: float, unit: str) -> str:
    if unit == "%":
        return f"{value * 100:.1f}%"
    if abs(value) >= 100:
        return f"{value:,.0f}{unit and ' ' + unit}"
    return f"{value:.2f}{unit and ' ' + unit}"


def line_chart(
    *,
    title: str,
    points: Sequence[tuple[dt.datetime, float | None]],
    unit: str = "",
    threshold: float | None = None,
    width: int = 300,
    height: int = 110,
) -> LineChart:
    """A line through the points that have a value; gaps (``None``) are skipped. ``unit="%"`` for fractions."""
    pad = 6
    values = [v for _, v in points if v is not None]
    top = max([*values, threshold or 0.0, 0.0]) or 1.0
    n = max(1, len(points) - 1)
    coords = []
    dots = []
    for i, (moment, value) in enumerate(points):
        if value is None:
            continue
        x = pad + (width - 2 * pad) * i / n
        y = height - pad - (height - 2 * pad) * value / top
        coords.append(f"{x:.1f},{y:.1f}")
        dots.append((round(x, 1), round(y, 1), f"{moment:%H:%M} {_fmt(value, unit)}"))
    threshold_y = None
    if threshold is not None:
        threshold_y = round(height - pad - (height - 2 * pad) * threshold / top, 1)
    return LineChart(
        title=title,
        unit=unit,
        width=width,
        height=height,
        polyline=" ".join(coords),
        dots=dots,
        y_max=top,
        y_max_label=_fmt(top, unit),
        latest=values[-1] if values else None,
        latest_label=_fmt(values[-1], unit) if values else "—",
        first_label=f"{points[0][0]:%m-%d %H:%M}" if points else "",
        last_label=f"{points[-1][0]:%m-%d %H:%M}" if points else "",
        threshold_y=threshold_y,
        empty=not values,
    )
