"""Where one experiment's files live: results/<experiment>/{data,runs,logs,checkpoints,report}/.

Every experiment (config/config.yaml and the overlays given with --configfile) writes to a
folder of its own, so running another config never replaces an earlier one's runs or report,
and `make status` shows only the runs of the experiment it is given. The name is config key
`experiment`, or, where that is null, the model class's name in lower case (SpiralMLP ->
spiralmlp): two workloads of different models never share a folder; presets that share a
model class name themselves (config/transformer_tiny.yaml). The workflow, the status command
and the report read every path from here. Pure: no I/O.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import PurePath

RESULTS = "results"
METRICS = "metrics.json"  # a run's record, in the folder of its topology and repeat
TOPOLOGY_FOLDER, RUN_FOLDER = re.compile(r"\d+x\d+"), re.compile(r"r\d+")
# what the schema allows for `experiment`: one folder name, never a path out of results/, at most
# 64 characters (a path of results/<name>/checkpoints/... must stay under the file system's
# limit). The lookahead: in the regular expressions of Python's jsonschema `$` also matches before
# a final newline, and "foo\n" would become a folder and split a rule's shell line.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}(?!\n)$"
# results/ as it was before experiments had folders of their own
LEGACY_RUNS = f"{RESULTS}/runs"
# The folders results/ held then: an experiment of one of these names would share its folder
# with the old layout (results/runs is LEGACY_RUNS, read as old runs), and scripts/report.py
# writes to results/report by default. Compared without case, as macOS's file system does.
LEGACY_FOLDERS = ("data", "runs", "logs", "checkpoints", "report")


def reserved_problem(name: str) -> str | None:
    """Why an experiment cannot be called `name`, or None."""
    if name.lower() in LEGACY_FOLDERS:
        return (f"{RESULTS}/{name}/ is a folder of results/ as it was before experiments had their own "
                f"({', '.join(LEGACY_FOLDERS)}), so its runs would mix with those")
    return None


def experiment_name(config: dict) -> str:
    """config `experiment`, else the model class's name in lower case."""
    name = config.get("experiment")
    if name:
        return str(name)
    model = config.get("model")
    class_path = model.get("class_path") if isinstance(model, dict) else None
    return str(class_path or "").rpartition(".")[2].lower() or "experiment"


@dataclass(frozen=True)
class Layout:
    """The folders of one experiment, relative to the directory snakemake runs in."""

    root: str

    @property
    def data(self) -> str:
        return f"{self.root}/data"

    @property
    def runs(self) -> str:
        return f"{self.root}/runs"

    @property
    def logs(self) -> str:
        return f"{self.root}/logs"

    @property
    def train_logs(self) -> str:
        return f"{self.logs}/train"

    @property
    def checkpoints(self) -> str:
        return f"{self.root}/checkpoints"

    @property
    def report(self) -> str:
        return f"{self.root}/report"

    @property
    def plan(self) -> str:
        """What the workflow planned (ddpscale.plan.planfile), for `make status`."""
        return f"{self.root}/plan.json"

    @property
    def args(self) -> str:
        """The settings the workflow hands its jobs in files (ddpscale.run.argsfile)."""
        return f"{self.root}/args"

    def run_args(self, topology: str, repeat) -> str:
        return f"{self.args}/train/{topology}/r{repeat}.json"

    def report_args(self, rule: str) -> str:
        """One file per report rule (report_scaling, partial_report): their runs differ."""
        return f"{self.args}/{rule}.json"

    def metrics(self, topology: str, repeat) -> str:
        return f"{self.runs}/{topology}/r{repeat}/{METRICS}"

    def train_log(self, topology: str, repeat) -> str:
        return f"{self.train_logs}/{topology}/r{repeat}.log"

    def checkpoint_dir(self, topology: str, repeat) -> str:
        return f"{self.checkpoints}/{topology}/r{repeat}"


def run_of(path: str | os.PathLike) -> tuple[str, int] | None:
    """(topology, repeat) of a run record's path as Layout.metrics makes it (<topology>/r<k>/
    metrics.json, below any folder), else None: the run a record in that place must be."""
    parts = PurePath(path).parts
    if len(parts) < 3 or parts[-1] != METRICS or not RUN_FOLDER.fullmatch(parts[-2]) \
            or not TOPOLOGY_FOLDER.fullmatch(parts[-3]):
        return None
    return parts[-3], int(parts[-2][1:])


def layout(config: dict) -> Layout:
    return Layout(f"{RESULTS}/{experiment_name(config)}")


def legacy_note(name: str) -> str:
    """Said when results/runs/ from before experiment folders is found beside the new layout."""
    return (f"{LEGACY_RUNS}/ holds runs from before each experiment had a folder of its own; this "
            f"experiment's results are in {RESULTS}/{name}/ (to keep the old ones for it, move "
            f"{RESULTS}/{{data,runs,logs,checkpoints,report}} into {RESULTS}/{name}/)")


def other_workload(records: dict[str, dict], model_class: str, data_class: str) -> str | None:
    """Why finished runs in this experiment's folder belong to another workload, or None.

    Snakemake would rerun them (their flags changed) and delete them first: the experiment's
    name, not an overwrite, should separate two workloads. records: metrics path -> its JSON.
    """
    for path, record in sorted(records.items()):
        theirs = (record.get("model_class"), record.get("data_class"))
        if None not in theirs and theirs != (model_class, data_class):
            return (f"{path} is a finished run of {theirs[0]} on {theirs[1]}, but this config trains "
                    f"{model_class} on {data_class}")
    return None
