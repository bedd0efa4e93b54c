"""Server-rendered SVG line charts for the admin's queue dashboard.

The markup has no script, no style element and no style attribute, so it
renders under a strict Content-Security-Policy: every colour is a class that
static/echomq/echomq.css maps to the admin's theme variables, which is also
what makes a chart follow the light and dark themes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

KINDS = ("completed", "failed", "waiting")

# Room around the plot for the y labels (left), the legend and unit (top) and
# the x labels (bottom), in viewBox units.
_LEFT, _RIGHT, _TOP, _BOTTOM = 44, 8, 24, 20
_X_LABELS = 6  # the first, the last and about four between
_SWATCH = 10


@dataclass(frozen=True)
class Series:
    """One line of a chart: a value per slot, oldest first, None where a slot has no data."""

    label: str
    values: Sequence[float | None]
    kind: str


def nice_scale(top: float) -> tuple[float, float]:
    """Return the 1, 2 or 5 × 10^k ceiling at or above top, and the step between its gridlines."""
    if not top > 0:  # nothing to show (or NaN): a unit scale keeps the frame readable
        return 1.0, 0.5
    top = min(top, 1e300)  # a count another client wrote near the float limit: the ceiling stays finite
    power = 10.0 ** math.floor(math.log10(top))
    lead = next((lead for lead in (1, 2, 5) if lead * power >= top), 10)
    # Halves of a 1 or 5 ceiling and quarters of a 2 keep the labels round: 500, 1k, 1.5k, 2k.
    return lead * power, lead * power / (4 if lead == 2 else 2)


def compact(value: float) -> str:
    """Format a number in three significant digits at most, with a k, M, G or T suffix."""
    for suffix, size in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= size * 0.9995:  # 999 999 reads 1M, not 1e+03k
            return f"{value / size:.3g}{suffix}"
    return f"{value:.3g}"


def _coord(value: float) -> str:
    """Format a coordinate to a tenth of a unit, without a trailing .0."""
    return f"{value:.1f}".removesuffix(".0")


def _clean(value: float | None) -> float | None:
    """Return a value the chart can draw: None for no data, never below the 0 baseline."""
    if value is None or not math.isfinite(value):  # a rate over an empty slot may be NaN
        return None
    return max(float(value), 0.0)


def line_chart(series: Sequence[Series], *, slot_labels: Sequence[str], title: str,
               unit: str = "", width: int = 600, height: int = 160) -> SafeString:
    """Render series as an SVG line chart over slot_labels, with a legend and a y axis from 0."""
    if not series:
        raise ValueError("a chart needs at least one series")
    slots = len(slot_labels)
    for line in series:
        if len(line.values) != slots:
            raise ValueError(f"series {line.label!r} has {len(line.values)} values for {slots} slots")
        if line.kind not in KINDS:
            raise ValueError(f"series {line.label!r} has kind {line.kind!r}, not one of {', '.join(KINDS)}")
    values = [[_clean(value) for value in line.values] for line in series]
    ceiling, step = nice_scale(max((v for row in values for v in row if v is not None), default=0.0))
    left, right, top, base = _LEFT, width - _RIGHT, _TOP, height - _BOTTOM

    def x_at(slot: int) -> float:
        return left + (right - left) * slot / (slots - 1) if slots > 1 else (left + right) / 2

    def y_at(value: float) -> float:
        return base - (base - top) * value / ceiling

    ticks = [step * i for i in range(1, round(ceiling / step) + 1)]
    grid = format_html_join(
        "", '<line class="echomq-chart-gridline" x1="{}" y1="{}" x2="{}" y2="{}"/>',
        ((left, _coord(y_at(tick)), right, _coord(y_at(tick))) for tick in ticks))
    baseline = format_html('<line class="echomq-chart-baseline" x1="{}" y1="{}" x2="{}" y2="{}"/>',
                           left, base, right, base)
    # The labels sit a little below their line's y, which centres 11px text on it.
    y_labels = format_html_join(
        "", '<text class="echomq-chart-label echomq-chart-y" x="{}" y="{}" text-anchor="end">{}</text>',
        ((left - 6, _coord(y_at(tick) + 4), compact(tick)) for tick in [0.0, *ticks]))
    shown = sorted({round(i * (slots - 1) / (_X_LABELS - 1)) for i in range(_X_LABELS)}) if slots else []
    x_labels = format_html_join(
        "", '<text class="echomq-chart-label echomq-chart-x" x="{}" y="{}" text-anchor="{}">{}</text>',
        ((_coord(x_at(slot)), height - 6, _anchor(slot, slots), slot_labels[slot]) for slot in shown))
    lines = format_html_join("", "{}", ((_draw(line.kind, row, x_at, y_at),) for line, row in zip(series, values)))
    return format_html(
        '<svg xmlns="http://www.w3.org/2000/svg" class="echomq-chart" viewBox="0 0 {} {}" width="100%"'
        ' role="img" aria-label="{}"><title>{}</title>{}{}{}{}{}{}'
        '<text class="echomq-chart-label echomq-chart-unit" x="{}" y="{}" text-anchor="end">{}</text></svg>',
        width, height, title, title, grid, baseline, y_labels, x_labels, lines, _legend(series, left),
        right, 14, unit)


def _anchor(slot: int, slots: int) -> str:
    """Return the text-anchor that keeps a slot's label inside the chart."""
    if slots > 1 and slot == 0:
        return "start"
    return "end" if slots > 1 and slot == slots - 1 else "middle"


def _draw(kind: str, row: list[float | None], x_at: Callable[[int], float],
          y_at: Callable[[float], float]) -> SafeString:
    """Draw one polyline per run of slots with data, and a dot where a run is a single point."""
    runs: list[list[tuple[int, float]]] = [[]]
    for slot, value in enumerate(row):
        if value is None:
            runs.append([])  # a gap ends the run
        else:
            runs[-1].append((slot, value))
    runs = [run for run in runs if run]
    polylines = format_html_join(
        "", '<polyline class="echomq-series echomq-series-{}" data-points="{}" points="{}"/>',
        ((kind, len(run), " ".join(f"{_coord(x_at(slot))},{_coord(y_at(value))}" for slot, value in run))
         for run in runs))
    # A polyline of one point draws nothing, so a lone point gets a dot to be seen at all.
    dots = format_html_join(
        "", '<circle class="echomq-mark echomq-mark-{}" cx="{}" cy="{}" r="2.5"/>',
        ((kind, _coord(x_at(run[0][0])), _coord(y_at(run[0][1]))) for run in runs if len(run) == 1))
    return format_html("{}{}", polylines, dots)


def _legend(series: Sequence[Series], left: float) -> SafeString:
    """Draw a swatch and a label per series along the top, left to right."""
    items: list[tuple[str, str, int, int, str, str]] = []
    x = left
    for line in series:
        items.append((line.kind, _coord(x), _SWATCH, _SWATCH, _coord(x + _SWATCH + 4), line.label))
        x += _SWATCH + 4 + 6.5 * len(line.label) + 14  # no text metrics server-side: ~6.5 units a character
    return format_html_join(
        "", '<rect class="echomq-mark echomq-mark-{}" x="{}" y="5" width="{}" height="{}"/>'
            '<text class="echomq-chart-legend" x="{}" y="14">{}</text>', items)
