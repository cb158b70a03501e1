"""How the report writes a figure: one owner, so a number reads the same in the answer, the
decision table, every detail table and the TSV-free prose (0.4x above a table saying 0.39x, or
0.00056 device-hours beside 3.3 s, made readers doubt both).

Pure functions of a value (a few of a table's row or rows); each returns "n/a" for a missing one
(None or NaN).
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


# --- a figure with its 95% interval, written to the digits the interval supports ---
# A speedup measured to ±2.6 has no second decimal: every figure with an interval is rounded to
# two significant digits of its interval's half-width (never to more places than it has without
# one), its bounds outward to the same place, the same way in every table, summary and TSV.

def places(low, high, default: int) -> int:
    """Decimal places (negative: tens, hundreds) that a figure with this interval supports: those
    of two significant digits of the half-width, at most `default`; `default` without an interval."""
    if not (known(low) and known(high)) or not high > low or math.isinf(high):
        return default
    return min(default, 1 - math.floor(math.log10((high - low) / 2)))


def supported(value, low, high, default: int) -> tuple[float, float, float, int]:
    """(value, low, high, places): the figure rounded to the places its interval supports, the
    bounds rounded outward to the same place (NaN stays NaN)."""
    p = places(low, high, default)
    step = 10.0 ** -p

    def out(v, way, places=p):
        if not known(v):
            return math.nan
        grid = 10.0 ** -places
        # a hair of slack so a bound already on the grid is not moved a step by binary noise
        shown = round(way(v / grid - math.copysign(1e-9, 1 if way is math.ceil else -1)) * grid, max(places, 0))
        if way is math.floor and v > 0 >= shown:  # a positive bound stays positive: its own two digits
            return out(v, way, 1 - math.floor(math.log10(v)))
        return shown

    # half up, not Python's half to even: 85 and 95 both move up to the tens
    shown = round(math.floor(value / step + 0.5) * step, max(p, 0)) if known(value) else math.nan
    return shown, out(low, math.floor), out(high, math.ceil), p


def _plain(value, p: int) -> str:
    return f"{value:,.{max(p, 0)}f}"


def _written(shown: tuple[float, float, float, int], unit: str = "", bound_unit: str = "",
             bounds: bool = True) -> str:
    """'1.9x (0.6–5.9)' from supported()'s figures: the value and unit, then the bounds (each in
    the same places, bound_unit after the second) where there are any."""
    v, lo, hi, p = shown
    text = _plain(v, p) + unit
    if bounds and known(lo) and known(hi):
        text += f" ({_plain(lo, p)}\u2013{_plain(hi, p)}{bound_unit})"
    return text


def estimate(value, low, high, default: int, unit: str = "", scale: float = 1.0, bounds: bool = True) -> str:
    """'1.9x (0.6–5.8)', '95% (31–290%)', '484 (100–2,400)': the figure and its 95% interval in
    the digits it supports (scale: 100 for a share shown in percent; bounds=False: the figure
    alone, in those digits); the figure alone where there is no interval; 'n/a' for no figure."""
    if not known(value):
        return NA
    shown = supported(value * scale, low * scale if known(low) else low, high * scale if known(high) else high,
                      default)
    # '95% (31–290%)', but '1.9x (0.6–5.9)'
    return _written(shown, unit, unit if unit == "%" else "", bounds)


def _unit(seconds) -> tuple[float, str, int]:
    """(divisor, unit, places) duration() writes a time of this size in."""
    if seconds < 10:
        return 1.0, " s", 1
    if seconds < 120:
        return 1.0, " s", 0
    if seconds < 7200:
        return 60.0, " min", 0
    return 3600.0, " h", 1


def duration_estimate(seconds, low, high) -> str:
    """'3.1 h (2.8–3.5 h)': a projected time and its interval in the unit of its size, in the
    digits the interval supports."""
    if not known(seconds):
        return NA
    div, unit, default = _unit(seconds)
    scaled = [v / div if known(v) else math.nan for v in (low, high)]
    return _written(supported(seconds / div, *scaled, default), unit, unit)


def hours_estimate(value, low, high) -> str:
    """'25 (22–28)': device-hours with their interval, at two significant digits where the interval
    is narrower (hours())."""
    if not known(value) or value <= 0:
        return hours(value)
    return _written(supported(value, low, high, 1 - math.floor(math.log10(abs(value)))))


def topology_names(rows: pd.DataFrame) -> str:
    names = [str(t) for t in rows["topology"]]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
