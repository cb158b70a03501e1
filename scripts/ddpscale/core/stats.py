"""Small statistics shared by the measurement (throughput mode's stopping rule) and the report
(spread over repeats): pure Python, no scipy in the stack."""

from __future__ import annotations

import math

# Two-sided 95% quantiles of Student's t by degrees of freedom.
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262,
         10: 2.228, 12: 2.179, 15: 2.131, 20: 2.086, 25: 2.060, 30: 2.042, 60: 2.000}
# One-sided 95% quantiles of Student's t by degrees of freedom (a non-inferiority bound).
_T95 = {1: 6.314, 2: 2.920, 3: 2.353, 4: 2.132, 5: 2.015, 6: 1.943, 7: 1.895, 8: 1.860, 9: 1.833,
        10: 1.812, 12: 1.782, 15: 1.753, 20: 1.725, 25: 1.708, 30: 1.697, 60: 1.671}
# One-sided 80% quantiles of Student's t (the power of a one-sided test: 1 - beta = 0.8).
_T80 = {1: 1.376, 2: 1.061, 3: 0.978, 4: 0.941, 5: 0.920, 6: 0.906, 7: 0.896, 8: 0.889, 9: 0.883,
        10: 0.879, 12: 0.873, 15: 0.866, 20: 0.860, 25: 0.856, 30: 0.854, 60: 0.848}
# One-sided 95% normal quantile: the upper bound of an autocorrelation estimate.
Z95 = 1.645
# The largest lag-1 autocorrelation believed: beyond it (1+phi)/(1-phi) explodes on noise.
PHI_MAX = 0.95


def _quantile(table: dict[int, float], dof: float) -> float:
    below = [d for d in table if d <= dof]
    return table[max(below)] if below else float("nan")


def t975(dof: float) -> float:
    """Student's t 97.5% quantile, rounded down to the nearest tabulated dof (conservative)."""
    return _quantile(_T975, dof)


def t95(dof: float) -> float:
    """Student's t 95% quantile (one-sided), rounded down to the nearest tabulated dof."""
    return _quantile(_T95, dof)


def t80(dof: float) -> float:
    """Student's t 80% quantile (one-sided), rounded down to the nearest tabulated dof."""
    return _quantile(_T80, dof)


def resolution(se: float, dof: float) -> float:
    """The smallest shift of a mean difference that a one-sided 95% t-test with this standard
    error finds 4 times in 5 (80% power): (t95 + t80) x se, the usual sample-size formula with
    t quantiles in place of normal ones."""
    return (t95(dof) + t80(dof)) * se


def welch(a: list[float], b: list[float]) -> tuple[float, float, float]:
    """(mean(a) - mean(b), its standard error, Welch-Satterthwaite degrees of freedom): the two
    groups' variances may differ. NaN error below 2 values a group; dof NaN where the error is 0."""
    diff = sum(a) / len(a) - sum(b) / len(b)
    if len(a) < 2 or len(b) < 2:
        return diff, float("nan"), float("nan")
    va, vb = _variance(a) / len(a), _variance(b) / len(b)
    se = math.sqrt(va + vb)
    if se == 0:
        return diff, 0.0, float("nan")
    return diff, se, (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))


def difference_bounds(a: list[float], b: list[float]) -> tuple[float, float, float]:
    """(mean(a) - mean(b), its one-sided 95% lower bound, its one-sided 95% upper bound), by
    Welch's t (welch); NaN bounds below 2 values a group."""
    diff, se, dof = welch(a, b)
    if se != se:
        return diff, float("nan"), float("nan")
    if se == 0:
        return diff, diff, diff
    margin = t95(dof) * se
    return diff, diff - margin, diff + margin


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def mean_interval(values: list[float]) -> tuple[float, float]:
    """(mean, half-width of its 95% interval); the half-width is NaN below 2 values."""
    n, mean = len(values), _mean(values)
    if n < 2:
        return mean, float("nan")
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, t975(n - 1) * math.sqrt(var / n)


def _variance(values: list[float]) -> float:
    mean = sum(values) / len(values)
    return sum((v - mean) ** 2 for v in values) / (len(values) - 1)


def lag1(values: list[float]) -> float:
    """The lag-1 autocorrelation of a series (0 for a constant one)."""
    n = len(values)
    mean = sum(values) / n
    den = sum((v - mean) ** 2 for v in values)
    if den <= 0:
        return 0.0
    return sum((values[i] - mean) * (values[i + 1] - mean) for i in range(n - 1)) / den


def ar1_inflation(values: list[float]) -> float:
    """How much more a mean of these values varies than a mean of as many independent ones, at
    most, were they an AR(1) series: (1+phi)/(1-phi), phi the lag-1 autocorrelation corrected for
    its downward bias in short series (Marriott and Pope 1954: -(1+3 phi)/n) and taken at its
    one-sided 95% upper bound, so a short series that happens to look uncorrelated is not
    believed to be."""
    n = len(values)
    phi = lag1(values)
    phi += (1 + 3 * phi) / n
    phi += Z95 * math.sqrt(max(0.0, 1 - phi * phi) / n)
    phi = min(PHI_MAX, max(0.0, phi))
    return (1 + phi) / (1 - phi)


def batch_count(n: int) -> int:
    """Batches of the batch means: one value a batch below 20 values, else sqrt(n) batches, at
    least 10 and at most 30 (so each batch grows with the run, and the t quantile has 9 to 29
    degrees of freedom)."""
    return n if n < 20 else max(10, min(30, math.isqrt(n)))


def mean_interval_correlated(values: list[float]) -> tuple[float, float]:
    """(mean, half-width of its 95% interval) for a series whose values may be autocorrelated,
    as timings in a row are. The variance of the mean is the larger of two estimates: the
    non-overlapping batch means' (batches of consecutive values whose means are nearly
    independent when the batches are long) and the AR(1) one (ar1_inflation), which does not
    need long batches; t with the batches' degrees of freedom. NaN below 2 values."""
    n, mean = len(values), _mean(values)
    if n < 2:
        return mean, float("nan")
    b = batch_count(n)
    k = n // b
    first = n - k * b  # the remainder left out of the batches is the series' oldest values
    means = [sum(values[first + j * k:first + (j + 1) * k]) / k for j in range(b)]
    per_value = max(k * _variance(means), _variance(values) * ar1_inflation(values))
    return mean, t975(b - 1) * math.sqrt(per_value / n)


def trend(values: list[float]) -> tuple[float, float]:
    """(change, its standard error): the least-squares line's rise from the series' first value
    to its last, and the error of that rise from the residuals about the line (AR(1)-inflated as
    above), so a drift does not hide in the noise estimate it would inflate."""
    n = len(values)
    if n < 3:
        return 0.0, float("inf")
    centre = (n - 1) / 2
    mean = sum(values) / n
    sxx = n * (n * n - 1) / 12
    slope = sum((i - centre) * (v - mean) for i, v in enumerate(values)) / sxx
    residuals = [v - mean - slope * (i - centre) for i, v in enumerate(values)]
    per_value = _variance(residuals) * ar1_inflation(residuals)
    return slope * n, math.sqrt(per_value / sxx) * n
