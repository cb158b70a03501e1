"""The report's first screen, as data: the answer in one sentence, the decision table's rows, the
speedup interval both they and the plot show, and the caveats as short labelled badges.

A reader opens report.html to decide which topology to ask for; these say that in the units they
ask in (speedup, efficiency, hours and GPU-hours of the full training), and leave the evidence to
the sections below. Pure functions of the report's data; html.py marks them up.
"""
from __future__ import annotations

import math

import pandas as pd

from ddpscale.core import steadystate
from ddpscale.report import accuracy
from ddpscale.report.analysis import hours_label
from ddpscale.report.fmt import duration, hours, known, pct, plus_minus, times
from ddpscale.report.verdict import STATUS_OK, usable

# Why a run stopped before its interval met the precision asked for, named once in the legend
# under the tables; a cell carries only the short word.
STOP_REASONS = {
    steadystate.STEP_CAP: ("step cap", "stopped at throughput.max_steps before its interval met the precision "
                                       "asked for; the interval shown is the wider one it reached"),
    steadystate.TIME_CAP: ("time cap", "stopped at throughput.max_minutes before its interval met the precision "
                                       "asked for; the interval shown is the wider one it reached"),
    steadystate.EPOCHS_ENDED: ("epochs ended", "the configured epochs ended before its interval met the "
                                               "precision asked for; the interval shown is the one it reached"),
}


def stopped_short(row) -> str | None:
    """The stop reason where the run ended before its interval closed, else None."""
    reason = row.get("stop_reason")
    if isinstance(reason, str) and reason not in ("", steadystate.PRECISION, steadystate.FULL_TRAINING):
        return reason
    return None


def relative_half_width(row) -> float | None:
    """The 95% interval's half width of a topology's throughput as a share of it: within the run in
    throughput mode (the stopping rule's interval), else the mean's interval over 3 or more repeats."""
    mean = row.get("throughput_samples_s")
    if not known(mean) or mean <= 0:
        return None
    half = row.get("throughput_half_width")
    if known(half):
        return float(half) / float(mean)
    low, high = row.get("throughput_samples_s_ci_low"), row.get("throughput_samples_s_ci_high")
    if known(low) and known(high):
        return (float(high) - float(low)) / 2 / float(mean)
    return None


def speedup_interval(row, base) -> tuple[float, float] | None:
    """95% interval of a speedup (a ratio of two independent throughputs) by the delta method: the
    relative half widths add in quadrature. None where either side has no interval."""
    if not known(row.get("speedup")):
        return None
    mine, theirs = relative_half_width(row), relative_half_width(base)
    if mine is None or theirs is None:
        return None
    share = math.hypot(mine, theirs)
    return float(row["speedup"]) * (1 - share), float(row["speedup"]) * (1 + share)


def interval_text(row, base) -> str:
    """'6.51–7.13': a speedup's 95% interval, in the places times() writes the speedup; '' for none."""
    interval = speedup_interval(row, base)
    if interval is None or row.get("topology") == base.get("topology"):
        return ""
    return f"{interval[0]:.2f}\u2013{interval[1]:.2f}"


def speedup_text(row, base) -> str:
    """'6.82x (6.51–7.13)': the figure and its 95% interval, written as every table writes them."""
    interval = interval_text(row, base)
    return f"{times(row.get('speedup'))} ({interval})" if interval else times(row.get("speedup"))


def baseline_row(summary: pd.DataFrame, baseline: str):
    rows = summary[summary["topology"] == baseline]
    return rows.iloc[0] if len(rows) else pd.Series(dtype=object)


def accuracy_word(row, throughput_mode: bool) -> str:
    """The accuracy verdict in a word or two: held, NOT held, not compared, ..."""
    if throughput_mode:
        return "not compared"
    test, held = row.get("accuracy_test"), row.get("accuracy_held")
    if test == accuracy.REFERENCE:
        return "baseline"
    if known(held):
        return "held" if bool(held) else "NOT held"
    if test == accuracy.INCONCLUSIVE:
        return "inconclusive"
    if isinstance(test, str) and test.endswith("not tested"):
        return "not tested"
    return "not logged"


def choice(data):
    """The row the answer names: the largest topology above the efficiency threshold, else the
    fastest usable one; None where none finished usably."""
    ok = usable(data.summary, data.comparison)
    if ok.empty:
        return None
    efficient = ok[ok["efficiency"] >= data.threshold - 1e-9]
    if len(efficient):
        return efficient.sort_values(["world_size", "throughput_samples_s"]).iloc[-1]
    return ok.loc[ok["throughput_samples_s"].idxmax()]


def projected(data, topology: str):
    """The projection's row of a topology, or None."""
    table = data.projection
    if table is None or table.empty:
        return None
    rows = table[table["topology"] == topology]
    return rows.iloc[0] if len(rows) else None


def full_training(data, topology: str) -> str | None:
    """'full training 3.1 h / 25 GPU-hours', or None where it was not projected."""
    row = projected(data, topology)
    if row is None or not known(row.get("projected_s")):
        return None
    return (f"full training {duration(row['projected_s'])} / {hours(row['projected_device_hours'])} "
            f"{hours_label(data.summary)}")


def answer(data) -> str:
    """One sentence: which topology to use and why, in the reader's units."""
    baseline = data.comparison.baseline
    top = choice(data)
    if top is None:
        return "No topology to recommend: " + data.recommendation[:1].lower() + data.recommendation[1:]
    if top["topology"] == baseline:
        fastest = data.finished.sort_values("throughput_samples_s").iloc[-1]
        text = (f"Stay on {baseline}: no topology stays above {data.threshold:.0%} efficiency "
                f"(the fastest, {fastest['topology']}, is {times(fastest['speedup'])} at {pct(fastest['efficiency'])})")
    else:
        text = (f"Use {top['topology']}: {times(top['speedup'])} faster than {baseline} at "
                f"{pct(top['efficiency'])} efficiency")
        if top["efficiency"] < data.threshold - 1e-9:
            text += f" (the fastest; none stays above {data.threshold:.0%})"
    more = full_training(data, str(top["topology"]))
    return text + (f"; {more}" if more else "")


def decision_rows(data) -> list[dict]:
    """One row per topology for the decision table: the figures the answer weighs."""
    summary, throughput_mode = data.summary, data.comparison.throughput_mode
    base = baseline_row(summary, data.comparison.baseline)
    rows = []
    for _, r in summary.iterrows():
        finished = r["status"] == STATUS_OK or known(r["throughput_samples_s"])
        proj = projected(data, str(r["topology"]))
        rows.append({
            "topology": str(r["topology"]), "devices": int(r["world_size"]), "finished": finished,
            "status": str(r["status"]), "row": r,
            "speedup": times(r["speedup"]) if finished else "n/a",
            "interval": interval_text(r, base) if finished else "",
            "efficiency": pct(r["efficiency"]) if finished else "n/a",
            "time": duration(proj["projected_s"]) if proj is not None else "n/a",
            "hours": hours(proj["projected_device_hours"]) if proj is not None else "n/a",
            "accuracy": accuracy_word(r, throughput_mode) if finished else "",
        })
    return rows


# A caveat's badge: the first words of its sentence that say which it is -> the badge's label.
# A caveat not listed keeps a generic label, and its sentence is still one click away.
BADGES = (
    ("These runs used CPU processes", "CPU-simulated"),
    ("This workload is overhead-bound", "overhead-bound"),
    ("The throughput of", "not settled"),
    ("Left out of the recommendation:", "left out"),
    ("Nodes simulated on one host", "no network crossed"),
    ("accuracy not compared", "accuracy not compared"),
    ("Accuracy not tested", "accuracy not tested"),
    ("Accuracy inconclusive", "accuracy inconclusive"),
    ("The projections of", "larger batch untested"),
    ("torch.compile recompiled", "recompiles"),
    ("The probe could not measure", "probe failed"),
    ("MFU above 100%", "MFU over 100%"),
)


def badge_label(note: str) -> str:
    text = str(note)
    for start, word in BADGES:
        if text.startswith(start):
            return word
    if "not InfiniBand" in text:
        return "no InfiniBand"
    return "caveat"


def badges(notes: list, banner: str = "") -> list[tuple[str, object]]:
    """(label, the whole sentence) per caveat, the CPU-simulated one first: it changes every figure."""
    said = ([banner] if banner else []) + list(notes)
    return [(badge_label(note), note) for note in said]
