"""The report's first screen (answer, decision rows, badges) and fmt, the one owner of how a
figure is written (issue 33)."""
import math
import re

import pandas as pd
import pytest

from helpers.records import build, windows_run
from ddpscale.report import fmt
from ddpscale.report.figures import scaling
from ddpscale.report.render import html_tables
from ddpscale.report.verdict import decision, firstscreen
from ddpscale.report.render import html as report_html


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


def test_intervals_of_ratios_add_both_sides_on_the_log_scale_and_never_reach_zero():
    base = pd.Series({"topology": "1x1", "speedup": 1.0, "throughput_samples_s": 100.0, "throughput_half_width": 3.0})
    row = pd.Series({"topology": "1x2", "speedup": 2.0, "throughput_samples_s": 200.0, "throughput_half_width": 8.0})
    table = scaling.add_intervals(pd.DataFrame([base, row]).assign(efficiency=[1.0, 1.0]), "1x1").set_index(
        "topology")
    # 3% and 4% relative half-widths are atanh(0.03) and atanh(0.04) on the log scale, in quadrature
    width = math.hypot(math.atanh(0.03), math.atanh(0.04))
    assert table.loc["1x2", ["speedup_low", "speedup_high"]].tolist() == pytest.approx(
        [2.0 * math.exp(-width), 2.0 * math.exp(width)])
    # the baseline's own interval is its throughput's, around 1
    assert table.loc["1x1", ["speedup_low", "speedup_high"]].tolist() == pytest.approx(
        [math.exp(-math.atanh(0.03)), math.exp(math.atanh(0.03))])
    # a half-width larger than the figure (the 765 on 484) leaves no interval rather than one
    # below zero; a wide one stays above zero
    wide = scaling.add_intervals(pd.DataFrame([base.to_dict() | {"throughput_half_width": 765.0 / 484 * 100},
                                                row.to_dict() | {"throughput_half_width": 180.0}])
                                  .assign(efficiency=[1.0, 1.0]), "1x1").set_index("topology")
    assert wide["speedup_low"].isna().all() and wide["interval_from"].iloc[0] == scaling.TOO_NOISY
    assert wide.loc["1x2", "throughput_low"] > 0 and wide.loc["1x2", "throughput_high"] < math.inf
    assert decision.speedup_text(table.loc["1x2"]) == "2.00x (1.90\u20132.11)"
    assert decision.speedup_text(row.to_dict() | {"speedup_low": float("nan")}) == "2.00x"  # no interval: none shown


def test_the_answer_names_the_topology_its_speedup_efficiency_and_full_training_with_intervals():
    data = build([windows_run("1x1"), windows_run("1x2", throughput_samples_s=190.0)])
    said = firstscreen.answer(data)
    assert said.startswith("Use 1x2: 1.90x (1.87\u20131.93) faster than 1x1 at 95% (93\u201397%) efficiency; "
                           "full training "), said
    assert re.search(r"full training [\d.]+ (s|min|h) \([\d.]+\u2013[\d.]+ (s|min|h)\) / [\d.,]+ "
                     r"\([\d.,]+\u2013[\d.,]+\) device-hours$", said), said
    # the same figures, written the same way, in the decision table
    row = [r for r in firstscreen.decision_rows(data) if r["topology"] == "1x2"][0]
    assert row["speedup"] == "1.90x (1.87\u20131.93)" and row["efficiency"] == "95% (93\u201397%)"
    assert row["time"] in said and f"{row['hours']} device-hours" in said


@pytest.mark.parametrize("note, label", [
    ("These runs used CPU processes standing in for GPUs", "CPU-simulated"),
    ("This workload is overhead-bound (compute is 20%)", "overhead-bound"),
    ("The throughput of 1x2 (step cap reached: ±4.1%) did not reach", "precision not reached"),
    ("Not steady: the windows of 2x1 kept moving", "not steady"),
    ("Something new the verdict says", "caveat")])
def test_each_caveat_gets_a_short_label(note, label):
    assert firstscreen.badge_label(note) == label


def test_a_throughput_cell_holds_one_figure_and_its_interval():
    runs = [windows_run("1x1"), *(windows_run("1x2", repeat=k, throughput_samples_s=t, throughput_half_width=8.0,
                                              stop_reason="step cap reached") for k, t in enumerate((190.0, 200.0)))]
    _, _, table = html_tables.scaling_table(build(runs))
    cells = re.findall(r'<td class="">([^<]*(?:<span class="reason"[^>]*>[^<]*</span>)?)</td>', str(table))
    shown = [re.sub(r"<[^>]+>", "", c) for c in cells if re.match(r"[\d,]+ \([\d,]+\u2013[\d,]+\)( |$)", c)]
    assert len(shown) == 2, cells  # one per topology
    assert shown[-1].endswith(" step cap")
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
