"""What `make status` reads from the system: the config, metrics.json and the train logs,
squeue (where there is one), this directory's processes in /proc, and .snakemake/locks/. The
rows and the text are made by the pure functions of status.py."""

from __future__ import annotations

import os
import time
from pathlib import Path

from ddpscale.core import record as run_record
from ddpscale.core.io import read_json_dict, read_regular
from ddpscale.core.layout import Layout
from ddpscale.plan.config import read as configread
from ddpscale.plan.config.source import set_beyond_default
from ddpscale.plan.site.squeue import active_jobs, query_squeue
from ddpscale.status import rows as status


def read_yaml(path) -> object:
    """A config file by the workflow's own reader; a ValueError with its one line otherwise."""
    data, problem = configread.read_yaml(path)
    if problem:
        raise ValueError(problem)
    return data


def read_config(path: Path, overlays: list[Path]) -> dict:
    """config/config.yaml with the --configfile overlays (paths as the user gave them), and a
    LightningCLI config's model and data where it names one (the experiment's folder follows them)."""
    base = read_yaml(path)
    layers = [(str(path), base)] + [(str(p), read_yaml(p) or {}) for p in overlays]
    config = status.merge_configs(base, [tree for _, tree in layers[1:]])
    cli = config.get("lightning_config")
    if cli and Path(cli).is_file() and isinstance(config.get("dataset"), dict):
        # only for such a config: the reader's config checks load numpy, which status otherwise never needs
        from ddpscale.plan import lightningcli

        applied = lightningcli.apply(read_yaml(cli), config, cli, lambda key: set_beyond_default(key, layers))
        config = applied.config
    return config


def read_log(path: Path) -> str:
    """A run's log as text; one that is not a regular file (a FIFO, which would wait for a writer
    for ever) or cannot be read is the line saying so, which status shows as its cause."""
    try:
        return read_regular(path).decode("utf-8", errors="replace")
    except OSError as err:
        return f"cannot read the log {path}: {err.strerror or err}"


def read_runs(results: Path, topologies: list[str], repeats: int) -> dict[tuple[str, int], status.Run]:
    runs = {}
    for t in topologies:
        for r in range(repeats):
            metrics_file = results / status.metrics_path(t, r)
            log_file = results / status.log_path(t, r)
            metrics, unreadable = run_record.load(metrics_file) if metrics_file.exists() else (None, None)
            log = read_log(log_file) if log_file.exists() else None
            runs[(t, r)] = status.Run(metrics, log, unreadable)
    return runs


def processes_here(workdir: str) -> list[tuple[int, list[str]]] | None:
    """(pid, argv) of every process whose working directory is workdir; None without /proc."""
    proc = Path("/proc")
    if not (proc / "self/cmdline").exists():
        return None
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if os.readlink(entry / "cwd") != workdir:
                continue
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:  # another user's process, or one that just ended
            continue
        found.append((int(entry.name), [a.decode(errors="replace") for a in argv if a]))
    return found


def lock_files(workdir: Path) -> list[str]:
    locks = workdir / ".snakemake/locks"
    return sorted(p.name for p in locks.iterdir()) if locks.is_dir() else []


def profile_names(workdir: Path) -> list[str]:
    folder = workdir / "profiles"
    return sorted(p.name for p in folder.iterdir() if (p / "config.yaml").exists()) if folder.is_dir() else []


def report(config: dict, results: Path, workdir: Path) -> str:
    """The whole status text for the directory snakemake runs in."""
    now = time.time()
    topologies, repeats, baseline = status.plan(config, read_json_dict(Layout(str(results)).plan))
    here = str(workdir.resolve())
    runs = read_runs(results, sorted({*topologies, baseline}), repeats)
    jobs, source = query_squeue()
    live = active_jobs(jobs, here) if jobs is not None else {}
    locks = lock_files(workdir)
    wanted = [(t, r) for t in topologies for r in range(repeats)]
    pids, running_here = status.live_here(processes_here(here), wanted, runs, bool(locks))
    table_rows = status.rows(topologies, repeats, baseline, runs, live, running_here, now)
    return status.render(now, here, table_rows, pids, len(live) if jobs is not None else None, source,
                         status.lock_line(locks, pids, profile_names(workdir)))
