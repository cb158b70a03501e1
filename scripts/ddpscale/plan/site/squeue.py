"""SLURM's queue as ddpscale reads it: this user's jobs from squeue, and the training job of a
run still queued or running. The workflow asks while it parses (a second job of one run would
train into the first one's checkpoint) and `make status` shows the same jobs.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass, replace

# squeue's fields: job id, state, reason, comment, working directory, elapsed
SQUEUE_FORMAT = "%i|%T|%r|%k|%Z|%M"
QUEUED_STATES = {"PENDING"}
RUNNING_STATES = {"RUNNING", "COMPLETING", "CONFIGURING"}
# snakemake-executor-plugin-slurm comments each job rule_<rule>_wildcards_<topology>_<repeat>;
# the rule may be any stage's (train_baseline, train_single_node, train_multi_node), so only the
# suffix counts.
_COMMENT = re.compile(r"_wildcards_(\d+x\d+)_(\d+)$")


@dataclass(frozen=True)
class Job:
    id: str
    state: str
    reason: str
    comment: str
    workdir: str
    elapsed_s: float | None


def parse_elapsed(text: str) -> float | None:
    """squeue's %M ("5", "3:04", "2:03:04", "1-02:03:04") in seconds; None for INVALID and the like."""
    match = re.fullmatch(r"(?:(\d+)-)?(?:(\d+):)?(?:(\d+):)?(\d+)", text.strip())
    if not match:
        return None
    days, a, b, seconds = match.groups()
    hours, minutes = (a, b) if b is not None else (None, a)
    return int(days or 0) * 86400 + int(hours or 0) * 3600 + int(minutes or 0) * 60 + int(seconds)


def parse_squeue(text: str) -> list[Job]:
    """squeue -h -o SQUEUE_FORMAT's lines as jobs (the comment is the one free-text field)."""
    jobs = []
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) < 6:
            continue
        comment = "|".join(parts[3:-2])
        jobs.append(Job(parts[0], parts[1], parts[2], comment, parts[-2], parse_elapsed(parts[-1])))
    return jobs


def job_run(comment: str) -> tuple[str, int] | None:
    """(topology, repeat) of a training job by the plugin's comment; None for other jobs."""
    match = _COMMENT.search(comment.strip())
    return (match.group(1), int(match.group(2))) if match else None


def active_jobs(jobs: list[Job], workdir: str) -> dict[tuple[str, int], Job]:
    """Queued or running training jobs of this directory, by run. Ended jobs (COMPLETED,
    FAILED, TIMEOUT, CANCELLED) are older news: the files decide those runs. A running job wins
    over a queued one (a retry waiting while the job it replaces ends)."""
    found: dict[tuple[str, int], Job] = {}
    for job in jobs:
        run = job_run(job.comment)
        if run is None or job.workdir != workdir or job.state not in QUEUED_STATES | RUNNING_STATES:
            continue
        if run not in found or (job.state in RUNNING_STATES and found[run].state not in RUNNING_STATES):
            found[run] = job
    return found


def query_squeue() -> tuple[list[Job] | None, str]:
    """This user's jobs, or None and why there is no cluster to ask (a laptop has no squeue)."""
    try:
        done = subprocess.run(["squeue", "-h", "--me", "-o", SQUEUE_FORMAT],
                              capture_output=True, text=True, timeout=20)
    except FileNotFoundError:
        return None, "no squeue here"
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"squeue did not answer ({exc})"
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        return None, f"squeue failed ({lines[-1].strip() if lines else f'exit {done.returncode}'})"
    # %Z is the directory sbatch was given; compared with this one resolved, links and all
    return [replace(job, workdir=os.path.realpath(job.workdir)) for job in parse_squeue(done.stdout)], "squeue"


def live_training_job(jobs: list[Job], workdir: str, topology: str, repeat: int) -> str | None:
    """The line that stops a second job of one run: a job submitted by an earlier snakemake (whose
    SSH session dropped, say) still queued or running for (topology, repeat) of this directory,
    training into the checkpoint a new job would train into too. None: no such job."""
    job = active_jobs(jobs, workdir).get((topology, repeat))
    if job is None:
        return None
    return (f"SLURM job {job.id} ({job.state}), submitted by an earlier snakemake, still trains {topology} "
            f"repeat {repeat} of this directory; a second job would train into the same checkpoint. Wait "
            f"for it to end (make status) or scancel {job.id}, then run snakemake again")
