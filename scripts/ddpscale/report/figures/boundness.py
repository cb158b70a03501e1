"""Whether a workload is overhead-bound, from measured numbers only (pure; no torch).

An overhead-bound step spends most of its time outside the device's arithmetic (Python,
Lightning's loop, kernel launches, data wait). Those costs do not shrink when devices are
added, so its speedup and efficiency describe the framework, not the GPUs.
"""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

# Compute (forward + backward + optimizer, timed by the probe) under half of the baseline's step:
# the rest (data wait, exposed communication, framework overhead) then outweighs the work that
# more devices divide, so scaling mostly measures that rest. Half is where compute stops being
# the larger part of the step.
COMPUTE_SHARE_MIN = 0.5
# NVML's utilisation is the share of its sample period in which any kernel ran, read only in the
# training phase of steady epochs (ddpscale.job.device.gpu). Below half, the GPU waited for
# the host (Python, launches, the data loader) longer than it computed.
GPU_UTILIZATION_MIN_PCT = 50.0

TRANSFORMER_CONFIG = "config/transformer.yaml"
# A model class whose name says it is the transformer already: pointing to it would be no help.
_TRANSFORMER_WORDS = ("transformer", "gpt", "decoder")


@dataclass(frozen=True)
class Boundness:
    """The baseline's figures and the judgement; None where a figure was not measured."""
    compute_share: float | None = None  # compute / step on the baseline (probe + training run)
    gpu_utilization_pct: float | None = None  # mean steady-training utilisation, baseline runs

    @property
    def low_compute(self) -> bool:
        return self.compute_share is not None and self.compute_share < COMPUTE_SHARE_MIN

    @property
    def low_utilization(self) -> bool:
        return (self.gpu_utilization_pct is not None
                and self.gpu_utilization_pct < GPU_UTILIZATION_MIN_PCT)

    @property
    def overhead_bound(self) -> bool | None:
        """True if either measured figure is below its threshold, None if neither is known."""
        if self.compute_share is None and self.gpu_utilization_pct is None:
            return None
        return self.low_compute or self.low_utilization


def _number(value) -> float | None:
    value = pd.to_numeric(value, errors="coerce")
    return None if pd.isna(value) else float(value)


def judge_baseline(runs: pd.DataFrame, steps: pd.DataFrame, baseline: str) -> Boundness:
    """The baseline's compute share (from breakdown.breakdown) and GPU utilisation (GPU runs)."""
    share = None
    if steps is not None and len(steps) and "compute_frac" in steps:
        rows = steps[steps["topology"] == baseline]
        share = _number(rows["compute_frac"].iloc[0]) if len(rows) else None
    util = None
    base = runs[(runs["topology"] == baseline) & ~runs["simulated"].astype(bool) & runs["device_kind"].eq("cuda")]
    values = pd.to_numeric(base["gpu_utilization_pct"], errors="coerce").dropna()
    util = float(values.mean()) if len(values) else None
    return Boundness(compute_share=share, gpu_utilization_pct=util)


def sentence(bound: Boundness, devices: str = "GPUs", model_classes=None) -> str | None:
    """The verdict's words when the workload is overhead-bound; None otherwise or not known."""
    if not bound.overhead_bound:
        return None
    figures = []
    if bound.low_compute:
        figures.append(f"compute is {bound.compute_share:.0%} of the baseline's step")
    if bound.low_utilization:
        figures.append(f"GPU utilisation {bound.gpu_utilization_pct:.0f}% in steady training")
    text = (f"This workload is overhead-bound ({'; '.join(figures)}), so its scaling measures "
            f"framework and launch overhead, not the {devices}. ")
    names = " ".join(str(m).lower() for m in (model_classes if model_classes is not None else []))
    if any(word in names for word in _TRANSFORMER_WORDS):
        return text + ("Raise the batch per device or the model size until compute is most of "
                       "the step.")
    return text + ("For a compute-bound workload, run the transformer (a GPT-2-small-like "
                   f"decoder): add --configfile {TRANSFORMER_CONFIG} to the snakemake command.")
