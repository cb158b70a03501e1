"""The report's "Time to accuracy" table and its sentence in the methods (report/timetoacc.py)."""
from __future__ import annotations

import pandas as pd
from markupsafe import Markup, escape

from ddpscale.report.html_tables import _table, num
from ddpscale.report.verdict import times
from ddpscale.report import timetoacc


def _way(goal: timetoacc.Target) -> tuple[str, str]:
    """(comparison, sign of the tolerance) for the target's wording."""
    return (Markup("&ge;"), Markup("&minus;")) if goal.direction != "min" else (Markup("&le;"), "+")


def tta_table(data):
    tta = data.timetoacc
    if tta is None or tta.empty:
        return None
    heads = ["Topology", "Devices", "Epochs to target", "Time to accuracy (s)", "Time-to-accuracy speedup",
             "Throughput speedup", "Status"]
    rows = []
    for _, r in tta.iterrows():
        status = escape(str(r["status"]))
        if not str(r["status"]).startswith("reached"):
            status = Markup('<span class="na">{}</span>').format(status)
        rows.append(("", [escape(str(r["topology"])), str(int(r["world_size"])), num(r["epochs_to_target"], 0),
                          num(r["time_to_accuracy_s"], 1), times(r["tta_speedup"]), times(r["speedup"]), status]))
    goal = data.tta_target
    if pd.notna(goal.value):
        compare, sign = _way(goal)
        if goal.fixed:
            source = Markup("fixed in advance: config <code>accuracy.target</code>")
        else:
            source = Markup("the baseline {}'s final value {} {}; it moves with that run's seed, which "
                            "<code>accuracy.target</code> fixes").format(data.comparison.baseline, sign,
                                                                        f"{data.comparison.tolerance:g}")
        note = Markup("Target: {} {} {} ({}). Time to accuracy = the training time (training + validation of "
                      "the epochs so far) until the first epoch that reaches it; over repeats the median, "
                      "and from {} repeats MLPerf's score (the fastest and slowest dropped, the rest averaged; "
                      "one run that never reached it counts as the slowest, two make it not reached). The "
                      "speedup is the baseline's time / this one. A larger global batch can need more epochs, "
                      "so it can fall short of the throughput speedup.").format(
            goal.metric, compare, f"{goal.value:.4g}", source, timetoacc.OLYMPIC_FROM)
    else:
        note = "No target: the baseline recorded no epoch metric (see its status)."
    return "Time to accuracy", note, _table(heads, rows, text_cols=(6,))


def method(data) -> Markup | None:
    """The methods' sentence, where the table is shown."""
    if tta_table(data) is None:
        return None
    return Markup("<b>Time to accuracy</b> = the training time (the running sum of the epoch times, "
                  "training + validation) until the epoch metric (config <code>accuracy.epoch_metric</code>, "
                  "logged at every validation) first reaches the target: <code>accuracy.target</code> where "
                  "set, else the baseline's final value minus the tolerance (plus, where lower is better). "
                  "MLPerf scores training this way: a "
                  "larger global batch can need more epochs, so the time-to-accuracy speedup can be lower "
                  "than the throughput speedup. Not measured in throughput mode, which trains no whole run.")
