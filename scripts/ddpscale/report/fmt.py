"""How the report writes a figure: one owner, so a number reads the same in the answer, the
decision table, every detail table and the TSV-free prose (0.4x above a table saying 0.39x, or
0.00056 device-hours beside 3.3 s, made readers doubt both).

Pure functions of a value; each returns "n/a" for a missing one (None or NaN).
"""
from __future__ import annotations

import math

import pandas as pd

NA = "n/a"


def known(value) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value)) and not pd.isna(value)


def num(value, places: int) -> str:
    """A plain number with thousands separators: '74,765', '0.8312'."""
    return f"{value:,.{places}f}" if known(value) else NA


def times(speedup) -> str:
    """A speedup: two places, as the verdict, the headline and every table write it."""
    return f"{speedup:.2f}x" if known(speedup) else NA


def pct(value, places: int = 0) -> str:
    """A share as a percentage, whole by default: an efficiency measured to a few percent has no
    meaningful tenths ('84%', not '84.3%')."""
    return f"{value:.{places}%}" if known(value) else NA


def duration(seconds) -> str:
    """A time by its size: '3.2 s', '45 s', '12 min', '3.1 h'."""
    if not known(seconds):
        return NA
    if seconds < 10:  # a CPU check: enough places to compare projected and measured
        return f"{seconds:.1f} s"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def sig(value, digits: int) -> str:
    """`digits` significant digits, never in exponent form: 0.00056, 0.31, 25, 1,200."""
    if not known(value):
        return NA
    if value == 0:
        return "0"
    places = digits - 1 - math.floor(math.log10(abs(value)))
    rounded = round(value, places)
    return f"{rounded:,.{max(0, places)}f}"


def hours(value) -> str:
    """Device-hours to two significant digits (a CPU check takes 0.00056, a model 1,200): the
    projection behind them is no better than a few percent."""
    if known(value) and value <= 0:
        return "0"
    return sig(value, 2)


def plus_minus(share) -> str:
    """An interval's half width as a share of its figure: '±1.2%' (one place: intervals of 1 to 5%
    are what the stopping rule aims at)."""
    return f"\u00b1{share:.1%}" if known(share) else NA


def span(low, high, places: int) -> str:
    """'61,432–78,596'."""
    return f"{num(low, places)}\u2013{num(high, places)}" if known(low) and known(high) else NA
