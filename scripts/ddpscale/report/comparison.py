"""What a report compares its runs against, and how: the baseline topology, the accuracy metric
with its tolerance and which way is better, why accuracy is not compared where it is not, and
how the throughput was measured. Decided once from the runs and the config (analysis.compare)
and handed to every function that filters or words by it. Pure: no torch.
"""
from __future__ import annotations

from dataclasses import dataclass

from ddpscale.run.measuremode import THROUGHPUT


@dataclass(frozen=True)
class Comparison:
    baseline: str  # the topology every speedup is over (config baseline)
    metric: str  # the accuracy metric compared with the baseline's (config accuracy.metric)
    tolerance: float  # how far the metric may move the wrong way and still hold (config accuracy.tolerance)
    direction: str  # "max": higher is better, "min": lower (report.accuracy.direction)
    measure: str  # how the runs measured their throughput: "full" or "throughput" (spec.measuremode)
    not_compared: str | None  # why accuracy is not compared at all (report.accuracy.not_compared); None where it is

    @property
    def throughput_mode(self) -> bool:
        return self.measure == THROUGHPUT

    @property
    def compared(self) -> bool:
        """Whether the baseline logged the accuracy metric, so held or not means something."""
        return self.not_compared is None

    def why_not_compared(self) -> str:
        """The short reason, in brackets after "accuracy not compared"."""
        return "throughput mode" if self.throughput_mode else f"{self.metric} not logged"
