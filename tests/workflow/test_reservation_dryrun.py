"""A real dry run of a shipped cluster profile states what the benchmark reserves, per job and
in total, before anything is submitted (the arithmetic: test_reservation.py). No SLURM needed."""
from __future__ import annotations

import json
import math
import os
import shlex
import subprocess

import pytest
import yaml

from helpers.records import make_run
from helpers.workflow import ROOT, SNAKEMAKE, Workspace, tiny_config
from ddpscale.run.topology import parse_topology
from ddpscale.plan.cost.reservation import hours
from ddpscale.plan.cost.timelimit import DEFAULT_SETUP_MIN
from ddpscale.core.spiral import write_dataset

pytestmark = pytest.mark.timeout(240)

PROFILE = "gilbreth"  # 2 GPUs per node; train_baseline's own runtime (240) over train's (120)
TOPOLOGIES = {"1x1": "train_baseline", "1x2": "train_single_node", "2x2": "train_multi_node"}


def profile_runtime(profile: dict, rule: str) -> int:
    """The minutes the profile gives a stage, read from its YAML as a user reads it."""
    entries = profile["set-resources"]
    for entry in (entries.get(rule, {}), entries["train"], profile["default-resources"]):
        if "runtime" in entry:
            return int(entry["runtime"])
    raise AssertionError(f"{PROFILE} sets no runtime for {rule}")


def job_limit(profile: dict, rule: str, config: dict, setup_min: float = DEFAULT_SETUP_MIN) -> int:
    """The minutes a throughput-mode job asks for: its measuring cap plus the set-up allowance,
    at most the profile's runtime (ddpscale.plan.cost.timelimit)."""
    return min(profile_runtime(profile, rule), math.ceil(config["throughput"]["max_minutes"] + setup_min))


def dry_run(workspace, finished: list[str] = (), *flags: str, exclusive: bool = False, records: dict | None = None,
            **overrides):
    """`snakemake --profile profiles/gilbreth -n` in a workspace, the account set as a user
    sets it; `finished`: topologies whose first repeat has a metrics.json already (records: what
    each holds, else its topology only); exclusive: the site gives whole nodes (site_exclusive);
    overrides: config keys. Throughput mode by name: the tiny config's 28 batches per run are
    too few for it to win, so measure: auto would train in full."""
    config = tiny_config(**{"topologies": list(TOPOLOGIES), "repeats": 1, "measure": "throughput", **overrides})
    workspace.write_config(config)
    profile = yaml.safe_load((ROOT / f"profiles/{PROFILE}/config.yaml").read_text())
    profile["default-resources"]["slurm_account"] = "test_account"
    if exclusive:
        profile["set-resources"]["train"]["site_exclusive"] = True
    (workspace.path / f"profiles/{PROFILE}/config.yaml").write_text(yaml.safe_dump(profile))
    if finished:  # a finished run needs the dataset it used (common.smk checks it: runplan.disk_problems)
        data = workspace.results / "data/spiral"
        data.mkdir(parents=True)
        dataset = config["dataset"]
        write_dataset(str(data / "data.npz"), str(data / "manifest.json"), dataset["samples"], dataset["noise"],
                      dataset["seed"], dataset["split"])
    for name in finished:
        workspace.metrics(name).parent.mkdir(parents=True)
        # a whole record: one the reader refuses is set aside, and its run counted again
        record = (records or {}).get(name) or make_run(name, model_class=config["model"]["class_path"],
                                                       data_class=config["data"]["class_path"])
        workspace.metrics(name).write_text(json.dumps(record))
    proc = subprocess.run([*SNAKEMAKE, "--profile", f"profiles/{PROFILE}", "-n", *flags], cwd=workspace.path,
                          capture_output=True, text=True, timeout=180,
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return profile, config, proc.stderr + proc.stdout


def test_a_cluster_dry_run_states_each_jobs_gpu_hours_and_the_total(workspace):
    profile, config, stderr = dry_run(workspace)
    # seen by hand: throughput mode's 10 min of measuring + 15 of set-up, not the baseline's 240
    assert "ddpscale: cost: 1x1 r0 (train_baseline): 1 GPU x 25 min = 0.42 GPU-hours reserved" in stderr
    total = expected = 0.0
    max_minutes = config["throughput"]["max_minutes"]
    for name, rule in TOPOLOGIES.items():
        devices, minutes = parse_topology(name).world_size, job_limit(profile, rule, config)
        total += devices * minutes / 60
        expected += devices * min(minutes, max_minutes) / 60
        assert f"{name} r0 ({rule}): {devices} GPU" in stderr and f" x {minutes} min = " in stderr
    assert f"ddpscale: this benchmark reserves at most {hours(total)} GPU-hours (3 jobs)" in stderr
    assert f"ddpscale: expected use from the caps: {expected:.2f} GPU-hours" in stderr
    # asked for by name, throughput mode runs, and says it cannot win with 28 batches per run
    assert ("ddpscale: throughput mode cannot win here: 1x1, 1x2 and 2x2 train 28 batches per rank (2 epochs x 14)"
            in stderr)
    assert "measure: throughput runs as set; measure: full or auto trains in full" in stderr
    # a dry run writes nothing: what the site resolved is kept for make status once jobs start
    assert not (workspace.results / "plan.json").exists()


def test_a_finished_run_is_left_out_of_the_total(workspace):
    profile, config, stderr = dry_run(workspace, finished=["2x2"])
    assert "2x2 r0 (train_multi_node): finished (its metrics.json exists)" in stderr
    rest = (1 * job_limit(profile, "train_baseline", config) / 60
            + 2 * job_limit(profile, "train_single_node", config) / 60)
    assert f"reserves at most {hours(rest)} GPU-hours (2 jobs; 1 finished run not counted: 2x2/r0)" in stderr


def test_whole_nodes_are_what_a_run_is_billed_for_with_site_exclusive(workspace):
    """Issue 29 item 3: held time x devices under-bills a job that holds whole nodes. With
    site_exclusive each training job tells train.py the GPUs it holds (gilbreth: 2 a node), so
    the report bills those; the reservation says the same."""
    _, _, stderr = dry_run(workspace, (), "--printshellcmds", exclusive=True)
    assert "1 GPU x" not in stderr and "1x1 r0 (train_baseline): 2 GPUs (whole nodes: site_exclusive)" in stderr
    commands = [line for line in stderr.splitlines() if "scripts/train.py" in line and "--topology" in line]
    held = {line.split("--topology=")[1].split()[0]: line.split("--held-devices=")[1].split()[0] for line in commands}
    assert held == {"1x1": "2", "1x2": "2", "2x2": "4"}, commands


def test_the_report_is_told_each_topology_s_job_time_limit(workspace):
    """A full training longer than its job's time limit runs as several jobs, each paying its
    start again: the report's projection needs the limit (and the warning signal before it)
    that the profile gives each topology's training job."""
    profile, _, stderr = dry_run(workspace, (), "--printshellcmds")
    report = [line for line in stderr.splitlines() if "scripts/report.py" in line and "--metrics" in line]
    assert report, stderr[-3000:]
    words = shlex.split(report[0])
    limits = json.loads(next(w.removeprefix("--job-limits=") for w in words if w.startswith("--job-limits=")))
    signal = profile["set-resources"]["train"]["site_signal_s"]
    assert limits == {name: {"limit_s": profile_runtime(profile, rule) * 60, "signal_s": signal}
                      for name, rule in TOPOLOGIES.items()}


def test_throughput_mode_sizes_each_stage_limit_and_says_where_it_came_from(workspace, tmp_path):
    """Issue 32 item 5: a throughput-mode job asks for its measuring cap plus a set-up allowance,
    not the stage's limit of hours, so the scheduler can backfill it; one line per stage says
    which and why. A finished run's record measures the set-up (held_s beyond its windows):
    twice the most measured, here 4 min, for the stages without a finished run too. Full mode
    keeps the profile's limits; the report's projection of a full training is told those."""
    finished = {"2x2": make_run("2x2", measure="throughput", held_s=300.0, window_seconds=[30.0, 30.0],
                                model_class="ddpscale.workloads.models.SpiralMLP",
                                data_class="ddpscale.workloads.spiral_datamodule.SpiralDataModule")}
    profile, config, stderr = dry_run(workspace, ["2x2"], "--printshellcmds", records=finished)
    lines = [line for line in stderr.splitlines() if line.startswith("ddpscale: time limit: ")]
    assert len(lines) == 3, stderr[-3000:]
    assert lines[0] == ("ddpscale: time limit: train_baseline: 18 min (throughput mode: max_minutes 10 + 8 min set-up "
                        "(2 x 4 min measured by 2x2, at least 5); the profile's runtime for train_baseline, 240 min, "
                        "is kept for measure: full)")
    assert "1 GPU x 18 min = 0.3 GPU-hours reserved" in stderr
    report = next(line for line in stderr.splitlines() if "scripts/report.py" in line and "--metrics" in line)
    words = shlex.split(report)
    limits = json.loads(next(w.removeprefix("--job-limits=") for w in words if w.startswith("--job-limits=")))
    assert limits["1x1"]["limit_s"] == profile_runtime(profile, "train_baseline") * 60

    _, _, stderr = dry_run(Workspace(tmp_path / "full"), measure="full")
    assert ("ddpscale: time limit: train_baseline: 240 min (measure full: the profile's runtime for train_baseline)"
            in stderr)
    assert "1 GPU x 240 min = 4.0 GPU-hours reserved" in stderr


def test_auto_trains_in_full_on_a_cluster_where_throughput_mode_cannot_win(workspace):
    """The shipped spiral (3 epochs of 10000 samples) in windows of 20 steps trains 330 batches per
    rank, short of the 600 the stopping rule needs before its first look: on a cluster profile auto
    trains in full, one repeat each, and says why with the numbers and the fix."""
    profile, _, stderr = dry_run(workspace, measure="auto", repeats="auto", max_epochs=3,
                                 dataset={**tiny_config()["dataset"], "samples": 10000},
                                 throughput={**tiny_config()["throughput"], "window_steps": 20})
    lines = [line for line in stderr.splitlines() if line.startswith("ddpscale: ")]
    measure = next(i for i, line in enumerate(lines) if line.startswith("ddpscale: measure "))
    assert lines[measure].startswith("ddpscale: measure full (measure: auto on a cluster profile, where throughput "
                                     "mode cannot reach its precision inside the configured training")
    assert lines[measure + 1] == (
        "ddpscale: throughput mode cannot win here: 1x1, 1x2 and 2x2 train 330 batches per rank (3 epochs x 110), "
        "short of the 600 its stopping rule needs before its first look (throughput.min_windows 30 x window_steps "
        "20, plus any warm-up it cuts), so every run would end with its epochs and an interval wider than 2%, at 3 "
        "runs per topology (repeats: auto) where full training takes 1; max_epochs: 6 or more (or "
        "throughput.window_steps: 11 or fewer) would let it reach its precision. measure: auto trains in full; set "
        "measure: throughput to measure throughput anyway")
    # full mode: one repeat per topology, under the profile's own time limits
    assert "1x1 r0 (train_baseline): 1 GPU x 240 min" in stderr and " r1 " not in stderr
    limit = profile_runtime(profile, "train_baseline")
    assert f"ddpscale: time limit: train_baseline: {limit} min (measure full" in stderr
