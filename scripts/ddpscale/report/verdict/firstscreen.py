"""The report's first screen, as data: the answer in one sentence (as far as the intervals support
it: report.verdict.decision), the decision table's rows, each figure with its interval, and the caveats as
short labelled badges.

A reader opens report.html to decide which topology to ask for; these say that in the units they
ask in (speedup, efficiency, hours and GPU-hours of the full training), and leave the evidence to
the sections below. Pure functions of the report's data; html.py marks them up.
"""
from __future__ import annotations

import math

import pandas as pd

from ddpscale.core import steadystate
from ddpscale.report.figures import accuracy
from ddpscale.report.figures.scaling import STATUS_OK, device_word, hours_label
from ddpscale.report.fmt import duration_estimate, hours, hours_estimate, known, sig, topology_names
from ddpscale.report.load.records import rules
from ddpscale.report.verdict import decision
from ddpscale.report.verdict.recommendation import usable

# Why a run stopped before its interval met the precision asked for, named once in the legend
# under the tables; a cell carries only the short word.
STOP_REASONS = {
    steadystate.STEP_CAP: ("step cap", "stopped at throughput.max_steps before its interval met the precision "
                                       "asked for; the interval shown is the wider one it reached"),
    steadystate.TIME_CAP: ("time cap", "stopped at throughput.max_minutes before its interval met the precision "
                                       "asked for; the interval shown is the wider one it reached"),
    steadystate.EPOCHS_ENDED: ("epochs ended", "the configured epochs ended before its interval met the "
                                               "precision asked for; the interval shown is the one it reached"),
    steadystate.NOT_STEADY: ("not steady", "its windows kept moving (a drift, or a shift the rule could not cut "
                                           "off as warm-up): the figure is its later half's, the interval widened by "
                                           "the change they show"),
}


def stopped_short(row) -> list[str]:
    """Why a run's figure is weaker than asked: its stop reason where it ended before its interval
    closed, and 'not steady' where its windows never settled."""
    said = []
    reason = row.get("stop_reason")
    if isinstance(reason, str) and reason not in ("", steadystate.PRECISION, steadystate.FULL_TRAINING):
        said += [r for r in reason.split("; ") if r not in (steadystate.PRECISION, steadystate.FULL_TRAINING)]
    settled = row.get("windows_settled")
    if settled is not None and not pd.isna(settled) and not bool(settled):
        said.append(steadystate.NOT_STEADY)
    return said


def baseline_row(summary: pd.DataFrame, baseline: str):
    rows = summary[summary["topology"] == baseline]
    return rows.iloc[0] if len(rows) else pd.Series(dtype=object)


def accuracy_word(row, throughput_mode: bool, change: str = "a drop of") -> str:
    """The accuracy verdict in a word or two: held (with the test's power), NOT held, not
    compared, ..."""
    if throughput_mode:
        return "not compared"
    test, held = row.get("accuracy_test"), row.get("accuracy_held")
    if test == accuracy.REFERENCE:
        return "baseline"
    if known(held):
        catches = row.get("accuracy_detectable")
        power = f" (would catch {change} {catches:.3g}+)" if bool(held) and known(catches) else ""
        return ("held" + power) if bool(held) else "NOT held"
    if test == accuracy.INCONCLUSIVE:
        return "inconclusive"
    if isinstance(test, str) and test.endswith("not tested"):  # 'one seed': the answer says not tested, once
        return test.split(":")[0]
    return "not logged"


def decided(data) -> decision.Decision:
    """The choice among the usable topologies and whether the intervals support it."""
    return decision.decide(usable(data.summary, data.comparison), data.comparison.baseline, data.threshold)


def choice(data):
    """The row the answer names where the data tell, else the cheapest topology they are
    consistent with; None where none finished usably."""
    said = decided(data)
    return said.choice if said.told else said.consistent


def projected(data, topology: str):
    """The projection's row of a topology, or None."""
    table = data.projection
    if table is None or table.empty:
        return None
    rows = table[table["topology"] == topology]
    return rows.iloc[0] if len(rows) else None


def full_training(data, topology: str) -> str | None:
    """'full training 3.1 h (2.8–3.5 h) / 25 (22–28) GPU-hours', or None where it was not projected."""
    row = projected(data, topology)
    if row is None or not known(row.get("projected_s")):
        return None
    return (f"full training {time_text(row)} / {hours_text(row)} {hours_label(data.summary)}")


def time_text(row) -> str:
    return duration_estimate(row.get("projected_s"), row.get("projected_s_low"), row.get("projected_s_high"))


def hours_text(row) -> str:
    return hours_estimate(row.get("projected_device_hours"), row.get("projected_device_hours_low"),
                          row.get("projected_device_hours_high"))


def answer(data) -> str:
    """One sentence: which topology to use and why, in the reader's units, or that the data cannot
    tell yet, which topology they are consistent with and what would tell."""
    baseline, threshold = data.comparison.baseline, data.threshold
    said = decided(data)
    top = said.choice
    if top is None:
        return "No topology to recommend: " + data.recommendation[:1].lower() + data.recommendation[1:]
    if not said.told:
        text = "Cannot tell yet: " + "; ".join(d.text for d in said.doubts)
        if said.consistent is not None:
            text += (f". The data are consistent with {said.consistent['topology']}, the cheapest "
                     f"({_devices(data, said.consistent)})")
        more = tell(data, said)
        return text + (f"; to tell, {more}" if more else "")
    others = usable(data.summary, data.comparison)
    others = others[others["topology"] != baseline]
    if others.empty:
        return f"Only {top['topology']} finished usably: there is nothing to compare it with"
    if top["topology"] == baseline:
        fastest = others.loc[others["throughput_samples_s"].idxmax()]
        text = (f"Stay on {baseline}: no topology stays above {threshold:.0%} efficiency "
                f"(the fastest of them, {fastest['topology']}, is {decision.speedup_text(fastest)} at "
                f"{decision.efficiency_text(fastest)})")
    else:
        text = (f"Use {top['topology']}: {decision.speedup_text(top)} faster than {baseline} at "
                f"{decision.efficiency_text(top)} efficiency")
        if top["efficiency"] < threshold - decision.SLACK:
            text += f" (the fastest; none stays above {threshold:.0%})"
    more = full_training(data, str(top["topology"]))
    return text + (f"; {more}" if more else "")


def _devices(data, row) -> str:
    n = int(row["world_size"])
    return f"{n} {device_word(data.summary, n)}"


def tell(data, said: decision.Decision) -> str | None:
    """What would tell, with what it costs: more repeats where the spread between repeats sets
    the intervals, else a longer measurement; or that no measurement worth its cost would."""
    cure = decision.remedy(said, data.summary)
    if cure is None:
        return None
    names = topology_names(pd.DataFrame({"topology": list(cure.topologies)}))
    label = hours_label(data.summary)
    rows = data.summary[data.summary["topology"].isin(cure.topologies)]
    if math.isnan(cure.factor):
        return (f"measure {names} longer, or on a quieter host: a run needs at least {steadystate.MIN_STEADY} "
                f"steady windows of throughput.window_steps steps, and its interval must stay clear of zero "
                f"({_longer(data, None)})")
    if cure.factor > decision.MAX_FACTOR:
        return (f"it would take over {decision.MAX_FACTOR:.0f} times the measurement of {names}: "
                "for any purpose they are alike here, and the cheaper will do")
    repeats = int(data.summary["repeats"].max())
    if cure.repeats:
        more = max(1, math.ceil(repeats * cure.factor) - repeats)
        cost = more * float(rows["held_gpu_hours"].sum())
        return (f"about {more} more repeat{'s' if more > 1 else ''} of {names} (repeats: {repeats + more}; "
                f"about {hours(cost)} {label})")
    cost = (cure.factor - 1) * float((rows["gpu_hours"] * rows["repeats"]).sum())
    return (f"measure {names} about {_factor(cure.factor)} longer ({_longer(data, cure.factor)}; "
            f"about {hours(cost)} {label} more)")


def _factor(factor: float) -> str:
    """'1.1x', '4.3x', '33x': rounded up, so 1.03 times the data reads as more than there was."""
    return f"{math.ceil(factor * 10) / 10:.1f}x" if factor < 10 else f"{math.ceil(factor):.0f}x"


def _longer(data, factor: float | None) -> str:
    """The setting that buys `factor` times the data (None: as much as an interval needs)."""
    runs = data.runs
    if data.comparison.throughput_mode:
        reasons = set(data.summary["stop_reason"].dropna())
        if factor is not None and reasons <= {steadystate.PRECISION}:
            precision = min(rule.precision for rule in rules(runs))
            return f"throughput.precision: {sig(precision / math.sqrt(factor), 2)}"
        caps = [rule.max_steps for rule in rules(runs) if rule.max_steps is not None]
        if factor is not None and caps:
            return f"throughput.max_steps: {math.ceil(max(caps) * factor)}"
        return "throughput.max_steps or max_minutes"
    epochs, warm = int(runs["configured_epochs"].max()), int(runs["warmup_epochs"].max())
    if factor is None:
        return f"more than {epochs} max_epochs, or a smaller throughput.window_steps"
    return f"max_epochs: {warm + math.ceil(max(1, epochs - warm) * factor)}"


def no_interval(row, base) -> str:
    """Why a speedup has no interval ('too short to tell', or its baseline's reason), or ''."""
    if known(row.get("speedup_low")):
        return ""
    if not known(row.get("throughput_spread")):
        return str(row.get("interval_from"))
    return f"no interval: {base.get('topology')} {base.get('interval_from')}"


def decision_rows(data) -> list[dict]:
    """One row per topology for the decision table: the figures the answer weighs, each with its
    interval."""
    summary, throughput_mode = data.summary, data.comparison.throughput_mode
    base = baseline_row(summary, data.comparison.baseline)
    rows = []
    for _, r in summary.iterrows():
        finished = r["status"] == STATUS_OK or known(r["throughput_samples_s"])
        proj = projected(data, str(r["topology"]))
        rows.append({
            "topology": str(r["topology"]), "devices": int(r["world_size"]), "finished": finished,
            "status": str(r["status"]), "row": r,
            "speedup": decision.speedup_text(r) if finished else "n/a",
            "interval": no_interval(r, base) if finished else "",
            "efficiency": decision.efficiency_text(r) if finished else "n/a",
            "time": time_text(proj) if proj is not None else "n/a",
            "hours": hours_text(proj) if proj is not None else "n/a",
            "accuracy": accuracy_word(r, throughput_mode, accuracy.change_word(data.comparison.direction))
            if finished else "",
        })
    return rows


# A caveat's badge: the first words of its sentence that say which it is -> the badge's label.
# A caveat not listed keeps a generic label, and its sentence is still one click away.
BADGES = (
    ("These runs used CPU processes", "CPU-simulated"),
    ("This workload is overhead-bound", "overhead-bound"),
    ("The throughput of", "precision not reached"),
    ("Not steady", "not steady"),
    ("Left out of the recommendation:", "left out"),
    ("Nodes simulated on one host", "no network crossed"),
    ("accuracy not compared", "accuracy not compared"),
    ("Accuracy not tested", "too few seeds"),
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
