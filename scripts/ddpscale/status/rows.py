"""Live status of a benchmark (`make status`, scripts/status.py): per topology and repeat, not
started, queued, running, done or failed, and a Snakemake lock left behind by a killed run.

Pure functions: rows from the plan the workflow wrote (plan.json; before it, the config), the
files' contents, squeue's lines and the command lines of this directory's processes, then the
text. sources.py reads those from the system.
No torch, no Lightning, no pandas: it runs on a login node in a fraction of a second.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from ddpscale.core.record import last_progress
from ddpscale.run import measuremode
from ddpscale.core.io import cause_line, terminal_safe
from ddpscale.core.layout import Layout
from ddpscale.run.topology import parse_topology
from ddpscale.plan.planfile import Planned
from ddpscale.plan.site.squeue import QUEUED_STATES, Job

# A progress line older than the job's start (beyond clock skew) is an earlier attempt's, read
# before the new job's shell truncated the log.
CLOCK_SKEW_S = 10.0
LAST_LINE_CHARS = 160
UNLOCK = ".venv/bin/snakemake --profile profiles/<name> --unlock"
NOT_PLANNED = "not planned yet"


# Paths below an experiment's folder, as Layout names them: the files are read below the folder,
# and a command line holds them after the folder's own name.
_BELOW = Layout("")


def metrics_path(topology: str, repeat: int) -> str:
    """A run's metrics.json in the experiment's folder."""
    return _BELOW.metrics(topology, repeat).lstrip("/")


def args_path(topology: str, repeat: int) -> str:
    """A run's args file in the experiment's folder: its job's command line names it."""
    return _BELOW.run_args(topology, repeat).lstrip("/")


def log_path(topology: str, repeat: int) -> str:
    """A run's train log in the experiment's folder."""
    return _BELOW.train_log(topology, repeat).lstrip("/")


@dataclass(frozen=True)
class Run:
    """What the files say about one run: its validated metrics (None before they exist or when
    unreadable), its log's text (None without a log), and why its metrics.json is unreadable
    (core/record refuses it: the workflow sets it aside and reruns the run), else None."""
    metrics: dict | None = None
    log: str | None = None
    unreadable: str | None = None


@dataclass(frozen=True)
class Row:
    topology: str
    repeat: int
    state: str  # not started | queued | running | done | unreadable | failed
    detail: str = ""


def merge_configs(base: dict, overlays: list[dict]) -> dict:
    """The config as Snakemake sees it after --configfile overlays and --config: nested mappings
    merged key by key (the experiment's folder depends on model.class_path, below the top level)."""
    merged = dict(base or {})
    for overlay in overlays:
        for key, value in (overlay or {}).items():
            old = merged.get(key)
            merged[key] = merge_configs(old, [value]) if isinstance(old, dict) and isinstance(value, dict) else value
    return merged


def plan(config: dict, resolved: dict | None = None) -> tuple[list[str], int, str]:
    """Before the workflow planned (no plan.json of ours): (topology names sorted as the workflow
    sorts them, repeats, baseline name) from the config. repeats: auto depends on the site the
    workflow ran on: `resolved` is what an earlier ddpscale's run wrote (plan.json before it had
    a version: measure and repeats); without it, an explicit measure decides, else one."""
    topologies = sorted({parse_topology(t, where="topologies") for t in config.get("topologies") or []})
    baseline = parse_topology(config.get("baseline", "1x1"), where="baseline").name
    names, setting = [t.name for t in topologies], config.get("repeats", 1)
    if setting == "auto":
        # plan.json of another shape is as good as none: its writer rewrites it at the next run
        found = resolved.get("repeats") if isinstance(resolved, dict) else None
        if measuremode.valid_repeats(found):
            return names, found, baseline
    elif not measuremode.valid_repeats(setting):
        raise ValueError(f"repeats is {setting!r} in the config; set it to a whole number from 1 to "
                         f"{measuremode.MAX_REPEATS}, or auto")
    # measure auto or unset counts as full here (measuremode.repeats: 3 only in throughput mode)
    return names, measuremode.repeats(setting, config.get("measure", "auto")), baseline


def plan_line(experiment: str, plan_file: str, planned: Planned | None, why: str | None,
              others: list[str] = ()) -> str:
    """Which experiment the rows are of, and whether they are what its workflow planned
    (plan.json) or, before it wrote one, the config's as status was given it (NOT_PLANNED);
    why: what is wrong with a plan.json that is there but unread; others: experiments of
    results/ that have a plan."""
    if planned is not None:
        return f"experiment {planned.experiment}: as its workflow planned it ({plan_file}): {planned.summary()}"
    cause = (f"no {plan_file} (the workflow writes it when its jobs start)" if why is None
             else f"{plan_file} {why}, as good as none (the next run rewrites it)")
    hint = f"; planned here: {', '.join(others)} (pick one with --config experiment=NAME)" if others else ""
    return f"experiment {experiment}: {NOT_PLANNED}: {cause}; showing the config's runs as given here{hint}"


def duration(seconds: float) -> str:
    """1:02:03 or 2:03 (as squeue writes elapsed times), with days as 1-02:03:04."""
    total = int(round(max(0.0, seconds)))
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}-{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def last_line(text: str) -> str:
    line = terminal_safe(cause_line(text))  # before shortening: an escape is never cut in two
    if not line:
        # Snakemake creates a failed job's missing log: a job cancelled or refused before it ran
        return "(empty log: the job wrote nothing)"
    return shortened(line)


def per_device(metrics: dict, topology: str) -> float | None:
    throughput = metrics.get("throughput_samples_s")
    world = metrics.get("world_size") or parse_topology(topology).world_size
    return throughput / world if isinstance(throughput, (int, float)) and world else None


def baseline_per_device(runs: dict[tuple[str, int], Run], baseline: str) -> float | None:
    """The baseline's throughput per device, the mean over its finished repeats."""
    values = [per_device(run.metrics, baseline) for (t, _), run in runs.items()
              if t == baseline and run.metrics]
    values = [v for v in values if v]
    return sum(values) / len(values) if values else None


def shortened(line: str) -> str:
    return line if len(line) <= LAST_LINE_CHARS else line[:LAST_LINE_CHARS - 3] + "..."


def done_detail(metrics: dict, topology: str, baseline: str, base: float | None) -> str:
    throughput = metrics.get("throughput_samples_s")
    if not isinstance(throughput, (int, float)):
        return "throughput n/a (no steady epoch)"
    own = per_device(metrics, topology)
    efficiency = f"efficiency {own / base:.2f} vs {baseline}" if base else f"efficiency n/a ({baseline} not done)"
    parts = [f"{throughput:.1f} samples/s", efficiency]
    if isinstance(metrics.get("fit_time_s"), (int, float)):
        parts.append(f"fit {duration(metrics['fit_time_s'])}")
    return ", ".join(parts)


def running_detail(log: str | None, job: Job | None, now: float) -> str:
    """epoch k/N, elapsed, time left and the last epoch's throughput; "starting" before the
    first epoch ends. Elapsed is SLURM's for a job (start-up included), else the fit's."""
    head = [f"SLURM job {job.id}"] if job else []
    p = last_progress(log or "")
    if p is not None and job is not None and job.elapsed_s is not None and p.at < now - job.elapsed_s - CLOCK_SKEW_S:
        p = None  # an earlier attempt's line
    if p is None:
        tail = [f"elapsed {duration(job.elapsed_s)}"] if job is not None and job.elapsed_s is not None else []
        return ", ".join([*head, "starting", *tail])
    since = max(0.0, now - p.at)
    elapsed = job.elapsed_s if job is not None and job.elapsed_s is not None else p.fit_s + since
    left = max(0.0, (p.max_epochs - p.epoch) * p.epoch_s - since)
    return ", ".join([*head, f"epoch {p.epoch}/{p.max_epochs}", f"elapsed {duration(elapsed)}",
                      f"~{duration(left)} left", f"{p.throughput:.1f} samples/s last epoch"])


def run_row(topology: str, repeat: int, run: Run, job: Job | None, running_here: bool, now: float,
            baseline: str, base: float | None) -> Row:
    """One run's state. A metrics.json marks it done (even while its job is still ending); a
    queued or running SLURM job, or a process of this directory naming the run, marks it
    live; a log without either is a failure. An unreadable record is what the next workflow
    run sets aside and retrains."""
    if run.unreadable is not None:
        return Row(topology, repeat, "unreadable", shortened(f"metrics.json unreadable: will rerun ({run.unreadable})"))
    if run.metrics is not None:
        return Row(topology, repeat, "done", done_detail(run.metrics, topology, baseline, base))
    if job is not None and job.state in QUEUED_STATES:
        return Row(topology, repeat, "queued", f"SLURM job {job.id}, reason {job.reason}")
    if job is not None or running_here:
        return Row(topology, repeat, "running", running_detail(run.log, job, now))
    if run.log is not None:
        return Row(topology, repeat, "failed", last_line(run.log))
    return Row(topology, repeat, "not started")


def rows(wanted: list[tuple[str, int]], baseline: str, runs: dict[tuple[str, int], Run],
         jobs: dict[tuple[str, int], Job], running_here: set[tuple[str, int]], now: float) -> list[Row]:
    """One row per wanted (topology, repeat), in that order."""
    base = baseline_per_device(runs, baseline)
    return [run_row(t, r, runs.get((t, r), Run()), jobs.get((t, r)), (t, r) in running_here, now, baseline, base)
            for t, r in wanted]


def table(table_rows: list[Row]) -> str:
    """An aligned text table; the last column is free text, escaped (a log's line may hold
    anything, and the table goes to a terminal)."""
    cells = [("topology", "repeat", "state", "detail")]
    cells += [tuple(map(terminal_safe, (row.topology, f"r{row.repeat}", row.state, row.detail)))
              for row in table_rows]
    widths = [max(len(c[i]) for c in cells) for i in range(3)]
    return "\n".join("  ".join([*(c[i].ljust(widths[i]) for i in range(3)), c[3]]).rstrip() for c in cells)


def counts(table_rows: list[Row]) -> str:
    states = ["done", "running", "queued", "failed", "not started"] + (
        ["unreadable"] if any(r.state == "unreadable" for r in table_rows) else [])
    return ", ".join(f"{sum(r.state == s for r in table_rows)} {s}" for s in states)


def lock_line(lock_files: list[str], snakemake_pids: list[int] | None, profiles: list[str]) -> str | None:
    """One line about .snakemake/locks/, or None when there is nothing to say: no lock, or a
    snakemake of this directory holds it. snakemake_pids is None where /proc cannot tell."""
    if not lock_files or snakemake_pids:
        return None
    names = f" (<name>: {', '.join(profiles)})" if profiles else ""
    if snakemake_pids is None:
        return (f"Snakemake lock: .snakemake/locks/ holds {len(lock_files)} file(s) and without /proc this "
                f"cannot tell whether snakemake still runs here, so the lock may be stale; if none runs, "
                f"a rerun stops with 'Directory cannot be locked': fix with {UNLOCK}{names}")
    return (f"Stale Snakemake lock: .snakemake/locks/ holds {len(lock_files)} file(s) but no snakemake runs in "
            f"this directory (it was killed), so a rerun stops with 'Directory cannot be locked': fix with "
            f"{UNLOCK}{names}")


def run_named(argv: list[str], runs: list[tuple[str, int]]) -> set[tuple[str, int]]:
    """The runs a command line names by their args file, metrics or log path (a training job's
    shell, launcher and ranks all do)."""
    text = "\0".join(argv)
    return {(t, r) for t, r in runs if any(path(t, r) in text for path in (args_path, metrics_path, log_path))}


def is_snakemake(argv: list[str]) -> bool:
    """A snakemake that may hold this directory's lock: the console script, `python -m
    snakemake` or a path to it, but not a job it spawned (`--target-jobs`, run without a lock;
    on a cluster whose nodes are this host, such as the test cluster, SLURM's jobs run here)."""
    return any(Path(arg).name == "snakemake" for arg in argv) and "--target-jobs" not in argv


def live_here(procs: list[tuple[int, list[str]]] | None, wanted: list[tuple[str, int]],
              runs: dict[tuple[str, int], Run], locked: bool) -> tuple[list[int] | None, set[tuple[str, int]]]:
    """(pids of the snakemake of this directory, runs a process here is training) from the
    processes whose working directory is this one; None where there is no /proc. Then a held
    lock is the only sign of a live snakemake, and every run with a log but no metrics may be
    its running job."""
    if procs is None:
        return None, ({key for key in wanted if runs.get(key, Run()).log is not None} if locked else set())
    pids = [pid for pid, argv in procs if is_snakemake(argv)]
    return pids, set().union(*(run_named(argv, wanted) for _, argv in procs))


def render(now: float, here: str, planned: str, table_rows: list[Row], pids: list[int] | None, jobs: int | None,
           source: str, lock: str | None) -> str:
    """The status text: where and when, the experiment and where its runs came from (planned:
    plan_line's), snakemake and SLURM in one line, the table, the counts, and the lock line if
    any. jobs: live SLURM jobs of this directory, None without squeue."""
    snakemake = ("snakemake: cannot tell (no /proc)" if pids is None else
                 f"snakemake: running here (pid {', '.join(map(str, pids))})" if pids else
                 "snakemake: not running here")
    cluster = (f"SLURM: {jobs} queued or running job(s) of this directory" if jobs is not None
               else f"SLURM: {source}, local runs only")
    lines = [f"ddpscale status {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(now))} in {terminal_safe(here)}",
             terminal_safe(planned), f"{snakemake}; {cluster}", "", table(table_rows), "", counts(table_rows)]
    return "\n".join(lines + ([terminal_safe(lock)] if lock else []))
