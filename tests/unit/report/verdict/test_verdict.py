"""Recommendation, cost, unfinished rows and comparison (ddpscale.report.verdict) on fixed summaries."""
from types import SimpleNamespace

import pandas as pd
import pytest

from helpers.records import compared, make_run
from ddpscale.report.figures import cost, scaling
from ddpscale.report.load import earlier
from ddpscale.report.render import html_tables
from ddpscale.report.verdict import recommendation


def compared_table(runs, expected=None, repeats=1, tails=None, simulated=False):
    """(summary with every expected topology, comparison) of hand-made runs."""
    runs = [{**r, "simulated": simulated, "device_name": "A100"} for r in runs]
    s, comparison = compared(runs)
    return scaling.add_missing(s, expected or list(s["topology"]), repeats, tails or {}), comparison


def table(runs, **kw):
    return compared_table(runs, **kw)[0]


RUNS = [make_run("1x1", throughput_samples_s=100.0, fit_time_s=400.0),
        make_run("1x2", throughput_samples_s=190.0, fit_time_s=210.0),
        make_run("1x4", throughput_samples_s=340.0, fit_time_s=118.0),
        make_run("2x4", throughput_samples_s=560.0, fit_time_s=72.0)]


def three_seeds(runs):
    """Each run as three repeats (seeds) alike: enough for the accuracy test."""
    return [{**r, "repeat": i} for r in runs for i in range(3)]


def test_recommends_fastest_and_largest_above_threshold():
    text = recommendation.recommendation(*compared_table(three_seeds(RUNS)), 0.8)
    assert text == ("The fastest is 2x4 (8 GPUs, 5.60x (5.54\u20135.66), 70% (69\u201371%) efficient); the largest "
                    "that stays above 80% efficiency is 1x4 (4 GPUs, 85% (84\u201386%))")
    # one seed each: accuracy is not tested, and the sentence says what it went by
    assert recommendation.recommendation(*compared_table(RUNS), 0.8).startswith(
        "By speed alone (accuracy not tested: one seed each), the fastest is 2x4")


def test_a_topology_that_lost_accuracy_is_never_recommended():
    runs = three_seeds(RUNS[:3] + [make_run("2x4", throughput_samples_s=560.0, test_acc=0.80)])
    text = recommendation.recommendation(*compared_table(runs), 0.8)
    assert "2x4" not in text and text.startswith("The fastest is 1x4")


def test_no_topology_above_threshold_says_so_and_simulated_is_labelled():
    runs = [RUNS[0], make_run("1x2", throughput_samples_s=120.0)]
    text = recommendation.recommendation(*compared_table(runs, simulated=True), 0.8)
    assert text.startswith("On CPU-simulated devices")
    assert "none beyond the baseline 1x1 stays above 80% efficiency" in text


def test_cost_is_per_sample_so_weak_scaling_at_perfect_efficiency_costs_nothing_extra():
    # the Markov data gives every rank its steps per epoch: 1x8 trains 8x the samples of 1x1
    # in the same time, and at perfect efficiency it costs nothing more per sample
    runs = [make_run("1x1", throughput_samples_s=100.0, fit_time_s=400.0, samples_trained=40000, held_s=430.0),
            make_run("1x8", throughput_samples_s=800.0, fit_time_s=400.0, samples_trained=320000, held_s=460.0),
            make_run("2x4", throughput_samples_s=640.0, fit_time_s=500.0, samples_trained=320000, held_s=560.0)]
    table_ = cost.cost_table(table(runs), "1x1").set_index("topology")
    assert table_.loc["1x8", "extra_pct"] == pytest.approx(0.0)
    assert table_.loc["1x8", "extra_gpu_hours"] == pytest.approx(0.0)
    assert table_.loc["2x4", "extra_pct"] == pytest.approx(25.0)  # efficiency 0.8: 1 / 0.8 - 1
    assert table_.loc["2x4", "gpu_seconds_per_sample"] == pytest.approx(8 / 640)
    # in hours, the extra for the 40,000 samples the baseline trained
    assert table_.loc["2x4", "extra_gpu_hours"] == pytest.approx((8 / 640 - 1 / 100) * 40000 / 3600)
    # what each run measured: its epochs, and the whole time it held its devices
    assert table_.loc["2x4", "gpu_hours"] == pytest.approx(500 * 8 / 3600)
    assert table_.loc["2x4", "held_gpu_hours"] == pytest.approx(560 * 8 / 3600)
    # fit times of different work do not compare: blank, and the note says why
    assert table_.loc["1x1", "time_speedup"] == pytest.approx(1.0)
    assert table_.loc[["1x8", "2x4"], "time_speedup"].isna().all()
    note = cost.time_speedup_note(table(runs), "1x1")
    assert "1x8 and 2x4" in note and "320,000" in note and "40,000" in note


def test_cost_table_html_leaves_time_speedup_blank_and_says_why():
    runs = [make_run("1x1", samples_trained=40000), make_run("1x2", samples_trained=80000)]
    s, comparison = compared_table(runs, simulated=True)
    heading, note, html = html_tables.cost_table(SimpleNamespace(summary=s, cost=cost.cost_table(s, "1x1"),
                                                                 comparison=comparison))
    row = html.split('<td class="l">1x2</td>')[1].split("</tr>")[0]
    assert row.count('<td class=""></td>') == 1  # the time speedup cell
    assert "device-seconds per 1,000 samples" in html and "Held device-hours" in html
    assert "Time speedup is blank for 1x2" in note and "zero at perfect efficiency" in note


def test_cost_speedup_in_time_is_kept_where_runs_trained_the_same_samples():
    table_ = cost.cost_table(table(RUNS), "1x1").set_index("topology")
    assert table_.loc["2x4", "time_speedup"] == pytest.approx(400 / 72)
    assert table_.loc["2x4", "extra_pct"] == pytest.approx((8 / 5.6 - 1) * 100)
    assert cost.time_speedup_note(table(RUNS), "1x1") is None


def test_unfinished_topologies_are_rows_marked_never_dropped():
    tails = {"2x4": "ddpscale train: training loss became non-finite", "4x4": None}
    s, comparison = compared_table(RUNS[:2], expected=["1x1", "1x2", "2x4", "4x4"], tails=tails)
    status = dict(zip(s["topology"], s["status"]))
    assert status == {"1x1": "ok", "1x2": "ok",
                      "2x4": "failed: ddpscale train: training loss became non-finite",
                      "4x4": "not run"}
    assert s.loc[s.topology == "4x4", "world_size"].item() == 16
    assert pd.isna(s.loc[s.topology == "2x4", "throughput_samples_s"].item())
    assert "2x4" not in recommendation.recommendation(s, comparison, 0.8)
    assert list(cost.cost_table(s, "1x1")["topology"]) == ["1x1", "1x2"]


def test_missing_repeats_are_reported():
    assert scaling.run_status(2, 3, None) == "2 of 3 repeats finished"
    assert scaling.run_status(0, 3, "") == "failed (empty log)"


def test_last_line_of_a_log(tmp_path):
    log = tmp_path / "r0.log"
    log.write_text("starting\nTraceback\nRuntimeError: boom\n\n")
    assert scaling.last_line(log) == "RuntimeError: boom"
    assert scaling.last_line(tmp_path / "none.log") is None


def test_comparison_shows_change_and_topologies_in_only_one_run(tmp_path):
    earlier_path = tmp_path / "scaling.tsv"
    old = scaling.rounded(table([make_run("1x1", throughput_samples_s=80.0),
                                  make_run("4x4", throughput_samples_s=900.0)]), "test_acc")
    old.to_csv(earlier_path, sep="\t", index=False)
    cmp = earlier.compare(table(RUNS[:2]), earlier.read_earlier(earlier_path)).set_index("topology")
    assert cmp.loc["1x1", "throughput_samples_s_change_pct"] == pytest.approx(25.0)
    assert cmp.loc["1x1", "present"] == "both"
    assert cmp.loc["1x2", "present"] == "only now" and cmp.loc["4x4", "present"] == "only earlier"


def test_earlier_table_errors_name_the_fix(tmp_path):
    with pytest.raises(ValueError, match="report.compare_with"):
        earlier.read_earlier(tmp_path / "missing.tsv")
    bad = tmp_path / "other.tsv"
    bad.write_text("a\tb\n1\t2\n")
    with pytest.raises(ValueError, match="not a ddpscale scaling.tsv"):
        earlier.read_earlier(bad)
