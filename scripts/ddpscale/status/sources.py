"""What `make status` reads from the system: the config as Snakemake would merge it from the
command line it is given (--configfile, --config key=value), the plan the workflow wrote
(plan.json, ddpscale.plan.planfile), metrics.json and the train logs, squeue (where there is one),
this directory's processes in /proc, and .snakemake/locks/. The rows and the text are made by
the pure functions of rows.py."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import yaml

from ddpscale.core import record as run_record
from ddpscale.core.io import read_regular
from ddpscale.core.layout import Layout, experiment_name
from ddpscale.plan import planfile
from ddpscale.plan.config import read as configread
from ddpscale.plan.config.source import DEFAULT_CONFIG, set_beyond_default
from ddpscale.plan.site.squeue import active_jobs, query_squeue
from ddpscale.status import rows as status


def read_yaml(path) -> object:
    """A config file by the workflow's own reader; a ValueError with its one line otherwise."""
    data, problem = configread.read_yaml(path)
    if problem:
        raise ValueError(problem)
    return data


# what Snakemake accepts as a --config key (snakemake.cli.parse_config)
CONFIG_KEY = re.compile(r"[a-zA-Z_][\w-]*\w$")


def _bool(text: str) -> bool:
    if text in ("True", "False"):
        return text == "True"
    raise ValueError(text)


def _yaml_text(text: str) -> object:
    return yaml.load(text, Loader=yaml.BaseLoader)


def _value(text: str) -> object:
    """The first reading of a --config value that works, in Snakemake's order."""
    for parse in (int, float, _bool, _yaml_text):
        try:
            value = parse(text)
        except (ValueError, yaml.YAMLError):
            value = None
        if value is not None and not callable(value):
            return value
    return text


def parse_overrides(entries: list[str]) -> dict:
    """--config KEY=VALUE ... as Snakemake reads it (snakemake.cli.parse_config): the value
    stripped of quotes, then an int, a float, True or False, YAML read as text (a list, a
    mapping), else the text; a ValueError naming the entry otherwise."""
    config = {}
    for entry in entries:
        key, equals, text = entry.partition("=")
        if not equals:
            raise ValueError(f"--config {entry!r}: --config takes KEY=VALUE, as snakemake's; a config file goes "
                             "with --configfile FILE")
        if not CONFIG_KEY.match(key):
            raise ValueError(f"--config {entry!r}: {key!r} is not a key snakemake's --config takes")
        text = text.strip("'\"")
        config = status.merge_configs(config, [{key: _value(text) if text else None}])
    return config


def read_config(overlays: list[Path], overrides: dict | None = None) -> dict:
    """config/config.yaml with the --configfile overlays (paths as the user gave them) and the
    --config overrides, as Snakemake merges them, and a LightningCLI config's model and data
    where it names one (the experiment's folder follows them)."""
    base = read_yaml(DEFAULT_CONFIG)
    layers = [(DEFAULT_CONFIG, base)] + [(str(p), read_yaml(p) or {}) for p in overlays]
    if overrides:
        layers.append(("--config", overrides))
    config = status.merge_configs(base, [tree for _, tree in layers[1:]])
    cli = config.get("lightning_config")
    if cli and Path(cli).is_file() and isinstance(config.get("dataset"), dict):
        # only for such a config: the reader's config checks load numpy, which status otherwise never needs
        from ddpscale.run import lightningcli

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


def read_runs(results: Path, wanted: list[tuple[str, int]]) -> dict[tuple[str, int], status.Run]:
    runs = {}
    for t, r in wanted:
        metrics_file = results / status.metrics_path(t, r)
        log_file = results / status.log_path(t, r)
        metrics, unreadable = run_record.load(metrics_file) if metrics_file.exists() else (None, None)
        log = read_log(log_file) if log_file.exists() else None
        runs[(t, r)] = status.Run(metrics, log, unreadable)
    return runs


def planned_elsewhere(results: Path, limit: int = 8) -> list[str]:
    """The other experiments beside this one whose workflow wrote a plan (results/<name>/plan.json)."""
    try:
        names = sorted(p.name for p in results.parent.iterdir()
                       if p.name != results.name and os.path.lexists(p / "plan.json"))
    except OSError:
        return []
    return names[:limit] + (["..."] if len(names) > limit else [])


def runs_to_show(config: dict, results: Path, experiment: str | None) -> tuple[list[tuple[str, int]], str, str]:
    """(the runs to show, the baseline, the line saying where they came from): the plan the
    workflow wrote for the experiment, else the config's (rows.plan). experiment: the one the
    plan must be of, None to take the folder's whatever it holds (--results)."""
    path = Layout(str(results)).plan
    data, why = planfile.read(path)
    planned, why = planfile.parse(data, experiment) if data is not None else (None, why)
    if planned is not None:
        return planned.runs(), planned.baseline, status.plan_line(planned.experiment, path, planned, None)
    # plan.json before it had a version held what the site resolved for repeats: auto
    legacy = data if data is not None and "version" not in data else None
    topologies, repeats, baseline = status.plan(config, legacy)
    name = experiment or experiment_name(config)
    others = planned_elsewhere(results) if experiment is not None and why is None else []
    return [(t, r) for t in topologies for r in range(repeats)], baseline, status.plan_line(
        name, path, None, why, others)


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


def report(config: dict, results: Path, workdir: Path, experiment: str | None = None) -> str:
    """The whole status text for the directory snakemake runs in; experiment: the one whose plan
    results/ must hold (None: whatever plan the folder holds)."""
    now = time.time()
    wanted, baseline, planned = runs_to_show(config, results, experiment)
    here = str(workdir.resolve())
    # the baseline's repeats too: efficiency is against their mean
    base_runs = [(baseline, r) for r in range(max((r + 1 for _, r in wanted), default=1))]
    runs = read_runs(results, list(dict.fromkeys(wanted + base_runs)))
    jobs, source = query_squeue()
    live = active_jobs(jobs, here) if jobs is not None else {}
    locks = lock_files(workdir)
    pids, running_here = status.live_here(processes_here(here), wanted, runs, bool(locks))
    table_rows = status.rows(wanted, baseline, runs, live, running_here, now)
    return status.render(now, here, planned, table_rows, pids, len(live) if jobs is not None else None, source,
                         status.lock_line(locks, pids, profile_names(workdir)))
