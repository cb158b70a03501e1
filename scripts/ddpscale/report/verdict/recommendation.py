"""The answer a user came for, in one sentence: the fastest topology and the largest one above the
efficiency threshold, each claimed only where the intervals tell it (verdict.decision), from the
rows that may be recommended (usable). Pure pandas, unit-tested without a cluster.
"""
from __future__ import annotations

import pandas as pd

from ddpscale.report.figures import accuracy
from ddpscale.report.figures.scaling import STATUS_OK, Comparison, device_word
from ddpscale.report.fmt import topology_names
from ddpscale.report.verdict import decision
from ddpscale.report.verdict.caveats import flag, flagged


def usable(summary: pd.DataFrame, comparison: Comparison) -> pd.DataFrame:
    """Finished topologies that were not oversubscribed (those measured contention, not
    scaling) and whose accuracy was not shown to drop. Where accuracy is compared, a row whose
    metric was not logged is left out too (never recommended as if it held); a row with too few
    seeds for a test, or whose test was inconclusive, stays, and the report says so; where
    accuracy is not compared at all (report.figures.accuracy.not_compared), speed alone decides and the
    recommendation says so."""
    status = summary["status"] if "status" in summary else pd.Series(STATUS_OK, index=summary.index)
    finished = summary[status.eq(STATUS_OK) & summary["throughput_samples_s"].notna()]
    if comparison.compared:
        finished = finished[~finished["accuracy_held"].eq(False).fillna(False) & ~accuracy.unlogged(finished)]
    return finished.drop(flagged(finished, "oversubscribed").index)


def tested_none(summary: pd.DataFrame, comparison: Comparison) -> bool:
    """Accuracy compared, yet no topology beside the baseline had the seeds for a test."""
    others = summary[summary["topology"] != comparison.baseline]
    others = others[others["throughput_samples_s"].notna() & ~accuracy.unlogged(others)]
    return comparison.compared and not others.empty and bool(accuracy.untested(others).all())


def recommendation(summary: pd.DataFrame, comparison: Comparison, threshold: float) -> str:
    """One sentence: the fastest topology, and the largest one above the efficiency threshold,
    each claimed only where the intervals tell it (report.verdict.decision), else what cannot be told."""
    ok = usable(summary, comparison)
    where = "On CPU-simulated devices (a pipeline check, not GPU results), " if summary["simulated"].any() else ""
    if not comparison.compared:
        where += f"by speed alone (accuracy not compared: {comparison.why_not_compared()}), "
    elif tested_none(summary, comparison):
        seeds = int(summary["repeats"].min())
        where += f"by speed alone (accuracy not tested: {accuracy.seeds_word(seeds)} each), "
    if ok.empty:
        held = " with accuracy held" if comparison.compared else ""
        if len(flagged(summary, "oversubscribed")):
            return _capital(f"{where}no topology finished{held} on enough cores, so there is nothing to recommend")
        return _capital(f"{where}no topology finished{held}, so there is nothing to recommend")
    fastest = ok.loc[ok["throughput_samples_s"].idxmax()]
    tied = [r for _, r in ok.iterrows() if r["topology"] != fastest["topology"]
            and not decision.faster(fastest, r)[1] > 1 + decision.SLACK]
    figures = f"{decision.speedup_text(fastest)}, {decision.efficiency_text(fastest)} efficient"
    if tied:
        fast = (f"the fastest cannot be told yet: {fastest['topology']} ({figures}) is not surely faster than "
                f"{topology_names(pd.DataFrame(tied))}")
    else:
        fast = f"the fastest is {fastest['topology']} ({_devices(summary, fastest)}, {figures})"
    others = ok[ok["topology"] != comparison.baseline]
    surely = others[[decision.above(r, threshold) is True for _, r in others.iterrows()]]
    maybe = others[[decision.above(r, threshold) is None for _, r in others.iterrows()]]
    if len(surely):
        top = surely.sort_values(["world_size", "throughput_samples_s"]).iloc[-1]
        keep = (f"the largest that stays above {threshold:.0%} efficiency is "
                f"{top['topology']} ({_devices(summary, top)}, {decision.efficiency_text(top)})")
        larger = maybe[maybe["world_size"] > top["world_size"]]
        if len(larger):
            keep += f"; whether {topology_names(larger)} also does cannot be told yet"
    elif len(maybe):
        keep = (f"whether any topology beyond the baseline {comparison.baseline} stays above {threshold:.0%} "
                f"efficiency cannot be told yet ({'; '.join(_efficiency(r) for _, r in maybe.iterrows())})")
    else:
        keep = f"none beyond the baseline {comparison.baseline} stays above {threshold:.0%} efficiency"
    return _capital(f"{where}{fast}; {keep}")


def _efficiency(row) -> str:
    return f"{row['topology']}: {decision.efficiency_text(row)}"


def _capital(sentence: str) -> str:
    return sentence[:1].upper() + sentence[1:]


def _devices(summary: pd.DataFrame, row) -> str:
    n = int(row["world_size"])
    where = ", nodes simulated on one host" if flag(row, "simulated_nodes_on_one_host") else ""
    return f"{n} {device_word(summary, n)}{where}"
