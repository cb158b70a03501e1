"""Everything the report shows, computed once from the inputs (pure pandas, no torch)."""
from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from ddpscale.core import steadystate
from ddpscale.core.steadystate import EPOCHS_ENDED
from ddpscale.report.figures import breakdown, cost, projection, scaling, timetoacc
from ddpscale.report.figures.scaling import Comparison
from ddpscale.report.fmt import known, plus_minus, topology_names
from ddpscale.report.load import earlier as earlier_runs
from ddpscale.report.load.description import describe
from ddpscale.report.load.records import rules
from ddpscale.report.verdict import caveats, recommendation


# Why a throughput run stopped when its interval met the precision asked for: not shown.
PRECISION_REACHED = steadystate.PRECISION


@dataclass
class ReportData:
    comparison: Comparison  # the baseline, the accuracy metric and its test, the measure mode
    summary: pd.DataFrame  # one row per expected topology, with status
    runs: pd.DataFrame  # one row per metrics.json
    probes: dict  # topology -> probe.json record
    steps: pd.DataFrame  # breakdown.breakdown
    prediction: pd.DataFrame  # breakdown.predict
    cost: pd.DataFrame
    recommendation: str
    threshold: float
    spent: projection.Spent  # what the answer cost, and what full training would
    tta_target: timetoacc.Target  # what time to accuracy is timed to
    versus_earlier: pd.DataFrame | None = None  # earlier.compare: this scaling table beside an earlier one
    compared_with: str | None = None
    notes: list = field(default_factory=list)  # caveats.caveats: what a number cannot mean
    description: dict = field(default_factory=dict)  # description.describe: what was measured
    projection: pd.DataFrame | None = None  # projection.projection: the full training's cost, and the answer's
    timetoacc: pd.DataFrame | None = None  # timetoacc.table: time to the baseline's accuracy

    @property
    def finished(self) -> pd.DataFrame:
        return finished_rows(self.summary)


def finished_rows(summary: pd.DataFrame) -> pd.DataFrame:
    """Rows with measurements (plots and predictions skip topologies that did not finish)."""
    return summary[summary["throughput_samples_s"].notna()].reset_index(drop=True)


def build(runs: pd.DataFrame, probes: dict, *, baseline: str, metric: str, tolerance: float, mode: str = "auto",
          target: float | None = None,
          threshold: float, expected: list[str], repeats: int, log_tails: dict,
          earlier: pd.DataFrame | None = None, compared_with: str | None = None,
          description: dict | None = None, job_limits: dict | None = None) -> ReportData:
    comparison = scaling.compare(runs, baseline, metric, tolerance, mode)
    summary = scaling.summarize(runs, comparison)
    summary = scaling.add_missing(summary, expected or list(summary["topology"]), repeats, log_tails)
    summary = caveats.add_caveats(summary)
    done = finished_rows(summary)
    steps = breakdown.breakdown(done, probes)
    # each topology's final epoch metric, in scaling.tsv, so a later campaign can fix its target from it
    summary = summary.merge(timetoacc.finals(runs), on="topology", how="left")
    projected = projection.projection(runs, job_limits)
    goal = timetoacc.target(runs, baseline, tolerance, mode, target, earlier, compared_with or "")
    return ReportData(
        comparison=comparison, summary=summary, runs=runs, probes=probes,
        steps=steps, prediction=breakdown.predict(done, probes, baseline),
        cost=cost.cost_table(summary, baseline),
        recommendation=recommendation.recommendation(summary, comparison, threshold), threshold=threshold,
        versus_earlier=None if earlier is None else earlier_runs.compare(done, earlier),
        compared_with=compared_with,
        notes=caveats.caveats(summary, comparison, runs, steps, probes)
        + [n for n in [precision_note(summary, comparison, runs), steady_note(summary),
                       projection.weak_scaling_note(projected, summary, baseline)] if n],
        description=description or describe(runs),
        projection=projected, spent=projection.spent(runs, projected),
        timetoacc=timetoacc.table(runs, summary, baseline, goal), tta_target=goal,
    )


def precision_note(summary: pd.DataFrame, comparison: Comparison, runs: pd.DataFrame) -> str | None:
    """Said in the verdict where a throughput run stopped at a cap before its interval met the
    precision asked for: the figure stands, but with the wider interval it reached."""
    if not comparison.throughput_mode:
        return None
    reasons = summary["stop_reason"] if "stop_reason" in summary else pd.Series(dtype=object)
    short = summary[[isinstance(r, str) and r not in ("", PRECISION_REACHED) for r in reasons]]
    if short.empty:
        return None
    asked = ", ".join(dict.fromkeys(f"\u00b1{rule.precision:.0%}" for rule in rules(runs))) or "the precision"
    each = topology_names(pd.DataFrame({"topology": [f"{r['topology']} ({within_run(r)})"
                                                     for _, r in short.iterrows()]}))
    # the configured epochs ending first is cured by more epochs, a cap by a higher cap
    ended = all(r == EPOCHS_ENDED for r in short["stop_reason"])
    fix = ("raise max_epochs (the configured training ended before the interval closed)" if ended
           else "raise throughput.max_steps or throughput.max_minutes")
    return (f"The throughput of {each} did not reach the {asked} asked for: read it with the interval it "
            f"reached, or {fix} in the config and rerun it.")


def within_run(row) -> str:
    """'±1.2% within run', or where the precision was not reached, why: 'step cap reached: ±4.1%'.
    The interval is of each run's window throughput, its steady windows' samples over their
    seconds (the cell's figure is the median over repeats), which throughput_note says."""
    half, mean = row.get("throughput_half_width"), row.get("throughput_samples_s")
    interval = plus_minus(half / mean) if known(half) and mean else steadystate.TOO_SHORT
    reason = row.get("stop_reason")
    if isinstance(reason, str) and reason and reason != PRECISION_REACHED:
        return f"{reason}: {interval}"
    return f"{interval} within run"


def steady_note(summary: pd.DataFrame) -> str | None:
    """Said in the verdict where a topology's windows never settled: its figure is no steady
    level, and its interval says so by its width."""
    moving = summary[summary["windows_settled"].eq(False).fillna(False).astype(bool)]
    if moving.empty:
        return None
    return (f"Not steady: the windows of {topology_names(moving)} kept moving (a drift, or a level shift "
            "the stopping rule could not cut off as warm-up), so the figure is their later half's and its interval "
            "is widened by the change they show. Look at the recorded window_seconds, and measure again when the "
            "nodes are quiet or for longer (throughput.max_steps).")
