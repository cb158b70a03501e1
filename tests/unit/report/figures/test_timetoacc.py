"""Time to accuracy from hand-made metrics records (ddpscale.report.figures.timetoacc): the target, fixed
before the runs it judges (the config's, or an earlier campaign's baseline), never made from these
runs' own baseline; the first epoch that reaches it, the median over repeats, and every way it is
not measured."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from helpers.records import make_run
from ddpscale.report import reportdata
from ddpscale.report.figures import timetoacc
from ddpscale.report.render import html as report_html


def run(topology: str, values: list[float] | None, epoch_s: float, repeat: int = 0, metric: str = "val_acc",
        **extra) -> dict:
    """The keys time to accuracy reads of a full-mode record whose epochs each took epoch_s;
    values None: an empty val_history."""
    history = [{"epoch": i, "value": v, "elapsed_s": epoch_s * (i + 1)} for i, v in enumerate(values or [])]
    return {"topology": topology, "repeat": repeat, "world_size": int(topology.split("x")[1]),
            "measure": "full", "val_history_metric": metric, "val_history": history, "val_history_reason": None,
            **extra}


def summary(*rows: tuple[str, float]) -> pd.DataFrame:
    return pd.DataFrame([{"topology": t, "world_size": int(t.split("x")[1]), "speedup": s} for t, s in rows])


def tta(records: list[dict], tops=(("1x1", 1.0), ("1x4", 3.5)), tolerance: float = 0.02, mode: str = "auto",
        target: float | None = None, before: float | None = None):
    return timetoacc.table(pd.DataFrame(records), summary(*tops), "1x1",
                           goal(records, tolerance, mode, target, before)).set_index("topology")


def earlier(final: float, metric: str = "val_acc") -> pd.DataFrame:
    """An earlier campaign's scaling.tsv, as read back: its baseline's final epoch metric."""
    return pd.DataFrame([{"topology": "1x1", "epoch_metric": metric, "epoch_metric_final": final},
                         {"topology": "1x4", "epoch_metric": metric, "epoch_metric_final": final - 0.1}])


def goal(records: list[dict], tolerance: float = 0.02, mode: str = "auto", target: float | None = None,
         before: float | None = None):
    """The target: the config's (target), or an earlier campaign's whose baseline ended at `before`."""
    metric = records[0]["val_history_metric"] if records else "val_acc"
    return timetoacc.target(pd.DataFrame(records), "1x1", tolerance, mode, target,
                            None if before is None else earlier(before, metric), "earlier/scaling.tsv")


def test_the_first_epoch_at_the_earlier_baseline_final_minus_tolerance_is_timed_and_compared():
    # target 0.90 - 0.02 = 0.88: the baseline reaches it at epoch 3 (30 s), 1x4 at epoch 4 (4 x 4 s)
    out = tta([run("1x1", [0.5, 0.8, 0.89, 0.90], 10.0), run("1x4", [0.4, 0.7, 0.85, 0.88, 0.9], 4.0)],
              before=0.90)
    assert out.loc["1x1", "target"] == pytest.approx(0.88)
    assert out.loc["1x1", "time_to_accuracy_s"] == 30.0 and out.loc["1x1", "epochs_to_target"] == 3
    # 0.88 exactly is reached despite 0.90 - 0.02 != 0.88 in binary floating point
    assert out.loc["1x4", "time_to_accuracy_s"] == 16.0 and out.loc["1x4", "epochs_to_target"] == 4
    assert out.loc["1x4", "tta_speedup"] == pytest.approx(30.0 / 16.0)
    assert out.loc["1x4", "speedup"] == 3.5  # the throughput speedup, beside it
    assert out.loc["1x4", "status"] == "reached"


def test_a_topology_that_never_reaches_the_target_says_so_with_its_best():
    out = tta([run("1x1", [0.8, 0.9], 10.0), run("1x4", [0.5, 0.7, 0.8], 4.0)], before=0.9)
    assert math.isnan(out.loc["1x4", "time_to_accuracy_s"]) and math.isnan(out.loc["1x4", "tta_speedup"])
    assert out.loc["1x4", "status"] == "not reached in 3 epochs (best 0.8 vs target 0.88)"


def test_lower_is_better_adds_the_tolerance():
    # val_loss: target 0.30 + 0.05; 1x4 reaches 0.34 at its 2nd epoch
    records = [run("1x1", [1.0, 0.5, 0.3], 10.0, metric="val_loss"),
               run("1x4", [0.9, 0.34, 0.2], 4.0, metric="val_loss")]
    out = tta(records, tolerance=0.05, before=0.30)
    assert out.loc["1x1", "target"] == pytest.approx(0.35) and goal(records, 0.05).direction == "min"
    assert out.loc["1x4", "time_to_accuracy_s"] == 8.0 and out.loc["1x1", "time_to_accuracy_s"] == 30.0
    # accuracy.mode max overrides the name: the target is then 0.30 - 0.05
    forced = tta(records, tolerance=0.05, mode="max", before=0.30)
    assert goal(records, 0.05, "max").direction == "max" and forced.loc["1x1", "target"] == pytest.approx(0.25)


def test_the_median_over_repeats_counts_a_repeat_that_never_reached_as_slowest():
    base = run("1x1", [0.9], 10.0)
    three = [run("1x4", [0.88], 5.0, 0), run("1x4", [0.1, 0.88], 6.0, 1), run("1x4", [0.1, 0.2], 4.0, 2)]
    out = tta([base, *three], before=0.9)
    # times 5, 12, never -> median 12
    assert out.loc["1x4", "time_to_accuracy_s"] == 12.0 and out.loc["1x4", "reached"] == 2
    assert out.loc["1x4", "status"] == "reached in 2 of 3 repeats"
    # two of three never: the median is never
    out = tta([base, three[0], three[2], run("1x4", [0.5], 4.0, 3)], before=0.9)
    assert out.loc["1x4", "status"].startswith("not reached in 2 epochs (best 0.88")


def test_a_target_fixed_in_advance_replaces_the_baseline_s_noisy_final_value():
    # the baseline's seed ended at 0.95: its own target would be 0.93; the config fixes 0.85
    records = [run("1x1", [0.80, 0.86, 0.95], 10.0), run("1x4", [0.84, 0.86, 0.87], 4.0)]
    out = tta(records, target=0.85)
    assert out.loc["1x1", "target"] == 0.85 and goal(records, target=0.85).fixed
    assert goal(records, target=0.85).source == "fixed in advance: config accuracy.target"
    assert out.loc["1x1", "time_to_accuracy_s"] == 20.0 and out.loc["1x4", "time_to_accuracy_s"] == 8.0
    # the config's target wins over an earlier campaign's
    assert goal(records, target=0.85, before=0.99).value == 0.85


def test_five_repeats_or_more_are_scored_as_mlperf_scores_them():
    """training_rules.adoc, Benchmark Results: drop the fastest and the slowest, average the rest;
    one run that never converged is the slowest and dropped, two make the result invalid."""
    assert timetoacc.score([10.0, 20.0, 30.0, 40.0, 100.0]) == pytest.approx(30.0)
    assert timetoacc.score([10.0, 20.0, 30.0, 40.0, math.inf]) == pytest.approx(30.0)
    assert math.isinf(timetoacc.score([10.0, 20.0, 30.0, math.inf, math.inf]))
    assert timetoacc.score([10.0, 20.0, 90.0]) == 20.0  # fewer than 5: the median
    base = run("1x1", [0.9], 10.0)
    five = [run("1x4", [0.1] * k + [0.88], 4.0, k) for k in range(5)]  # 4, 8, 12, 16, 20 s
    assert tta([base, *five], before=0.9).loc["1x4", "time_to_accuracy_s"] == pytest.approx(12.0)


def test_no_target_is_made_from_the_runs_it_would_judge():
    """Without accuracy.target or an earlier campaign, the baseline's own end would be the target:
    the baseline always reaches it and it moves with these runs' seeds, so nothing is timed and
    the status says how to fix a target, naming where the baseline ended (median of its repeats)."""
    records = [run("1x1", [0.80], 10.0, 0), run("1x1", [0.90], 10.0, 1), run("1x1", [0.86], 10.0, 2),
               run("1x4", [0.95], 4.0)]
    out = tta(records)
    assert out["time_to_accuracy_s"].isna().all() and out["target"].isna().all()
    assert out.loc["1x4", "status"] == (
        "not measured: no target was fixed before these runs; set accuracy.target in the config (the baseline "
        "1x1 ended at val_acc 0.86), since a target made from these runs' own baseline would move with their seeds")
    assert not goal(records).fixed


def test_an_earlier_campaign_fixes_the_target_only_for_the_same_metric():
    records = [run("1x1", [0.5, 0.9], 10.0), run("1x4", [0.88], 4.0)]
    made = goal(records, before=0.9)
    assert made.fixed and made.value == pytest.approx(0.88)
    assert made.source == ("fixed before these runs: the earlier campaign's (earlier/scaling.tsv) baseline 1x1 "
                           "final val_acc 0.9 - the tolerance 0.02")
    other = timetoacc.target(pd.DataFrame(records), "1x1", 0.02, earlier=earlier(0.9, metric="val_f1"))
    assert math.isnan(other.value) and not other.fixed
    # a scaling.tsv from before these columns existed fixes nothing
    old = earlier(0.9).drop(columns=["epoch_metric_final"])
    assert math.isnan(timetoacc.target(pd.DataFrame(records), "1x1", 0.02, earlier=old).value)


def test_each_topology_s_final_epoch_metric_is_what_a_later_campaign_reads():
    records = [run("1x1", [0.5, 0.80], 10.0, 0), run("1x1", [0.5, 0.90], 10.0, 1), run("1x1", [0.5, 0.86], 10.0, 2),
               run("1x4", None, 4.0, measure="throughput")]
    out = timetoacc.finals(pd.DataFrame(records)).set_index("topology")
    assert out.loc["1x1", "epoch_metric"] == "val_acc" and out.loc["1x1", "epoch_metric_final"] == 0.86
    assert out.loc["1x4", "epoch_metric"] is None and math.isnan(out.loc["1x4", "epoch_metric_final"])


def test_throughput_mode_and_missing_histories_say_why_not():
    records = [run("1x1", [0.9], 10.0), run("1x4", None, 4.0, measure="throughput")]
    assert tta(records).loc["1x4", "status"] == "not measured (throughput mode)"
    records[1] = run("1x4", [], 4.0, val_history_reason="val_acc was not logged at validation; logged: val_loss")
    assert tta(records).loc["1x4", "status"] == "not measured (val_acc was not logged at validation; logged: val_loss)"
    # without the baseline's there is no target for anyone
    out = tta([run("1x1", None, 1.0, measure="throughput"), run("1x4", [0.9], 4.0)])
    assert out.loc["1x4", "status"] == "no target: baseline 1x1 not measured (throughput mode)"
    assert math.isnan(out.loc["1x4", "target"])


def test_another_metric_than_the_baseline_s_is_not_compared():
    out = tta([run("1x1", [0.9], 10.0), run("1x4", [0.95], 4.0, metric="val_f1")])
    assert out.loc["1x4", "status"] == "not measured (recorded val_f1, the baseline val_acc)"


# -- in the report ------------------------------------------------------------------------------

def history(values: list[float], epoch_times: list[float]) -> list[dict]:
    return [{"epoch": i, "value": v, "elapsed_s": sum(epoch_times[:i + 1])} for i, v in enumerate(values)]


def report(runs: list[dict], target: float | None = None):
    data = reportdata.build(pd.DataFrame(runs), {}, baseline="1x1", metric="test_acc", tolerance=0.02,
                            threshold=0.8, expected=[], repeats=1, log_tails={}, target=target)
    return data, report_html.build_report(data, {})


def test_the_report_shows_the_table_and_the_method_beside_the_throughput_speedup():
    times = [12.0, 10.0, 10.0]
    runs = [make_run("1x1", measure="full", val_history_metric="val_acc",
                     val_history=history([0.7, 0.89, 0.9], times)),
            make_run("1x2", throughput_samples_s=190.0, measure="full", val_history_metric="val_acc",
                     val_history=history([0.6, 0.8, 0.85], [6.0, 5.0, 5.0])),
            make_run("2x2", throughput_samples_s=300.0, measure="full", val_history_metric="val_acc",
                     val_history=history([0.88, 0.9, 0.9], [4.0, 3.0, 3.0]))]
    data, page = report(runs, target=0.88)
    tta = data.timetoacc.set_index("topology")
    assert tta.loc["1x1", "time_to_accuracy_s"] == 22.0 and tta.loc["2x2", "time_to_accuracy_s"] == 4.0
    assert tta.loc["2x2", "speedup"] == pytest.approx(3.0)
    section = page.split("<h2>Time to accuracy</h2>")[1].split("<h2>")[0]
    assert "val_acc &ge; 0.88 (fixed in advance: config accuracy.target)" in section
    assert "5.50x" in section and "3.00x" in section  # time to accuracy 22 / 4, throughput 300 / 100
    assert "not reached in 3 epochs (best 0.85 vs target 0.88)" in section
    assert "<b>Time to accuracy</b>" in page and "MLPerf" in page

