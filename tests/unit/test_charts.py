"""The admin's SVG line charts: geometry, gaps, escaping, the y scale and the stylesheet they need."""

import re
import xml.etree.ElementTree as ET
from pathlib import Path

import django
import pytest
from django.utils.safestring import SafeString

from echomq_django import charts
from echomq_django.charts import Series, compact, line_chart, nice_scale

SVG = "{http://www.w3.org/2000/svg}"
HOSTILE = """<script>alert(1)</script> "double" 'single' & more"""
CSS = Path(charts.__file__).parent / "static" / "echomq" / "echomq.css"


def render(*series: Series, slots: int | None = None, **kwargs) -> ET.Element:
    """A chart of series over slots labelled s0, s1, ..., parsed as XML (which it must be)."""
    count = len(series[0].values) if slots is None else slots
    kwargs.setdefault("slot_labels", [f"s{i}" for i in range(count)])
    kwargs.setdefault("title", "Jobs")
    return ET.fromstring(str(line_chart(series, **kwargs)))


def polylines(svg: ET.Element) -> list[ET.Element]:
    return svg.findall(f"{SVG}polyline")


def points(polyline: ET.Element) -> list[tuple[float, float]]:
    return [tuple(map(float, pair.split(","))) for pair in polyline.get("points").split()]


def texts(svg: ET.Element, cls: str) -> list[str]:
    return [text.text for text in svg.iter(f"{SVG}text") if cls in text.get("class").split()]


def line_of(svg: ET.Element, cls: str) -> list[ET.Element]:
    return [line for line in svg.iter(f"{SVG}line") if line.get("class") == cls]


def test_points_sit_on_the_scale_evenly_spaced_from_the_baseline_to_the_top_gridline():
    svg = render(Series("completed", [0, 5, 10, 2.5, 10], "completed"))
    [baseline] = line_of(svg, "echomq-chart-baseline")
    top_y = min(float(line.get("y1")) for line in line_of(svg, "echomq-chart-gridline"))
    [line] = polylines(svg)
    assert line.get("class") == "echomq-series echomq-series-completed" and line.get("data-points") == "5"
    left, right, base = float(baseline.get("x1")), float(baseline.get("x2")), float(baseline.get("y1"))
    step = (right - left) / 4
    quarter = (base - top_y) / 4
    assert points(line) == [(left, base), (left + step, base - 2 * quarter), (left + 2 * step, top_y),
                            (left + 3 * step, base - quarter), (right, top_y)]
    assert (left, right, base, top_y) == (44, 592, 140, 24)  # the default 600 × 160 layout
    assert texts(svg, "echomq-chart-y") == ["0", "5", "10"]
    assert not svg.findall(f"{SVG}circle")


def test_a_gap_starts_a_new_polyline_and_a_lone_point_gets_a_dot():
    svg = render(Series("failed", [None, 4, None, 1, 2, 3, None], "failed"))
    lone, run = polylines(svg)
    assert (lone.get("data-points"), run.get("data-points")) == ("1", "3")
    [baseline] = line_of(svg, "echomq-chart-baseline")
    left, step = float(baseline.get("x1")), (float(baseline.get("x2")) - float(baseline.get("x1"))) / 6
    assert [x for x, _ in points(lone) + points(run)] == [pytest.approx(left + slot * step, abs=0.05)
                                                           for slot in (1, 3, 4, 5)]
    [dot] = svg.findall(f"{SVG}circle")
    assert dot.get("class") == "echomq-mark echomq-mark-failed"
    assert (float(dot.get("cx")), float(dot.get("cy"))) == points(lone)[0]


def test_each_series_is_drawn_in_its_own_kind():
    svg = render(Series("completed", [1, 2], "completed"), Series("failed", [2, 1], "failed"),
                 Series("waiting", [None, 3], "waiting"))
    assert [line.get("class").split()[1] for line in polylines(svg)] == [
        "echomq-series-completed", "echomq-series-failed", "echomq-series-waiting"]
    assert texts(svg, "echomq-chart-legend") == ["completed", "failed", "waiting"]
    assert [rect.get("class") for rect in svg.iter(f"{SVG}rect")] == [
        "echomq-mark echomq-mark-completed", "echomq-mark echomq-mark-failed", "echomq-mark echomq-mark-waiting"]


def test_a_series_without_data_draws_no_line_but_the_frame_stays():
    svg = render(Series("waiting", [None] * 4, "waiting"), unit="jobs")
    assert polylines(svg) == [] and svg.findall(f"{SVG}circle") == []
    assert len(line_of(svg, "echomq-chart-baseline")) == 1 and len(line_of(svg, "echomq-chart-gridline")) == 2
    assert texts(svg, "echomq-chart-y") == ["0", "0.5", "1"]
    assert texts(svg, "echomq-chart-x") == ["s0", "s1", "s2", "s3"]
    assert texts(svg, "echomq-chart-legend") == ["waiting"] and texts(svg, "echomq-chart-unit") == ["jobs"]


def test_all_zero_and_unusable_values_keep_a_unit_scale_on_the_baseline():
    svg = render(Series("completed", [0, float("nan"), -3, 0], "completed"))
    first, second = polylines(svg)  # NaN is a gap; a negative value is drawn on the baseline
    [baseline] = line_of(svg, "echomq-chart-baseline")
    assert {y for _, y in points(first) + points(second)} == {float(baseline.get("y1"))}
    assert texts(svg, "echomq-chart-y")[-1] == "1"


def test_text_is_escaped_everywhere():
    markup = str(line_chart([Series(HOSTILE, [1, 2], "completed")], slot_labels=[HOSTILE, "b"],
                            title=HOSTILE, unit=HOSTILE))
    assert "<script" not in markup and "&lt;script&gt;alert(1)&lt;/script&gt;" in markup
    assert "&quot;double&quot;" in markup and "&amp; more" in markup
    svg = ET.fromstring(markup)  # and the parser reads back exactly what was given
    assert svg.get("aria-label") == HOSTILE and svg.find(f"{SVG}title").text == HOSTILE
    assert texts(svg, "echomq-chart-x")[0] == HOSTILE
    assert texts(svg, "echomq-chart-legend") == [HOSTILE] and texts(svg, "echomq-chart-unit") == [HOSTILE]


def test_the_svg_scales_is_accessible_and_needs_no_script_or_inline_style():
    chart = line_chart([Series("completed", [1, 2, 3], "completed")], slot_labels=["a", "b", "c"],
                       title="Completed per minute", width=800, height=200)
    assert isinstance(chart, SafeString)  # a template renders it as markup, not as text
    svg = ET.fromstring(str(chart))
    assert svg.tag == f"{SVG}svg" and svg[0].tag == f"{SVG}title" and svg[0].text == "Completed per minute"
    assert (svg.get("viewBox"), svg.get("width"), svg.get("height")) == ("0 0 800 200", "100%", None)
    assert (svg.get("role"), svg.get("aria-label")) == ("img", "Completed per minute")
    for element in svg.iter():
        assert element.tag not in (f"{SVG}script", f"{SVG}style") and "style" not in element.attrib
        assert not any(name.startswith("on") for name in element.attrib)


def test_a_long_range_shows_the_first_the_last_and_about_four_labels_between():
    labels = [f"14:{minute:02d}" for minute in range(30)]
    svg = render(Series("completed", [1] * 30, "completed"), slot_labels=labels)
    assert texts(svg, "echomq-chart-x") == ["14:00", "14:06", "14:12", "14:17", "14:23", "14:29"]
    anchors = [text.get("text-anchor") for text in svg.iter(f"{SVG}text") if "echomq-chart-x" in text.get("class")]
    assert anchors == ["start", "middle", "middle", "middle", "middle", "end"]  # the end labels stay inside


def test_a_single_slot_is_a_dot_in_the_middle():
    svg = render(Series("completed", [7], "completed"))
    [line] = polylines(svg)
    [dot] = svg.findall(f"{SVG}circle")
    [baseline] = line_of(svg, "echomq-chart-baseline")
    middle = (float(baseline.get("x1")) + float(baseline.get("x2"))) / 2
    assert line.get("data-points") == "1" and float(dot.get("cx")) == middle
    assert texts(svg, "echomq-chart-y") == ["0", "5", "10"]


@pytest.mark.parametrize(("top", "ceiling", "step"), [
    (0, 1, 0.5), (0.3, 0.5, 0.25), (1, 1, 0.5), (1.01, 2, 0.5), (3, 5, 2.5), (7, 10, 5), (10, 10, 5),
    (1234, 2000, 500), (5000, 5000, 2500), (5001, 10_000, 5000), (999_999, 1_000_000, 500_000),
])
def test_the_ceiling_is_the_next_1_2_or_5_times_a_power_of_ten(top, ceiling, step):
    assert nice_scale(top) == (pytest.approx(ceiling), pytest.approx(step))


def test_gridlines_are_labelled_compactly():
    svg = render(Series("completed", [1234, 0], "completed"))
    assert texts(svg, "echomq-chart-y") == ["0", "500", "1k", "1.5k", "2k"]
    assert len(line_of(svg, "echomq-chart-gridline")) == 4


@pytest.mark.parametrize(("value", "text"), [
    (0, "0"), (0.25, "0.25"), (999, "999"), (999.7, "1k"), (1500, "1.5k"), (250_000, "250k"),
    (2_000_000, "2M"), (999_999, "1M"), (2.5e9, "2.5G"), (3e12, "3T"),
])
def test_compact_numbers(value, text):
    assert compact(value) == text


@pytest.mark.parametrize(("series", "labels", "message"), [
    ([], ["a"], "at least one series"),
    ([Series("completed", [1, 2], "completed")], ["a"], "'completed' has 2 values for 1 slots"),
    ([Series("completed", [1], "completed"), Series("failed", [], "failed")], ["a"], "'failed' has 0 values"),
    ([Series("done", [1], "done")], ["a"], "kind 'done'"),
])
def test_inconsistent_input_is_refused(series, labels, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        line_chart(series, slot_labels=labels, title="Jobs")


def test_the_stylesheet_colours_every_kind_with_variables_the_admin_defines():
    css = CSS.read_text()
    admin_css = Path(django.__file__).parent / "contrib" / "admin" / "static" / "admin" / "css"
    light = set(re.findall(r"(--[\w-]+):", (admin_css / "base.css").read_text()))
    # Django 5.2 and 6 keep the dark values in dark_mode.css.
    dark = set(re.findall(r"(--[\w-]+):", (admin_css / "dark_mode.css").read_text()))
    own = set(re.findall(r"(--echomq[\w-]+):", css))
    used = set(re.findall(r"var\((--[\w-]+)", css)) - own
    assert used and used <= light, used - light
    assert "/* charts */" in css
    for kind in charts.KINDS:
        rule = re.search(rf"\.echomq-series-{kind},\s*\.echomq-mark-{kind}\s*\{{([^}}]*)\}}", css)
        assert rule, kind
        [colour] = re.findall(r"var\((--[\w-]+)\)", rule.group(1))
        assert colour in light and colour in dark, (kind, colour)  # follows the dark theme too
