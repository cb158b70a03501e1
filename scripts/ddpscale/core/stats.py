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
# A period is looked for up to PERIOD_MAX windows long, where at least PERIODS_MIN whole
# periods are seen, and found where its phases differ at z > Z_PERIOD.
PERIOD_MAX = 12
PERIODS_MIN = 3
Z_PERIOD = 3.5
ROUNDING = 1e-20  # relative squared differences below this are a float's rounding, not a pattern
# The fewest degrees of freedom the t quantile of a correlated series' interval takes (t975: 2.776).
DOF_FLOOR = 4


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
    if math.isnan(se):
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


def _phi(values: list[float]) -> float:
    """The lag-1 autocorrelation corrected for its downward bias in short series (Marriott and
    Pope 1954: -(1+3 phi)/n), within [0, PHI_MAX]."""
    phi = lag1(values)
    return min(PHI_MAX, max(0.0, phi + (1 + 3 * phi) / len(values)))


def phi_bound(values: list[float]) -> float:
    """The lag-1 autocorrelation an AR(1) series with these values could have, at most: the
    bias-corrected estimate at its one-sided 95% upper bound, so a short series that happens to
    look uncorrelated is not believed to be; within [0, PHI_MAX]."""
    n, phi = len(values), lag1(values)
    phi += (1 + 3 * phi) / n
    phi += Z95 * math.sqrt(max(0.0, 1 - phi * phi) / n)
    return min(PHI_MAX, max(0.0, phi))


def ar1_inflation(values: list[float]) -> float:
    """How much more a mean of these values varies than a mean of as many independent ones, at
    most, were they an AR(1) series: (1+phi)/(1-phi), phi at phi_bound."""
    phi = phi_bound(values)
    return (1 + phi) / (1 - phi)


def phase_means(values: list[float], k: int) -> list[float]:
    """The mean of each phase i % k over whole periods (len(values) a multiple of k)."""
    sums = [0.0] * k
    for i, v in enumerate(values):
        sums[i % k] += v
    return [s / (len(values) // k) for s in sums]


def _f_z(f: float, d1: int, d2: int) -> float:
    """The standard normal deviate of an F(d1, d2) statistic's upper tail, by Paulson's
    approximation (within a few hundredths of z for d2 >= 3): no F quantiles without scipy."""
    a1, a2, c = 2 / (9 * d1), 2 / (9 * d2), f ** (1 / 3)
    return ((1 - a2) * c - (1 - a1)) / math.sqrt(a2 * c * c + a1)


def period(values: list[float], longest: int = PERIOD_MAX) -> int:
    """The period of a pattern the series repeats (a loader's refill every k windows), 1 where
    none is found. Of k = 2..longest with at least PERIODS_MIN whole periods in the series, the
    one whose phase means differ most significantly, by a one-way analysis of variance over the
    latest whole periods (F on k-1 and m-k degrees of freedom), where z > Z_PERIOD: a strict
    level, as a dozen periods are tried, and a false find costs only k-1 degrees of freedom.
    Slow wander does not look periodic (neighbouring phases move together, so their means stay
    close), and a multiple of the true period explains no more of the spread with more phases."""
    n, best, best_z = len(values), 1, Z_PERIOD
    for k in range(2, min(longest, n // PERIODS_MIN) + 1):
        whole = values[n % k:]
        m, means = len(whole), phase_means(whole, k)
        grand = sum(means) / k
        between = m // k * sum((mu - grand) ** 2 for mu in means)
        within = sum((v - means[i % k]) ** 2 for i, v in enumerate(whole))
        if between <= ROUNDING * grand * grand * m:  # phases equal but for rounding
            continue
        z = math.inf if within <= 0 else _f_z(between / (k - 1) / (within / (m - k)), k - 1, m - k)
        if z > best_z:
            best, best_z = k, z
    return best


def mean_interval_correlated(values: list[float], k: int = 1) -> tuple[float, float]:
    """(mean, half-width of its 95% interval) for a series whose values may be autocorrelated,
    as timings in a row are, and may repeat a pattern of period k: the mean is over the latest
    whole periods, and the pattern, which cancels in it, is no noise of it.

    The variance of the mean is (1+phi)/(1-phi) times that of a mean of independent values
    (AR(1)), phi at phi_bound of the series less its phase means, the values' variance from
    their squares about the phase means (m-k degrees of freedom). Student's t takes the
    degrees of freedom of that variance, m (1-r^2)/(1+r^2) - k for the bias-corrected lag-1
    autocorrelation r (an AR(1) series' variance is known as well as that many independent
    values' would be), at least DOF_FLOOR: below it t grows without bound while the
    estimate of the degrees of freedom is itself noise, and the coverage the rule reaches
    (docs/numbers.md) is measured with the floor. NaN below k+1 values."""
    whole = values[len(values) % k:]
    m = len(whole)
    if m <= k or m < 2:
        return _mean(whole), float("nan")
    mean, means = sum(whole) / m, phase_means(whole, k)
    residuals = [v - means[i % k] for i, v in enumerate(whole)]
    phi, r = phi_bound(residuals), _phi(residuals)
    spread = sum(e * e for e in residuals) / (m - k)
    dof = max(DOF_FLOOR, m * (1 - r * r) / (1 + r * r) - k)
    return mean, t975(dof) * math.sqrt(spread * (1 + phi) / (1 - phi) / m)


def ratio_terms(numerators: list[float], denominators: list[float]) -> list[float]:
    """Each pair's share of the ratio of sums R = sum(numerators) / sum(denominators), linearised
    (the delta method): R + (a_i - R b_i) / mean(b). Their mean is R exactly, and the variance of
    their mean is, to first order, that of R itself: the ratio estimator's error is the error of
    the mean of a_i - R b_i over mean(b) (Cochran, Sampling Techniques, 3rd ed., chapter 6; the
    regenerative method's interval for a ratio of cycle sums, Crane and Iglehart 1975, is the
    same). Where every b_i is equal, each term is a_i / b_i; a pair of small b weighs by its b,
    not as much as any other. NaN terms where the denominators sum to zero or less."""
    total = sum(denominators)
    if not numerators or total <= 0:
        return [float("nan")] * len(numerators)
    ratio, mean_b = sum(numerators) / total, total / len(denominators)
    return [ratio + (a - ratio * b) / mean_b for a, b in zip(numerators, denominators)]


def ratio_interval_correlated(numerators: list[float], denominators: list[float], k: int = 1) -> tuple[float, float]:
    """(sum(numerators) / sum(denominators), half-width of its 95% interval) over the latest whole
    periods of k pairs, for pairs in a row that may be autocorrelated and repeat a pattern of
    period k, as timed windows of training steps are: mean_interval_correlated of the ratio's
    linearised terms (ratio_terms), so the autocorrelation and the pattern are allowed for as
    they are for a plain mean. NaN ratio where the denominators sum to zero or less."""
    drop = len(numerators) % k
    a, b = list(numerators[drop:]), list(denominators[drop:])
    if not a or sum(b) <= 0:
        return float("nan"), float("nan")
    _, half = mean_interval_correlated(ratio_terms(a, b), k)
    return sum(a) / sum(b), half


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
