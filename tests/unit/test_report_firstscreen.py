"""The report's first screen (answer, decision rows, badges) and fmt, the one owner of how a
figure is written (issue 33)."""
import re

import pandas as pd
import pytest

from ddpscale.report import firstscreen, fmt, html_tables
from ddpscale.report import html as report_html
from test_projection import build, windows_run


@pytest.mark.parametrize("value, text", [(0.000561, "0.00056"), (0.0333, "0.033"), (24.8, "25"), (20.0, "20"),
                                         (1234.0, "1,200"), (0.75, "0.75"), (0.0, "0"), (None, "n/a")])
def test_device_hours_have_two_significant_digits(value, text):
    assert fmt.hours(value) == text


@pytest.mark.parametrize("seconds, text", [(3.25, "3.2 s"), (45.0, "45 s"), (720.0, "12 min"),
                                           (11160.0, "3.1 h"), (float("nan"), "n/a")])
def test_times_are_written_in_the_unit_their_size_needs(seconds, text):
    assert fmt.duration(seconds) == text


def test_percentages_carry_no_false_precision():
    assert fmt.pct(0.8431) == "84%" and fmt.plus_minus(0.047) == "\u00b14.7%"


def test_a_speedup_interval_adds_both_sides_relative_widths_in_quadrature():
    base = pd.Series({"topology": "1x1", "speedup": 1.0, "throughput_samples_s": 100.0, "throughput_half_width": 3.0})
    row = pd.Series({"topology": "1x2", "speedup": 2.0, "throughput_samples_s": 200.0, "throughput_half_width": 8.0})
    low, high = firstscreen.speedup_interval(row, base)
    assert (low, high) == pytest.approx((2.0 * (1 - 0.05), 2.0 * (1 + 0.05)))  # hypot(3%, 4%) = 5%
    assert firstscreen.speedup_text(row, base) == "2.00x (1.90\u20132.10)"
    assert firstscreen.speedup_interval(row.drop("throughput_half_width"), base) is None  # no interval: none shown


def test_the_answer_names_the_topology_its_speedup_efficiency_and_full_training():
    data = build([windows_run("1x1"), windows_run("1x2", throughput_samples_s=190.0)])
    said = firstscreen.answer(data)
    assert said.startswith("Use 1x2: 1.90x faster than 1x1 at 95% efficiency; full training ")
    assert re.search(r"full training [\d.]+ (s|min|h) / [\d.,]+ device-hours$", said), said
    # the same figures, written the same way, in the decision table
    row = [r for r in firstscreen.decision_rows(data) if r["topology"] == "1x2"][0]
    assert row["speedup"] == "1.90x" and row["interval"] and row["efficiency"] == "95%"
    assert row["time"] in said and f"{row['hours']} device-hours" in said


def test_below_the_threshold_the_answer_stays_on_the_baseline():
    data = build([windows_run("1x1"), windows_run("1x2", throughput_samples_s=110.0)])
    assert firstscreen.answer(data).startswith("Stay on 1x1: no topology stays above 80% efficiency")


@pytest.mark.parametrize("note, label", [
    ("These runs used CPU processes standing in for GPUs", "CPU-simulated"),
    ("This workload is overhead-bound (compute is 20%)", "overhead-bound"),
    ("The throughput of 1x2 (step cap reached: ±4.1%) did not reach", "not settled"),
    ("Something new the verdict says", "caveat")])
def test_each_caveat_gets_a_short_label(note, label):
    assert firstscreen.badge_label(note) == label


def test_a_throughput_cell_holds_one_figure_and_its_interval():
    runs = [windows_run("1x1"), *(windows_run("1x2", repeat=k, throughput_samples_s=t, throughput_half_width=8.0,
                                              stop_reason="step cap reached") for k, t in enumerate((190.0, 200.0)))]
    _, _, table = html_tables.scaling_table(build(runs))
    cells = re.findall(r'<td class="">([^<]*(?:<span class="reason"[^>]*>[^<]*</span>)?)</td>', str(table))
    shown = [c for c in cells if "\u00b1" in c]
    assert len(shown) == 2  # one per topology
    for cell in shown:
        text = re.sub(r"<[^>]+>", "", cell)
        assert re.fullmatch(r"[\d,]+ \u00b1\d+\.\d%( step cap)?", text), text
    assert "precision reached" not in str(table)  # only a short stop is named, once, in the legend


def test_the_first_screen_comes_before_every_section_and_every_section_folds():
    page = report_html.build_report(build([windows_run("1x1"), windows_run("1x2", throughput_samples_s=190.0)]), {})
    first = page[:page.index('<details class="section"')]
    assert 'id="answer">Use 1x2' in first and "<svg" in first and "Decision table" in first
    sections = re.findall(r'<details class="section" id="([\w-]+)"><summary><h2>([^<]+)</h2>', page)
    ids = [s[0] for s in sections]
    assert ids[0] == "scaling" and ids[-2:] == ["what-was-measured", "methods"]
    assert page.count('<details class="section"') == page.count("</details>") - page.count('<details class="badge"')
    assert "http://" not in page and "https://" not in page  # the inline SVG names no namespace URL
