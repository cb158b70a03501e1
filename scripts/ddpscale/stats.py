"""Small statistics shared by the measurement (throughput mode's stopping rule) and the report
(spread over repeats): pure Python, no scipy in the stack."""

from __future__ import annotations

import math

# Two-sided 95% quantiles of Student's t by degrees of freedom.
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262,
         10: 2.228, 12: 2.179, 15: 2.131, 20: 2.086, 25: 2.060, 30: 2.042, 60: 2.000}


def t975(dof: int) -> float:
    """Student's t 97.5% quantile, rounded down to the nearest tabulated dof (conservative)."""
    below = [d for d in _T975 if d <= dof]
    return _T975[max(below)] if below else float("nan")


def mean_interval(values: list[float]) -> tuple[float, float]:
    """(mean, half-width of its 95% interval); the half-width is NaN below 2 values."""
    n = len(values)
    if n == 0:
        return float("nan"), float("nan")
    mean = sum(values) / n
    if n < 2:
        return mean, float("nan")
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, t975(n - 1) * math.sqrt(var / n)
