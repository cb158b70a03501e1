"""The runs a report is made from: metrics.json records read, validated, and checked that they
may be compared (the world that formed, one kind of device, one identity).

Pure pandas, like the rest of the report: no torch. The file itself is ddpscale.core.record's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

import pandas as pd

from ddpscale.core import record as run_record
from ddpscale.core.layout import RESULTS
from ddpscale.core.steadystate import Rule
from ddpscale.run.measuremode import FULL
from ddpscale.run.topology import STAGE_RULES
from ddpscale.run import identity


def load_runs(paths: Iterable[str | Path]) -> pd.DataFrame:
    """One row per metrics.json; list/dict fields stay Python objects."""
    records = [{**run_record.read(path), "source": str(path)} for path in paths]
    if not records:
        raise ValueError("no metrics files given")
    return pd.DataFrame.from_records(records)


def rules(runs: pd.DataFrame) -> list[Rule]:
    """Each run's stopping rule, read back from its record's `throughput` entry (config
    throughput: whole, by its names; core.record has checked it)."""
    return [Rule.of(settings) for settings in runs["throughput"]]


def check_world_sizes(runs: pd.DataFrame) -> None:
    """A run whose world_size differs from the request lost ranks: it must
    never be shown as a result, so refuse the whole report."""
    expected = runs["num_nodes"] * runs["devices_per_node"]
    bad = runs[runs["world_size"] != expected]
    if not bad.empty:
        row = bad.iloc[0]
        raise ValueError(
            f"run {row['topology']} (repeat {row['repeat']}) is broken: "
            f"world_size {row['world_size']} != num_nodes*devices_per_node "
            f"{row['num_nodes'] * row['devices_per_node']}; rerun it or drop "
            f"its metrics file")


def known(value) -> bool:
    """False for None, NaN and pd.NA: a value the run did not measure, or a key only some runs
    write (the probe, compile statistics) that a frame of several records holds as NaN."""
    try:
        return not pd.isna(value)
    except (TypeError, ValueError):  # a list or dict: present
        return True


def column(runs: pd.DataFrame, key: str) -> pd.Series:
    """A key only some runs write (core.record.REQUIRED_KEYS lists those all do): None where
    no run of these wrote it."""
    return runs[key] if key in runs.columns else pd.Series(None, index=runs.index, dtype=object)


def held_devices(runs: pd.DataFrame) -> pd.Series:
    """The devices each run's held time is billed for: whole nodes where the site gives them
    (held_devices, site_exclusive), else its ranks."""
    return runs["held_devices"].astype(float)


def device_kinds(runs: pd.DataFrame) -> pd.Series:
    """"cuda" or "cpu" per run."""
    return runs["device_kind"].astype(str)


# Reruns every training run: the stage rules by name.
RERUN_ALL = f"snakemake --profile <profile> --forcerun {' '.join(STAGE_RULES.values())}"


def runs_folder(runs: pd.DataFrame) -> str:
    """The folder these runs' metrics.json files are in (<runs>/<topology>/r<k>/metrics.json,
    results/<experiment>/runs in the workflow), to name in a fix; the generic one otherwise."""
    folders = set()
    # source: the file load_runs read the row from; a frame made in memory has none
    for source, topology in zip(column(runs, "source"), runs["topology"]):
        path = Path(str(source))
        if len(path.parents) > 2 and path.parent.name.startswith("r") and path.parents[1].name == str(topology):
            folders.add(str(path.parents[2]))
    return folders.pop() if len(folders) == 1 else f"{RESULTS}/<experiment>/runs"


def check_device_kinds(runs: pd.DataFrame) -> None:
    """GPU and CPU runs in one report would make speedups across different hardware: refuse."""
    gpu = device_kinds(runs).eq("cuda")
    if gpu.all() or not gpu.any():
        return
    names = {"GPU": list(dict.fromkeys(runs.loc[gpu, "topology"])),
             "CPU": list(dict.fromkeys(runs.loc[~gpu, "topology"]))}
    listing = "; ".join(f"{kind}: {', '.join(map(str, tops))}" for kind, tops in names.items())
    raise ValueError(f"the runs mix GPU and CPU devices ({listing}), and a speedup across them "
                     f"would compare different hardware; rerun with one accelerator: delete the "
                     f"stale {runs_folder(runs)}/<topology> folders of the kind you do not want and run "
                     f"the workflow again")


def _run_labels(runs: pd.DataFrame) -> list[str]:
    return [f"{t}/r{r}" for t, r in zip(runs["topology"], runs["repeat"])]


def check_identities(runs: pd.DataFrame) -> None:
    """Runs made from other data, settings, code or versions are not comparable: refuse."""
    records = dict(zip(_run_labels(runs), runs["identity"]))
    fix = (f"rerun them so every run matches, e.g. `{RERUN_ALL}`, "
           f"or delete the stale {runs_folder(runs)}/<topology>/r<k>/metrics.json and run the workflow again")
    differing = identity.differences(records)
    if differing:
        raise ValueError(f"the runs differ in {'; '.join(differing)}, and the report never mixes "
                         f"runs of different data, settings, code or versions; {fix}")


def measure_modes(runs: pd.DataFrame) -> pd.Series:
    """"throughput" or "full" per run."""
    return runs["measure"].astype(str)


def measure_mode(runs: pd.DataFrame) -> str:
    """The one mode of the runs (check_measure_modes refuses a mix)."""
    modes = measure_modes(runs)
    return str(modes.iloc[0]) if len(modes) else FULL


def check_measure_modes(runs: pd.DataFrame) -> None:
    """A throughput figure (windows of steps) and a full one (whole epochs) of one topology are
    not repeats of one measurement, and a speedup across them mixes two methods: refuse."""
    modes = measure_modes(runs)
    if modes.nunique() < 2:
        return
    listing = "; ".join(f"{mode}: {', '.join(_run_labels(runs[modes == mode]))}" for mode in dict.fromkeys(modes))
    raise ValueError(f"the runs mix measure modes ({listing}), and a throughput figure and a full one are not "
                     f"repeats of one measurement; set `measure` to one mode in the config and rerun the others, "
                     f"e.g. `{RERUN_ALL}`, or delete the stale {runs_folder(runs)}/<topology>/r<k>/metrics.json "
                     "of the mode you do not want and run the workflow again")
