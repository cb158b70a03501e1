"""Said in the verdict where a throughput run stopped at a cap before its interval met the
precision asked for: the figure stands, but with the wider interval it reached."""
from __future__ import annotations

import pandas as pd

from ddpscale.core.steadystate import EPOCHS_ENDED
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
    # the configured epochs ending first is cured by more epochs, a cap by a higher cap
    ended = all(r == EPOCHS_ENDED for r in short["stop_reason"])
    fix = ("raise max_epochs (the configured training ended before the interval closed)" if ended
           else "raise throughput.max_steps or throughput.max_minutes")
    return (f"The throughput of {each} did not reach the {asked} asked for: read it with the interval it "
            f"reached, or {fix} in the config and rerun it.")
