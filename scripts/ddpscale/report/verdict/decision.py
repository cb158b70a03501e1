"""Which topology to use, said only as far as the intervals support it.

The rule picks the largest usable topology (recommendation.usable) whose efficiency is at least the
threshold (the baseline's is 1, so there is always one), else the fastest. Every figure the rule
weighs has a 95% interval (scaling.add_intervals: on the log scale, a ratio's from both sides'
uncertainty), and a finding is stated only where those intervals separate the choice:

- a topology beyond the baseline: its speedup interval lies above 1 (the baseline's), its
  efficiency interval above the threshold, and it is surely faster than the runner-up (the rule's
  pick without it); and no other topology that could be the answer remains: each larger one, or
  one as large that could be faster, lies surely below the threshold;
- staying on the baseline: every other topology lies surely below the threshold.

Otherwise the data cannot tell yet, and the answer says so, names the cheapest topology the data
are consistent with (the fewest devices, then nodes, that no interval rules out), and what would
tell: the factor by which the doubts' intervals must narrow, bought with more repeats where the
spread between repeats sets them, else with a longer measurement (a half-width narrows with the
square root of the data), and what that costs in device-hours. Pure pandas.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from ddpscale.report.figures.scaling import OVER_REPEATS, ratio_spread
from ddpscale.report.fmt import estimate, known

# A doubt that would need more than this many times the data is not worth resolving: the two
# figures are equal for any purpose a user has, and the cheaper one will do.
MAX_FACTOR = 100.0
# Floating-point slack when a figure sits exactly on the threshold.
SLACK = 1e-9


@dataclass(frozen=True)
class Doubt:
    """One reason the intervals do not separate the choice."""
    text: str  # "1x2's speedup, 1.9x (0.6–5.9), reaches 1x1's"
    topologies: tuple[str, ...]  # whose measurements would tell
    margin: float  # log distance of the point figure from the line it must clear
    width: float  # the log half-width that must narrow below the margin (NaN: no interval)


@dataclass(frozen=True)
class Decision:
    choice: pd.Series | None  # the rule's pick on the point figures; None where nothing is usable
    doubts: tuple[Doubt, ...]  # empty: the intervals separate the choice
    consistent: pd.Series | None  # the cheapest topology the data are consistent with

    @property
    def told(self) -> bool:
        return self.choice is not None and not self.doubts


def speedup_text(row, bounds: bool = True) -> str:
    """'1.9x (0.6–5.9)': a speedup and its interval, in the digits the interval supports
    (bounds=False: '1.9x', the figure alone in those digits)."""
    return estimate(row.get("speedup"), row.get("speedup_low"), row.get("speedup_high"), 2, "x", bounds=bounds)


def efficiency_text(row, bounds: bool = True) -> str:
    """'95% (31–290%)'."""
    return estimate(row.get("efficiency"), row.get("efficiency_low"), row.get("efficiency_high"), 0, "%", 100,
                    bounds=bounds)


def _log(value) -> float:
    return math.log(value) if known(value) and value > 0 else math.nan


def _spread(row) -> float:
    return float(row["throughput_spread"]) if known(row.get("throughput_spread")) else math.nan


def faster(a, b) -> tuple[float, float, float]:
    """(T_a / T_b, low, high): the ratio of two topologies' throughputs with its 95% interval."""
    ratio = float(a["throughput_samples_s"]) / float(b["throughput_samples_s"])
    width = ratio_spread(_spread(a), _spread(b))
    return ratio, ratio * math.exp(-width), ratio * math.exp(width)


def _width(row, base) -> float:
    """The log half-width of a row's speedup (and efficiency) over the baseline."""
    return _spread(row) if row["topology"] == base["topology"] else ratio_spread(_spread(row), _spread(base))


def above(row, threshold: float) -> bool | None:
    """True: the efficiency interval lies at or above the threshold; False: below it; None: it
    straddles it (or there is no interval)."""
    low, high = row.get("efficiency_low"), row.get("efficiency_high")
    if not (known(low) and known(high)):
        return None
    if low >= threshold - SLACK:
        return True
    if high < threshold - SLACK:
        return False
    return None


def pick(rows: pd.DataFrame, threshold: float):
    """The rule on the point figures: the largest at or above the threshold, else the fastest."""
    if rows.empty:
        return None
    efficient = rows[rows["efficiency"] >= threshold - SLACK]
    if len(efficient):
        return efficient.sort_values(["world_size", "throughput_samples_s"]).iloc[-1]
    return rows.loc[rows["throughput_samples_s"].idxmax()]


def no_interval(*rows) -> str:
    """'1x1 has no interval (too short to tell)': those of the rows without one of their own."""
    short = list({str(r["topology"]): r for r in rows if not known(r.get("throughput_spread"))}.values())
    names = " and ".join(str(r["topology"]) for r in short)
    reasons = ", ".join(dict.fromkeys(str(r.get("interval_from")) for r in short))
    return f"{names} {'has' if len(short) == 1 else 'have'} no interval ({reasons})"


def _straddles(row, base, threshold: float) -> Doubt:
    name = row["topology"]
    return Doubt(f"{name}'s efficiency, {efficiency_text(row)}, "
                 + (f"is not known well enough: {no_interval(row, base)}" if not known(row.get("efficiency_low"))
                    else f"straddles the {threshold:.0%} threshold"),
                 (str(name), str(base["topology"])), abs(_log(row["efficiency"] / threshold)), _width(row, base))


def doubts(rows: pd.DataFrame, choice, base, threshold: float) -> list[Doubt]:
    """Why the intervals do not separate the choice (empty where they do)."""
    found = []
    baseline = base["topology"]
    others = rows[rows["topology"] != choice["topology"]]
    if choice["topology"] != baseline:
        if not known(choice.get("speedup_low")):
            found.append(Doubt(no_interval(choice, base), (str(choice["topology"]), str(baseline)),
                               abs(_log(choice["speedup"])), _width(choice, base)))
        elif choice["speedup_low"] <= 1 + SLACK:
            found.append(Doubt(f"{choice['topology']}'s speedup, {speedup_text(choice)}, reaches {baseline}'s",
                               (str(choice["topology"]), str(baseline)), abs(_log(choice["speedup"])),
                               _width(choice, base)))
        if choice["efficiency"] >= threshold - SLACK and above(choice, threshold) is not True \
                and known(choice.get("efficiency_low")):
            found.append(_straddles(choice, base, threshold))
        runner = pick(others[others["efficiency"] >= threshold - SLACK], threshold)
        if runner is not None and runner["topology"] != baseline:
            ratio, low, high = faster(choice, runner)
            if not low > 1 + SLACK:
                found.append(Doubt(f"{choice['topology']} is not surely faster than {runner['topology']} "
                                   f"({estimate(ratio, low, high, 2, 'x')} as fast)",
                                   (str(choice["topology"]), str(runner["topology"])), abs(_log(ratio)),
                                   ratio_spread(_spread(choice), _spread(runner))))
    # another topology that may stay above the threshold and would then be the answer: beside the
    # baseline any; beside a larger choice one larger still, or one as large that may be faster
    # (one as large and above the threshold is the runner-up, weighed above)
    for _, other in others.iterrows():
        if other["topology"] == baseline or above(other, threshold) is False:
            continue
        if choice["topology"] == baseline or other["world_size"] > choice["world_size"] or (
                other["world_size"] == choice["world_size"] and other["efficiency"] < threshold - SLACK
                and faster(other, choice)[2] > 1 + SLACK):
            found.append(_straddles(other, base, threshold))
    return found


def consistent(rows: pd.DataFrame, base, threshold: float):
    """The cheapest topology (fewest devices, then nodes) that the data do not rule out as the
    answer: its efficiency may reach the threshold, and no topology is surely both above the
    threshold and faster than it."""
    # the baseline's efficiency is 1 by definition: its interval is only its throughput's
    def may_stay(row) -> bool:
        return row["topology"] == base["topology"] or above(row, threshold) is not False

    sure = [r for _, r in rows.iterrows() if above(r, threshold) is True or r["topology"] == base["topology"]]
    candidates = []
    for _, row in rows.iterrows():
        if not may_stay(row):
            continue
        if any(o["topology"] != row["topology"] and faster(o, row)[1] > 1 + SLACK for o in sure):
            continue
        candidates.append(row)
    if not candidates:
        return None
    return sorted(candidates, key=lambda r: (int(r["world_size"]), int(r["num_nodes"])))[0]


def decide(usable: pd.DataFrame, baseline: str, threshold: float) -> Decision:
    """The choice among the usable rows and whether their intervals support it."""
    if usable.empty:
        return Decision(None, (), None)
    choice = pick(usable, threshold)
    bases = usable[usable["topology"] == baseline]
    if bases.empty or len(usable) == 1:  # nothing to weigh it against
        return Decision(choice, (), choice)
    base = bases.iloc[0]
    found = tuple(dict.fromkeys(doubts(usable, choice, base, threshold)))
    return Decision(choice, found, choice if not found else consistent(usable, base, threshold))


@dataclass(frozen=True)
class Remedy:
    """What would tell: the factor the doubts' data must grow by, and how to get it."""
    factor: float  # times the data; inf: a figure sits on its line; NaN: no interval to scale
    topologies: tuple[str, ...]
    repeats: bool  # more repeats (the spread between repeats sets the width), else a longer measurement


def remedy(decision: Decision, rows: pd.DataFrame) -> Remedy | None:
    """The data the doubts need: the largest (width / margin)^2 over them."""
    if not decision.doubts:
        return None
    names = tuple(dict.fromkeys(t for d in decision.doubts for t in d.topologies))
    factors = [(d.width / d.margin) ** 2 if d.margin > 0 else math.inf for d in decision.doubts]
    factor = math.nan if any(math.isnan(f) for f in factors) else max(factors)
    involved = rows[rows["topology"].isin(names)]
    by_repeats = bool((involved["interval_from"] == OVER_REPEATS).any())
    return Remedy(factor, names, by_repeats)
