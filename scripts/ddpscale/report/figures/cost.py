"""What each topology costs: device-seconds per sample, the extra over the baseline, and each
run's training and held device-hours. Pure pandas, unit-tested without a cluster."""
from __future__ import annotations

import pandas as pd

from ddpscale.report.fmt import topology_names


def cost_table(summary: pd.DataFrame, baseline: str) -> pd.DataFrame:
    """Per sample, not per run: under weak scaling with fixed steps per epoch (the Markov token
    data) 8 devices train 8x the samples of one in about the same time. Device-seconds per
    sample = devices / steady throughput, so the extra over the baseline is 1 / efficiency - 1
    (zero at perfect efficiency); in hours, for the samples the baseline trained. gpu_hours
    (epochs) and held_gpu_hours (the whole hold) are each run's own, as measured."""
    finished, base = _finished(summary, baseline)
    per_sample = finished["gpu_seconds_per_sample"]
    base_per_sample = float(base["gpu_seconds_per_sample"].iloc[0]) if len(base) else float("nan")
    base_samples = _base_samples(base)
    out = pd.DataFrame({
        "topology": finished["topology"], "world_size": finished["world_size"],
        "speedup": finished["speedup"],
        # its interval, so the table writes it to the digits it supports, as every table does
        "speedup_low": finished["speedup_low"], "speedup_high": finished["speedup_high"],
        "gpu_seconds_per_sample": per_sample,
        "extra_pct": (1.0 / finished["efficiency"] - 1.0) * 100.0,
        "extra_gpu_hours": (per_sample - base_per_sample) * base_samples / 3600.0,
        "time_speedup": finished["time_speedup"],
        "gpu_hours": finished["gpu_hours"],
        "held_gpu_hours": finished["held_gpu_hours"],
    })
    return out.reset_index(drop=True)


def _finished(summary: pd.DataFrame, baseline: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the rows that finished, the baseline's among them)"""
    finished = summary[summary["fit_time_s"].notna()]
    return finished, finished[finished["topology"] == baseline]


def _base_samples(base: pd.DataFrame) -> float:
    return float(base["samples_trained"].iloc[0]) if len(base) else float("nan")


def time_speedup_note(summary: pd.DataFrame, baseline: str) -> str | None:
    """Why the cost table's time speedup is blank where it is, or None where it is not."""
    finished, base = _finished(summary, baseline)
    base_samples = _base_samples(base)
    blank = finished[finished["time_speedup"].isna()]
    if blank.empty:
        return None
    if pd.isna(base_samples) or blank["samples_trained"].isna().any():
        return "Time speedup is blank where a run could not count the samples it trained (its row says why)."
    trained = ", ".join(f"{r['topology']}: {r['samples_trained']:,.0f}" for _, r in blank.iterrows())
    return (f"Time speedup is blank for {topology_names(blank)}: the samples trained ({trained}) differ from the "
            f"baseline's {base_samples:,.0f}, so the fit times measure different work; compare the cost per "
            "sample instead.")
