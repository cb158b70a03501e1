"""What a run measures (config `measure`), resolved once where the workflow is parsed.

throughput: each topology trains until its steady-state throughput is known to a stated
precision, then stops (ddpscale.core.steadystate); full: the configured epochs, with
the accuracy comparison and time to accuracy. auto picks by place: on a cluster the scaling
question is a throughput question and every GPU-hour is paid for, while the local profile's
runs take seconds and keep showing accuracy. Except where throughput mode cannot win for the
configured training (ddpscale.plan.cost.throughputfit: its runs could not reach their precision, or
would cost more than training in full): there auto trains in full on a cluster too. Pure: the
workflow, the dry run's cost and the tests share it.
"""

from __future__ import annotations

THROUGHPUT = "throughput"
FULL = "full"


def resolve(measure: str, site_is_local: bool, cannot_win: str | None = None) -> tuple[str, str]:
    """(mode, why) for config `measure` on this site; cannot_win: why throughput mode cannot win
    for the configured training (None: it can, or that is unknown)."""
    if measure == "auto":
        if site_is_local:
            return FULL, "measure: auto on the local profile (set measure: throughput to stop each run once measured)"
        if cannot_win:
            return FULL, (f"measure: auto on a cluster profile, where {cannot_win}: full training costs no more "
                          "and compares accuracy (next line)")
        return THROUGHPUT, ("measure: auto on a cluster profile (set measure: full for the configured epochs, "
                            "accuracy and time to accuracy)")
    if measure not in (THROUGHPUT, FULL):
        raise ValueError(f"measure is {measure!r}; expected auto, throughput or full")
    return measure, f"measure: {measure} in the config"


def epoch_metric(metric: str, setting: str = "auto") -> str:
    """The metric logged at every validation for time to accuracy: the setting, or with auto
    the accuracy metric with a leading 'test' replaced by 'val' (test_acc -> val_acc,
    test/loss -> val/loss), since the test metric is logged once, after training."""
    if setting != "auto":
        return setting
    return "val" + metric[len("test"):] if metric.startswith("test") else metric


THROUGHPUT_REPEATS = 3
# the config schema's bound on repeats (seed + r stays within the seeds Lightning accepts), also
# what make status accepts from plan.json
MAX_REPEATS = 1000


def valid_repeats(value) -> bool:
    """A number of repeats a run can have: a whole number (not true/false) from 1 to MAX_REPEATS."""
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_REPEATS


def repeats(setting: int | str, mode: str) -> int:
    """config repeats: a number, or auto: 3 in throughput mode, where a run costs minutes and
    the spread between allocations (placement noise) is worth showing, 1 in full mode."""
    if setting == "auto":
        return THROUGHPUT_REPEATS if mode == THROUGHPUT else 1
    return int(setting)
