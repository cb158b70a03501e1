"""Cells of the report's tables that say more than a number: a median with its spread over
repeats, a throughput with its interval within the run, whether accuracy held.

Text is escaped by the template; markup is built with Markup(...).format(...), which escapes
its arguments (see html_tables).
"""
from __future__ import annotations

import pandas as pd
from markupsafe import Markup, escape

from ddpscale.core import steadystate
from ddpscale.report import accuracy

# Why a throughput run stopped when its interval met the precision asked for: not shown.
PRECISION_REACHED = steadystate.PRECISION


def num(value, places: int) -> str:
    return "n/a" if value is None or pd.isna(value) else f"{value:,.{places}f}"


def pct(value, places: int = 0) -> str:
    return "n/a" if value is None or pd.isna(value) else f"{value:.{places}%}"


def with_spread(row, col: str, places: int) -> Markup:
    """Median, then its spread over repeats."""
    return escape(num(row[col], places)) + spread(row, col, places)


def spread(row, col: str, places: int, between: str = "") -> Markup:
    """[min-max] and the 95% interval of the mean when there are enough repeats; `between`
    names what the spread between repeats is (in throughput mode: placement noise)."""
    text = Markup("")
    if row.get("repeats", 0) and row["repeats"] > 1:
        text += Markup('<br><span class="spread">{}{}&ndash;{}</span>').format(
            between, num(row[col + "_min"], places), num(row[col + "_max"], places))
        if pd.notna(row.get(col + "_ci_low")):
            # the figure above is a median; this interval is of the mean, and says so
            text += Markup('<br><span class="spread">mean&rsquo;s 95% CI {}&ndash;{}</span>').format(
                num(row[col + "_ci_low"], places), num(row[col + "_ci_high"], places))
    return text


def within_run(row) -> str:
    """'±1.2% within run', or where the precision was not reached, why: 'step cap reached: ±4.1%'.
    The interval is of each run's mean window throughput (the cell's figure is the median over
    repeats), which throughput_note says."""
    half, mean = row.get("throughput_half_width"), row.get("throughput_samples_s")
    interval = (f"\u00b1{half / mean:.1%}" if half is not None and pd.notna(half) and mean
                else "interval n/a (under 2 steady windows)")
    reason = row.get("stop_reason")
    if isinstance(reason, str) and reason and reason != PRECISION_REACHED:
        return f"{reason}: {interval}"
    return f"{interval} within run"


def throughput_cell(row, throughput_mode: bool) -> Markup:
    """Full mode: the median and its spread. Throughput mode: also the 95% interval within the
    run (or why it stopped short of the precision), and the spread labelled placement noise."""
    if not throughput_mode:
        return with_spread(row, "throughput_samples_s", 0)
    if pd.isna(row.get("throughput_samples_s")):
        return escape("n/a")
    reason = row.get("stop_reason")
    short = isinstance(reason, str) and reason not in ("", PRECISION_REACHED)
    return (escape(num(row["throughput_samples_s"], 0))
            + Markup('<br><span class="{}">{}</span>').format("caveat" if short else "spread", within_run(row))
            + spread(row, "throughput_samples_s", 0, "placement noise "))


def held(row, tolerance: float, way: str, throughput_mode: bool = False) -> Markup | str:
    value, test = row.get("accuracy_held"), row.get("accuracy_test")
    if row.get("status") != "ok" and pd.isna(row.get("throughput_samples_s")):
        return ""
    if throughput_mode:
        return Markup('<span class="na">{}</span>').format(accuracy.THROUGHPUT_MODE)
    change = "drop" if way == "max" else "rise"
    bound = row.get("accuracy_bound")
    if test == accuracy.REFERENCE:
        return Markup('<span class="na">baseline</span>')
    if value is None or pd.isna(value):
        if test == accuracy.INCONCLUSIVE:
            return Markup('<span class="caveat">inconclusive (a {} of up to {} &gt; {})</span>').format(
                change, f"{bound:.3g}", f"{tolerance:g}")
        if isinstance(test, str) and test.endswith(": not tested"):
            return Markup('<span class="na">{}</span>').format(test)
        return Markup('<span class="na">not logged</span>')
    if bool(value):
        return Markup('<span class="held">&#10003; held (a {} of at most {} &le; {})</span>').format(
            change, f"{max(bound, 0.0):.3g}", f"{tolerance:g}")
    return Markup('<span class="failed">&#10007; not held (a {} of at least {} &gt; {})</span>').format(
        change, f"{bound:.3g}", f"{tolerance:g}")


def throughput_note() -> Markup:
    """The scaling table's note in throughput mode: which spread is which, and what is n/a."""
    return Markup("Median over repeats. Throughput mode: each run timed windows of training steps and "
                  "stopped once its throughput was known, so no whole epoch was timed (time per steady epoch "
                  "n/a; the full training is projected in its own table) and accuracy is not compared. Below "
                  "each throughput: <i>within run</i>, the 95% interval of the mean window throughput (in "
                  "yellow, with why, where the run stopped at a cap before reaching the precision asked for); "
                  "then <i>placement noise</i>, the spread between repeats, each a separate allocation "
                  "(min&ndash;max and, with 3 or more repeats, the 95% interval of the mean). Fit time is what "
                  "each run trained before it stopped. Grey rows did not finish.")
