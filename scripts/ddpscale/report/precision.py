"""Said in the verdict where a throughput run stopped at a cap before its interval met the
precision asked for: the figure stands, but with the wider interval it reached."""
from __future__ import annotations

import pandas as pd

from ddpscale.report.accuracy import throughput_mode
from ddpscale.report.html_cells import PRECISION_REACHED, within_run
from ddpscale.report.records import column
from ddpscale.report.verdict import topology_names


def precision_note(summary: pd.DataFrame, runs: pd.DataFrame) -> str | None:
    if not throughput_mode(summary):
        return None
    reasons = summary["stop_reason"] if "stop_reason" in summary else pd.Series(dtype=object)
    short = summary[[isinstance(r, str) and r not in ("", PRECISION_REACHED) for r in reasons]]
    if short.empty:
        return None
    asked = ", ".join(dict.fromkeys(f"\u00b1{float(p):.0%}" for p in column(runs, "target_precision")
                                    if p is not None and pd.notna(p))) or "the precision"
    each = topology_names(pd.DataFrame({"topology": [f"{r['topology']} ({within_run(r)})"
                                                     for _, r in short.iterrows()]}))
    return (f"The throughput of {each} did not reach the {asked} asked for: read it with the interval it "
            "reached, or raise throughput.max_steps or throughput.max_minutes in the config and rerun it.")
