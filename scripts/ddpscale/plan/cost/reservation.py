"""What a benchmark reserves before it is submitted: per training job its devices, time limit
and GPU-hours, and the total (what `snakemake --profile profiles/<site> -n` prints).

A SLURM job holds its GPUs for as long as it runs, at most its time limit, so devices x time
limit is what the benchmark may cost; in throughput mode the caps (throughput.max_minutes)
say what it should cost. Which jobs count is what Snakemake decided once it built its DAG: a
finished run counts again where one of its rerun triggers fires (params, input, code, an input
newer than its record, -R or --forceall), and is named with Snakemake's reason. Pure: the
workflow hands over plain numbers read from the profile and that decision.
"""

from __future__ import annotations

from dataclasses import dataclass

from ddpscale.core.steadystate import Rule
from ddpscale.plan.site.resources import Site
from ddpscale.run.topology import STAGE_RULES, parse_topology

PREFIX = "ddpscale: cost: "


@dataclass(frozen=True)
class Job:
    topology: str
    repeat: int
    rule: str  # train_<stage>: the rule whose resources the profile sets
    devices: int  # GPUs the job holds: its ranks, or whole nodes with site_exclusive
    whole_nodes: bool
    runtime_min: int | None  # the time limit; None: the profile sets none
    finished: bool  # its metrics.json exists
    runs: bool = True  # Snakemake runs it in this invocation (a finished run too, when rerun)
    why: str = ""  # a finished run that runs: Snakemake's reason; an unfinished one that does not: why not


@dataclass(frozen=True)
class Decision:
    """What Snakemake decided for one training job (its DAG): whether it runs, and why a
    finished run runs again or an unfinished one does not."""
    finished: bool
    runs: bool
    why: str = ""


# a run of the plan that is no job of this invocation's DAG, or one Snakemake does not run
NOT_SCHEDULED = "its targets, --until or --omit-from leave it out"


def by_record(finished: bool) -> Decision:
    """The decision before Snakemake has one: a run runs where its metrics.json is missing."""
    return Decision(finished, not finished)


# Snakemake's names of its rerun triggers (jobs.Reason.get_names), as a dry run says them
SNAKEMAKE_REASONS = {
    "forced": "forced on the command line",
    "incomplete output files": "incomplete: an earlier job stopped while writing it",
    "updated input files": "input updated",
    "input files updated by another job": "an input is made again first",
    "set of input files has changed since last execution": "input files changed",
    "code has changed since last execution": "rule code changed",
    "params have changed since last execution": "params changed",
    "software environment definition has changed since last execution": "software environment changed",
}


def rerun_reason(names: list[str], newer: list[str] = ()) -> str:
    """Why Snakemake reruns a finished run, from its reason's names; newer: the inputs newer
    than the run's record whose content changed (scripts/train.py after an edit). Forced
    stands alone: Snakemake checks nothing else of a forced job."""
    if "forced" in names:
        return SNAKEMAKE_REASONS["forced"]
    said = []
    for name in names:
        text = SNAKEMAKE_REASONS.get(name, name)
        if name == "updated input files" and newer:
            text += ": " + ", ".join(sorted(newer))
        said.append(text)
    return "; ".join(said) or "rerun by Snakemake"


def training_jobs(stage_topologies: dict, repeats: list[int], site: Site, runtimes: dict,
                  decide=None) -> list[Job]:
    """One job per topology and repeat, as rules train_<stage> run them; `runtimes` is
    {rule: minutes or None}, `decide(topology, repeat)` a Decision (None: nothing has run yet)."""
    jobs = []
    for stage, names in stage_topologies.items():
        rule = STAGE_RULES[stage]
        for name in names:
            topo = parse_topology(name)
            # --exclusive holds every GPU of each node, used or not: that is what is reserved
            whole, devices = site.whole_nodes, site.held_devices(topo.num_nodes, topo.world_size)
            for repeat in repeats:
                decided = decide(name, repeat) if decide else by_record(False)
                jobs.append(Job(name, repeat, rule, devices, whole, runtimes.get(rule), decided.finished,
                                decided.runs, decided.why))
    return jobs


def job_limits(jobs: list[Job], site: Site) -> dict:
    """{topology: {"limit_s", "signal_s"}}: the time limit each topology's training job runs
    under on a cluster, for the report's projection of a training longer than one job
    (report.py --job-limits); none locally, or where the profile sets no time limit."""
    if site.is_local:
        return {}
    return {j.topology: {"limit_s": j.runtime_min * 60, "signal_s": site.signal_s} for j in jobs if j.runtime_min}


def reserved_hours(job: Job) -> float | None:
    """GPU-hours the job may hold: devices x time limit; None without a time limit."""
    return None if job.runtime_min is None else job.devices * job.runtime_min / 60


def capped_minutes(job: Job, max_minutes: int | None) -> int | None:
    """Minutes of measuring the caps allow: the time cap, or the time limit if it comes first."""
    limits = [m for m in (job.runtime_min, max_minutes) if m is not None]
    return min(limits) if limits else None


def expected_hours(job: Job, max_minutes: int | None) -> float | None:
    """GPU-hours of measuring in throughput mode; None where no time caps it (max_steps alone
    caps steps, whose time is unknown before a run: never guessed)."""
    if max_minutes is None:
        return None
    return job.devices * capped_minutes(job, max_minutes) / 60


def hours(value: float) -> str:
    """4.0, 0.17, 12.5: two decimals at most, one at least."""
    text = f"{value:.2f}".rstrip("0")
    return text + "0" if text.endswith(".") else text


def plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def job_line(job: Job, local: bool, gpus: bool, throughput: Rule | None) -> str:
    """One job: devices, time limit, GPU-hours reserved (and expected, in throughput mode)."""
    head = f"{PREFIX}{job.topology} r{job.repeat} ({job.rule}): "
    if not job.runs:
        if job.finished:
            return head + "finished (its metrics.json exists): Snakemake does not rerun it, not counted"
        return head + f"not run by this invocation ({job.why}), not counted"
    if job.finished:
        head += f"finished, rerun by Snakemake ({job.why}): "
    if local:
        kind = "GPU" if gpus else "CPU-simulated device"
        return head + f"{plural(job.devices, kind)} of this host, no time limit"
    devices = plural(job.devices, "GPU") + (" (whole nodes: site_exclusive)" if job.whole_nodes else "")
    if job.runtime_min is None:
        line = head + f"{devices}, no runtime set: the partition's default time limit applies, GPU-hours unknown"
    else:
        line = head + f"{devices} x {job.runtime_min} min = {hours(reserved_hours(job))} GPU-hours reserved"
    if throughput is not None and (expected := expected_hours(job, throughput.max_minutes)) is not None:
        line += f"; expected {hours(expected)} GPU-hours ({capped_minutes(job, throughput.max_minutes)} min of measuring)"
    return line


def summary_lines(jobs: list[Job], site: Site, accelerator: str, mode: str, throughput: Rule) -> list[str]:
    """The per-job lines and the total, for a dry run's output."""
    local = site.is_local
    gpus = accelerator == "gpu"
    capped = throughput if mode == "throughput" else None
    lines = [job_line(job, local, gpus, capped) for job in jobs]
    todo = [job for job in jobs if job.runs]
    skipped = run_states(jobs)
    if local and not gpus:
        lines.append(f"ddpscale: this benchmark reserves no GPU-hours ({plural(len(todo), 'job')} on this host's "
                     f"CPU, one process per simulated device{skipped})")
        return lines
    if local:
        lines.append(f"ddpscale: this benchmark reserves no GPU-hours: the local profile has no scheduler and no "
                     f"time limit; {plural(len(todo), 'job')} use this host's GPUs for as long as they run{skipped}")
    else:
        timed = [job for job in todo if job.runtime_min is not None]
        total = sum(reserved_hours(job) for job in timed)
        untimed = len(todo) - len(timed)
        unknown = (f"; {plural(untimed, 'job')} with no runtime set, the partition's default time limit: "
                   f"not counted") if untimed else ""
        lines.append(f"ddpscale: this benchmark reserves at most {hours(total)} GPU-hours "
                     f"({plural(len(timed), 'job')}{unknown}{skipped})")
    if capped is not None:
        lines.append(expected_line(todo, throughput))
    return lines


def run_names(jobs: list[Job]) -> str:
    return ", ".join(f"{j.topology}/r{j.repeat}" for j in jobs)


def run_states(jobs: list[Job]) -> str:
    """What the total says beside its jobs: finished runs that run again and why (they are
    counted), finished runs left as they are, runs this invocation does not schedule."""
    said = ""
    rerun = [j for j in jobs if j.runs and j.finished]
    if rerun:
        whys = dict.fromkeys(j.why for j in rerun)
        said += f"; {plural(len(rerun), 'finished run')} rerun: " + ", ".join(
            f"{run_names([j for j in rerun if j.why == why])} ({why})" for why in whys)
    done = [j for j in jobs if not j.runs and j.finished]
    if done:
        said += f"; {plural(len(done), 'finished run')} not counted: {run_names(done)}"
    left = [j for j in jobs if not j.runs and not j.finished]
    if left:
        said += f"; {plural(len(left), 'run')} not in this invocation: {run_names(left)}"
    return said


def expected_line(todo: list[Job], throughput: Rule) -> str:
    """Throughput mode's expected use from the caps, or why it is unknown."""
    max_minutes, max_steps = throughput.max_minutes, throughput.max_steps
    if max_minutes is None:
        if max_steps is None:
            why = "no cap is set (throughput.max_minutes and max_steps are null): a run measures until its precision is reached"
        else:
            why = (f"throughput.max_minutes is null: only max_steps ({max_steps}) caps a run, and the time of "
                   f"those steps is unknown before a run")
        return f"ddpscale: expected use from the caps: unknown, {why}"
    total = sum(expected_hours(job, max_minutes) for job in todo)
    return (f"ddpscale: expected use from the caps: {hours(total)} GPU-hours (throughput mode, at most "
            f"{max_minutes} min of measuring per run; set-up, probe and validation not included)")
