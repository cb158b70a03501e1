"""Which logged metric the report compares with the baseline, and which way is better.

A module logs under names of its own (`self.log("valid/accuracy", ...)`); every run's
metrics.json keeps each scalar it logged under `logged_metrics`. `accuracy.metric` names one
of them and `accuracy.mode` says which way is better: max (an accuracy), min (a loss), or auto,
read from the name. A metric no run logged is not an error: the report says accuracy was not
compared, names what the runs did log, and recommends by speed alone, saying so.
Pure pandas, no torch.
"""
from __future__ import annotations

import re

import pandas as pd

from ddpscale.core.stats import difference_bounds, resolution, welch

# Words in a metric's name that make lower better under mode auto (val_loss, test/error,
# perplexity, val_mse, ...); any other name is taken as an accuracy-like score.
LOWER_IS_BETTER = ("loss", "error", "err", "perplexity", "ppl", "mse", "mae", "rmse", "nll", "ce", "bce",
                   "xent", "wer", "cer", "bpc", "bpb", "kl")
# In throughput mode each run stops once its throughput is measured, long before the configured
# training ends: whatever metric it logged is no final accuracy, so none is compared.
THROUGHPUT_MODE = "not compared (throughput mode)"
NOT_COMPARED_THROUGHPUT = (f"accuracy {THROUGHPUT_MODE}: each run stopped once its throughput was measured, "
                           "before the configured training ended, so there is no final accuracy to compare; "
                           "set measure: full to train in full and compare it")
# 0.90 - 0.88 is -0.0200000000000000018 in binary floating point; without slack a drop of
# exactly the tolerance would be reported as a failure.
FLOAT_SLACK = 1e-9


def direction(metric: str, mode: str = "auto") -> str:
    """'max' (higher is better) or 'min' (lower is better)."""
    if mode in ("max", "min"):
        return mode
    words = [w for w in re.split(r"[^a-z0-9]+", metric.lower()) if w]
    lower = any(w in LOWER_IS_BETTER or w.endswith(("loss", "error")) for w in words)
    return "min" if lower else "max"


def change_word(direction_: str) -> str:
    """'a drop of' where higher is better, 'a rise of' where lower is."""
    return "a rise of" if direction_ == "min" else "a drop of"


def better(direction_: str) -> str:
    return "lower is better" if direction_ == "min" else "higher is better"


def values(runs: pd.DataFrame, metric: str) -> pd.Series:
    """The metric's value per run, from its logged_metrics: NaN where it did not log it."""
    found = [logged.get(metric) for logged in runs["logged_metrics"]]
    return pd.to_numeric(pd.Series(found, index=runs.index, dtype=object), errors="coerce")


def logged_names(runs: pd.DataFrame) -> list[str]:
    """Every metric name some run logged, sorted."""
    return sorted({name for logged in runs["logged_metrics"] for name in logged})


# Seeds a side needs before "accuracy held" is a test: below this the spread between seeds
# cannot be estimated, and one seed's noise alone (1.55% on the spiral) crosses a 0.02 tolerance
# in about one run in five.
MIN_SEEDS = 3
# What a row's accuracy_test says (beside accuracy_held: True, False or NA)
REFERENCE = "baseline"
NOT_LOGGED = "not logged"
HELD = "held"
DROPPED = "not held"
INCONCLUSIVE = "inconclusive"


def seeds_word(n: int) -> str:
    return "one seed" if n == 1 else f"{n} seeds"


def not_tested(n: int) -> str:
    return f"{seeds_word(n)}: not tested"


def verdict(values: list[float], baseline: list[float], tolerance: float, direction_: str,
            is_baseline: bool = False) -> tuple[bool | None, str, float]:
    """Whether a topology's metric held against the baseline's, as a test over seeds (one
    repeat, one seed): (held, what accuracy_test says, the end of the one-sided 95% interval of
    the change the wrong way that decided it). A non-inferiority test at the tolerance (Welch's t, one-sided 95%):
    held (True) where even the worst end of the interval of the change is within tolerance;
    not held (False) where even its best end is beyond it; else inconclusive (None). Fewer than
    MIN_SEEDS on either side: not tested (None)."""
    if not values or not baseline:
        return None, NOT_LOGGED, float("nan")
    if is_baseline:
        return True, REFERENCE, 0.0
    _, low, high = difference_bounds(values, baseline)
    # the ends of the interval of the change the wrong way (a drop where higher is better)
    best, worst = (-high, -low) if direction_ == "max" else (low, high)
    seeds = min(len(values), len(baseline))
    if seeds < MIN_SEEDS:
        return None, not_tested(seeds), float("nan")
    if worst <= tolerance + FLOAT_SLACK:
        return True, HELD, worst
    if best > tolerance + FLOAT_SLACK:
        return False, DROPPED, best
    return None, INCONCLUSIVE, worst


# Degrees of freedom the power is stated at: Welch's estimate varies from draw to draw and drops
# towards one side's seeds - 1, and the t quantiles at 2n - 2 overstated the power of three seeds
# a side (69% where 80% was stated); at n - 1 it is at least 80% from 3 to 15 seeds
# (tests/unit/report/figures/test_accuracy.py counts it).
def _power_dof(n: int) -> int:
    return n - 1


def detectable(values: list[float], baseline: list[float], tolerance: float) -> float:
    """The test's power, stated as a change: the change the wrong way beyond which it says NOT
    held at least 4 times in 5 (80% power), with these seeds and the seed noise they show:
    tolerance + resolution (stats.resolution). NaN where the test did not run (fewer than
    MIN_SEEDS a side)."""
    seeds = min(len(values), len(baseline))
    if seeds < MIN_SEEDS:
        return float("nan")
    _, se, _ = welch(values, baseline)
    return tolerance + (resolution(se, _power_dof(seeds)) if se > 0 else 0.0)


def seeds_for(shift: float, sd: float, most: int = 1000) -> int:
    """Seeds a side needs before the test tells a change `shift` beyond the tolerance from one at
    it (at least 80% power, one-sided 5%), at a seed-to-seed standard deviation `sd` on both
    sides: the smallest n with resolution(sd x sqrt(2/n), n - 1) <= shift (config/README.md's
    table)."""
    for n in range(MIN_SEEDS, most + 1):
        if resolution(sd * (2 / n) ** 0.5, _power_dof(n)) <= shift:
            return n
    return most


def not_compared(metric: str, logged: list[str], baseline: str, baseline_has_it: bool, anyone_has_it: bool) -> str | None:
    """Why accuracy could not be compared at all, or None when it was."""
    if baseline_has_it:
        return None
    names = ", ".join(logged) if logged else "no scalar metric"
    if anyone_has_it:
        return (f"accuracy not compared: {metric} not logged by the baseline {baseline}; the runs logged: "
                f"{names}")
    return f"accuracy not compared: {metric} not logged; the runs logged: {names}"


def _tests(summary: pd.DataFrame) -> pd.Series:
    return summary.get("accuracy_test", pd.Series("", index=summary.index, dtype=object)).astype(str)


def untested(summary: pd.DataFrame) -> pd.Series:
    """Rows whose metric is known but whose seeds were too few for a test."""
    return _tests(summary).str.endswith(": not tested")


def inconclusive(summary: pd.DataFrame) -> pd.Series:
    return _tests(summary).eq(INCONCLUSIVE)


def unlogged(summary: pd.DataFrame) -> pd.Series:
    """Rows whose runs did not log the metric."""
    return _tests(summary).eq(NOT_LOGGED)
