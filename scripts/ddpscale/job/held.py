"""How long a run held its devices: the cost a scheduler bills, not only the epochs.

From as early as the training process can know to the moment rank 0 writes the record:
- start: under SLURM, the job's start (SLURM_JOB_START_TIME, set by Slurm 23.02 and later; an
  older Slurm, such as Debian 12's 22.05, sets none, and `scontrol show job` gives its StartTime),
  so what ran in the job before train.py (the environment's set-up, Snakemake's own start,
  torch's import) counts; else the process's start as the kernel recorded it (psutil), which
  already includes the interpreter's start and every import.
- end: after the test pass and the transport gather, just before metrics.json is written.
In between: process-group set-up, the probe, data set-up, every epoch, checkpoint writes, the
test pass. Queue time is not held and is not counted.

A resumed run adds what its earlier attempts held up to their last checkpoint (kept in the
checkpoint with the epoch times): an attempt killed without a checkpoint loses the time since
its last one, so over attempts this is a lower bound.
"""

from __future__ import annotations

import subprocess
import time
from datetime import datetime

JOB_START = "SLURM_JOB_START_TIME"
FROM_JOB = "slurm job start"
FROM_PROCESS = "process start"


def process_start() -> float:
    """This process's start (Unix seconds), or now where psutil cannot read it."""
    try:
        import psutil  # installed with Snakemake

        return float(psutil.Process().create_time())
    except Exception:  # noqa: BLE001 - an unreadable start only makes the figure smaller
        return time.time()


def start_time(scontrol_text: str) -> float | None:
    """StartTime of `scontrol show job -o` (the controller's local time, as this node's clock
    reads it: a site keeps them in one zone) in Unix seconds; None if absent or unknown."""
    for item in scontrol_text.split():
        if item.startswith("StartTime="):
            try:
                return datetime.strptime(item.split("=", 1)[1], "%Y-%m-%dT%H:%M:%S").timestamp()
            except ValueError:
                return None  # "Unknown", or a format of another Slurm
    return None


def scontrol_start(job_id: str | None) -> float | None:
    """This job's start from the controller; None where scontrol is missing or does not answer."""
    if not job_id:
        return None
    try:
        done = subprocess.run(["scontrol", "show", "job", "-o", str(job_id)], capture_output=True,
                              text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return start_time(done.stdout) if done.returncode == 0 else None


def started(environ, process_started: float, on_slurm: bool, ask=scontrol_start) -> tuple[float, str]:
    """(start, what it is): the SLURM job's start where this run's job is a SLURM job (from the
    environment, else asked of scontrol), else the process's. A job start after the process's
    (clocks of controller and node apart) is not believed: the process cannot have started
    before its job."""
    if on_slurm:
        try:
            job = float(environ[JOB_START])
        except (KeyError, ValueError):
            job = ask(environ.get("SLURM_JOB_ID"))
        if job is not None and 0 < job <= process_started:
            return job, FROM_JOB
    return process_started, FROM_PROCESS


def held_s(earlier_s: float, since: float, now: float) -> float:
    """Seconds held over all attempts: the earlier attempts' plus this one's so far."""
    return float(earlier_s) + max(0.0, now - since)
