"""Time to accuracy: how long each topology trained before its epoch metric reached the target.

A larger global batch can need more epochs to reach the same accuracy, so a throughput speedup
may not be a speedup of the training; MLPerf scores training this way (time to a quality
target). The target must be fixed before the runs it judges, or it moves with their own seed
noise (the baseline would always reach a target made from its own end): `accuracy.target` where
the config fixes one, as MLPerf fixes one per benchmark; else, with report.compare_with, an earlier
campaign's baseline final value of the epoch metric (its scaling.tsv carries it: finals) minus the
tolerance, plus it where lower is better; else none, and the table says how to fix one (the report
says which it used). A run's time to accuracy is
elapsed_s (training + validation of the epochs so far) of the first epoch whose value reaches
the target. A topology's is scored as MLPerf scores a benchmark's runs (mlcommons
training_policies, training_rules.adoc, "Benchmark Results"): from 5 repeats on, the fastest and
the slowest are dropped and the rest averaged, one run that never reached the target counting as
the slowest, more than one making the result "not reached"; with fewer, the median, a repeat
that never reached it counting as slower than any that did. Pure pandas, no torch.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ddpscale.report.figures import accuracy

THROUGHPUT_MODE = "not measured (throughput mode)"
OLYMPIC_FROM = 5  # repeats from which the fastest and slowest are dropped
COLUMNS = ("topology", "world_size", "metric", "target", "repeats", "reached", "epochs_to_target",
           "time_to_accuracy_s", "tta_speedup", "speedup", "status")


def _text(value) -> str | None:
    return value if isinstance(value, str) and value else None


def history(run) -> tuple[list[dict] | None, str | None]:
    """A run's val_history sorted by epoch, or None and why there is none."""
    if run["measure"] == "throughput":
        return None, THROUGHPUT_MODE
    entries = run["val_history"]
    if not entries:
        return None, f"not measured ({_text(run['val_history_reason']) or 'no validation value recorded'})"
    return sorted(entries, key=lambda e: e["epoch"]), None


def _known(value) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def reaches(value, target: float, way: str) -> bool:
    if not _known(value):
        return False
    if way == "max":
        return value >= target - accuracy.FLOAT_SLACK
    return value <= target + accuracy.FLOAT_SLACK


def target_value(final: float, tolerance: float, way: str) -> float:
    return final - tolerance if way == "max" else final + tolerance


def outcome(entries: list[dict], target: float, way: str) -> dict:
    """One run: time (inf when never reached), 1-based epochs to the target, epochs recorded,
    best value. An epoch validated but not finished has no elapsed_s and is not timed."""
    values = [e["value"] for e in entries if _known(e["value"])]
    best = (max(values) if way == "max" else min(values)) if values else float("nan")
    for e in entries:
        if reaches(e["value"], target, way) and _known(e.get("elapsed_s")):
            return {"time_s": float(e["elapsed_s"]), "epochs": e["epoch"] + 1, "recorded": len(entries), "best": best}
    return {"time_s": math.inf, "epochs": math.inf, "recorded": len(entries), "best": best}


def score(values: list[float]) -> float:
    """A topology's figure over its repeats (inf: a repeat never reached the target). From
    OLYMPIC_FROM repeats on, MLPerf's: the fastest and slowest dropped, the rest averaged; more
    than one repeat that never reached it makes the result inf. Below, the median (more than
    half never reached it: inf)."""
    if not values:
        return float("nan")
    if len(values) >= OLYMPIC_FROM:
        if sum(math.isinf(v) for v in values) > 1:
            return math.inf
        kept = sorted(values)[1:-1]
        return float(sum(kept) / len(kept))
    return float(np.median(values))


@dataclass(frozen=True)
class Target:
    """The value of the epoch metric every topology's time to accuracy is timed to."""
    metric: str | None  # the epoch metric the baseline recorded; None where it recorded none
    direction: str | None  # "max" or "min" (report.figures.accuracy.direction); None where there is no target
    value: float  # NaN: no target
    fixed: bool  # fixed before these runs (the config's, or an earlier campaign's)
    why_none: str | None  # why there is no target; None where there is one
    source: str = ""  # where the target comes from, for the report


# scaling.tsv's columns of each topology's final epoch metric, from which a later campaign with
# report.compare_with fixes its target
FINAL_COLUMNS = ("epoch_metric", "epoch_metric_final")


def finals(runs: pd.DataFrame) -> pd.DataFrame:
    """Per topology the epoch metric's name and its value at the last validation (median over
    the repeats that recorded one): FINAL_COLUMNS, NaN where none did."""
    rows = []
    for topology, group in runs.groupby("topology", sort=False):
        names, values = [], []
        for _, run in group.iterrows():
            entries, _ = history(run)
            if entries and _known(entries[-1]["value"]):
                names.append(_text(run["val_history_metric"]))
                values.append(float(entries[-1]["value"]))
        rows.append({"topology": topology, "epoch_metric": names[0] if names else None,
                     "epoch_metric_final": float(np.median(values)) if values else float("nan")})
    return pd.DataFrame(rows, columns=["topology", *FINAL_COLUMNS])


def _earlier_final(earlier: pd.DataFrame | None, baseline: str, metric: str) -> float | None:
    if earlier is None or not set(FINAL_COLUMNS) <= set(earlier.columns):
        return None
    rows = earlier[(earlier["topology"].astype(str) == baseline) & (earlier["epoch_metric"] == metric)]
    value = pd.to_numeric(rows["epoch_metric_final"], errors="coerce").dropna()
    return float(value.iloc[0]) if len(value) else None


def target(runs: pd.DataFrame, baseline: str, tolerance: float, mode: str = "auto",
           fixed: float | None = None, earlier: pd.DataFrame | None = None, earlier_name: str = "") -> Target:
    """The target: fixed, the config's accuracy.target; else the earlier campaign's (earlier: its
    scaling.tsv, report.compare_with) baseline final value minus the tolerance; else none, since
    one made from these runs' own baseline would move with their seeds."""
    finals_, reasons, metric = [], [], None
    for _, run in runs[runs["topology"] == baseline].iterrows():
        entries, why = history(run)
        if entries is None:
            reasons.append(why)
            continue
        metric = metric or _text(run["val_history_metric"])
        if _known(entries[-1]["value"]):
            finals_.append(float(entries[-1]["value"]))
    if metric is None:
        return Target(metric, None, float("nan"), fixed is not None,
                      reasons[0] if reasons else "not measured (no final value)")
    way = accuracy.direction(metric, mode)
    if fixed is not None:
        return Target(metric, way, float(fixed), True, None, "fixed in advance: config accuracy.target")
    before = _earlier_final(earlier, baseline, metric)
    if before is not None:
        return Target(metric, way, target_value(before, tolerance, way), True, None,
                      f"fixed before these runs: the earlier campaign's ({earlier_name}) baseline {baseline} "
                      f"final {metric} {_fmt(before)} {'-' if way == 'max' else '+'} the tolerance {tolerance:g}")
    reached = f" (the baseline {baseline} ended at {metric} {_fmt(float(np.median(finals_)))})" if finals_ else ""
    return Target(metric, way, float("nan"), False,
                  "not measured: no target was fixed before these runs; set accuracy.target in the config"
                  f"{reached}, since a target made from these runs' own baseline would move with their seeds")


def _fmt(value: float) -> str:
    return f"{value:.4g}"


def table(runs: pd.DataFrame, summary: pd.DataFrame, baseline: str, goal: Target) -> pd.DataFrame:
    """One row per topology of summary that has runs (COLUMNS); status says reached, not
    reached (with the best value against the goal's target) or why it is not measured."""
    metric, way, target, base_why = goal.metric, goal.direction, goal.value, goal.why_none
    rows = []
    for _, top in summary.iterrows():
        mine = runs[runs["topology"] == top["topology"]]
        if mine.empty:
            continue
        outcomes, reasons = [], []
        for _, run in mine.iterrows():
            entries, why = history(run)
            if entries is not None and metric is not None and _text(run["val_history_metric"]) != metric:
                entries, why = None, f"not measured (recorded {run['val_history_metric']}, the baseline {metric})"
            if entries is None:
                reasons.append(why)
            elif way is not None and _known(target):
                outcomes.append(outcome(entries, target, way))
        row = {"topology": top["topology"], "world_size": top["world_size"], "metric": metric, "target": target,
               "repeats": len(mine), "reached": sum(math.isfinite(o["time_s"]) for o in outcomes),
               "epochs_to_target": float("nan"), "time_to_accuracy_s": float("nan"), "tta_speedup": float("nan"),
               "speedup": top.get("speedup", float("nan"))}
        if base_why is not None and not reasons:
            # no target fixed in advance: the reason is the campaign's, not the baseline's runs'
            row["status"] = base_why if way is not None else f"no target: baseline {baseline} {base_why}"
        elif not outcomes:
            row["status"] = "; ".join(dict.fromkeys(reasons))
        else:
            time_s = score([o["time_s"] for o in outcomes])
            if math.isinf(time_s):
                best = [o["best"] for o in outcomes if _known(o["best"])]
                shown = _fmt((max(best) if way == "max" else min(best)) if best else float("nan"))
                row["status"] = (f"not reached in {max(o['recorded'] for o in outcomes)} epochs "
                                 f"(best {shown} vs target {_fmt(target)})")
            else:
                row.update(time_to_accuracy_s=time_s, epochs_to_target=score([o["epochs"] for o in outcomes]))
                row["status"] = "reached" + (f" in {row['reached']} of {len(outcomes)} repeats"
                                             if row["reached"] < len(outcomes) else "")
        rows.append(row)
    out = pd.DataFrame(rows, columns=list(COLUMNS))
    base = out.loc[out["topology"] == baseline, "time_to_accuracy_s"]
    if len(base):
        out["tta_speedup"] = float(base.iloc[0]) / out["time_to_accuracy_s"]
    return out


def rounded(tta: pd.DataFrame) -> pd.DataFrame:
    """For timetoacc.tsv: seconds to the millisecond, speedups as scaling.tsv rounds them."""
    return tta.round({"target": 6, "time_to_accuracy_s": 3, "tta_speedup": 3, "speedup": 3})
