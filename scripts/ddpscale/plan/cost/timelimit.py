"""Each training stage's SLURM time limit: the profile's runtime in full mode; in throughput mode
what a run needs, its measuring cap plus an allowance for everything else, at most the profile's.

A throughput-mode run stops after minutes (throughput.max_minutes of measuring at most), yet
asked for the stage's full limit (hours): the scheduler can backfill a job into a gap only as
long as its limit, so the short job waited like a long one. The allowance covers what a job
does besides measuring (start-up, imports, the probe, compilation, checkpoints, the validation
after the stop): measured where earlier runs of this experiment recorded it (held_s, the
devices' time from the job's start, minus the windows measured), else a stated default.
A limit that still proves short costs a retry that resumes, not the measurement: the warning
signal saves a checkpoint and the profile's retries resubmit the job.

Pure: the workflow hands over the profile's runtimes and what finished records measured.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ddpscale.core.steadystate import Rule
from ddpscale.run.measuremode import THROUGHPUT
from ddpscale.run.topology import STAGE_RULES

PREFIX = "ddpscale: time limit: "
# With nothing measured yet: a GPU job's start-up (imports, NCCL), the first repeat's probe and a
# torch.compile of a small model take minutes each on the sites' nodes; more than the measuring.
DEFAULT_SETUP_MIN = 15
# What was measured, doubled: the next job may land on a node with a cold file-system cache (the
# first import of torch from a shared file system) or busier neighbours; at least this many minutes.
SETUP_FACTOR = 2
MIN_SETUP_MIN = 5


@dataclass(frozen=True)
class Limit:
    rule: str  # train_<stage>
    minutes: int | None  # the job's time limit; None: the partition's default
    why: str  # where it came from, for the dry run


def setup_seconds(record: dict) -> float | None:
    """What a finished throughput-mode run held its devices for besides measuring (start-up,
    probe, checkpoints, validation, and what a resumed run lost); None where it cannot say (a
    full-mode run measures every epoch, an older record has no held_s)."""
    held, windows = record.get("held_s"), record.get("window_seconds")
    if record.get("measure") != THROUGHPUT or not isinstance(held, (int, float)) or not isinstance(windows, list):
        return None
    return max(0.0, held - sum(windows))


def measured_setups(records: list[dict]) -> dict:
    """{topology: the most set-up seconds (setup_seconds) among its finished records}."""
    found = {}
    for record in records:
        seconds, name = setup_seconds(record), record.get("topology")
        if seconds is not None and isinstance(name, str):
            found[name] = max(seconds, found.get(name, 0.0))
    return found


def stage_limits(mode: str, throughput: Rule, stage_topologies: dict, runtimes: dict,
                 measured: dict) -> list[Limit]:
    """One Limit per stage that has topologies. runtimes: {train_<stage>: the profile's minutes or
    None}; measured: {topology: the most set-up seconds its finished records show}."""
    limits = []
    for stage, names in stage_topologies.items():
        if names:
            rule = STAGE_RULES[stage]
            limits.append(stage_limit(rule, mode, throughput, runtimes.get(rule), measured, names))
    return limits


def stage_limit(rule: str, mode: str, throughput: Rule, profile_min: int | None, measured: dict,
                names: list[str]) -> Limit:
    profile_says = f"the profile's runtime for {rule}"
    if profile_min is None:
        return Limit(rule, None, f"the partition's default: the profile sets no runtime for {rule}")
    if mode != THROUGHPUT:
        return Limit(rule, profile_min, f"measure {mode}: {profile_says}")
    cap = throughput.max_minutes
    if cap is None:
        return Limit(rule, profile_min, f"{profile_says}: throughput.max_minutes is null, so how long a run "
                                        "measures is unknown before it runs")
    setup_min, source = allowance(measured, names)
    sized = math.ceil(cap + setup_min)
    said = f"throughput mode: max_minutes {fmt(cap)} + {fmt(setup_min)} min set-up ({source})"
    if sized >= profile_min:
        return Limit(rule, profile_min, f"{said} = {sized} min, capped at {profile_says}")
    return Limit(rule, sized, f"{said}; {profile_says}, {profile_min} min, is kept for measure: full")


def allowance(measured: dict, names: list[str]) -> tuple[float, str]:
    """(minutes, where they came from) for everything a job does besides measuring: twice the most
    any finished run of the stage's topologies needed, else of any topology of the experiment (a
    stage whose runs have not finished yet), else DEFAULT_SETUP_MIN."""
    own = {name: measured[name] for name in names if name in measured}
    found = own or measured
    if not found:
        return float(DEFAULT_SETUP_MIN), "the default; no finished run of this experiment measured it yet"
    name = max(found, key=found.get)
    most_min = found[name] / 60
    setup = max(float(MIN_SETUP_MIN), SETUP_FACTOR * most_min)
    return setup, f"{SETUP_FACTOR} x {fmt(most_min)} min measured by {name}, at least {MIN_SETUP_MIN}"


def fmt(minutes: float) -> str:
    """10, 2.5, 0.7: whole minutes as integers, others to one decimal."""
    return str(int(minutes)) if float(minutes).is_integer() else f"{minutes:.1f}"


def limit_lines(limits: list[Limit]) -> list[str]:
    """One dry-run line per stage."""
    return [f"{PREFIX}{limit.rule}: {'none' if limit.minutes is None else f'{limit.minutes} min'} ({limit.why})"
            for limit in limits]
