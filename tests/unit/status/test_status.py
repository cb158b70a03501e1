"""`make status` (scripts/status.py): pure rows and table from plain data and squeue lines, and
the command on a results tree written here. A real local workflow watched while it trains,
then killed (its lock named with the fix, and the fix works): tests/workflow/test_status_local.py; on
the SLURM test cluster with a run queued, one running and one done: tests/slurm/test_status_slurm.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import yaml

from helpers.records import make_run
from helpers.status import NOW, STATUS, progress_line, run_status, write_tree
from helpers.workflow import ROOT
from ddpscale.core.io import write_json_atomic
from ddpscale.plan import planfile
from ddpscale.plan.site import squeue
from ddpscale.status import rows as status

HERE = "/work/bench"


def runs_of(topologies, repeats=1) -> list[tuple[str, int]]:
    return [(t, r) for t in topologies for r in range(repeats)]


def row_of(rows, topology, repeat=0) -> status.Row:
    return next(r for r in rows if (r.topology, r.repeat) == (topology, repeat))


# -- pure -------------------------------------------------------------------------------------

def test_squeue_lines_become_jobs_of_this_directory_by_run():
    text = "\n".join([
        f"101|RUNNING|None|rule_train_wildcards_1x2_0|{HERE}|1:05",
        f"102|PENDING|Resources|rule_multi_node_wildcards_2x1_1|{HERE}|0:00",
        "103|PENDING|Priority|rule_train_wildcards_1x1_0|/elsewhere|0:00",     # another checkout
        f"104|COMPLETED|None|rule_baseline_wildcards_1x1_0|{HERE}|0:12",       # ended: files decide
        f"105|RUNNING|None|rule_probe_wildcards_1x2|{HERE}|0:03",              # not a training run
        f"106|PENDING|JobHeldUser|rule_train_single_node_wildcards_1x2_0|{HERE}|0:00",  # a retry waits
        f"107|CONFIGURING|None|rule_single_node_wildcards_11x2_0|{HERE}|1-02:03:04",
        "garbage line",
    ])
    jobs = squeue.parse_squeue(text)
    assert [j.id for j in jobs] == ["101", "102", "103", "104", "105", "106", "107"]
    assert jobs[1].reason == "Resources" and jobs[0].elapsed_s == 65 and jobs[6].elapsed_s == 93784
    live = squeue.active_jobs(jobs, HERE)
    assert {run: job.id for run, job in live.items()} == {("1x2", 0): "101", ("2x1", 1): "102", ("11x2", 0): "107"}


@pytest.mark.parametrize("text,seconds", [("5", 5), ("0:00", 0), ("3:04", 184), ("2:03:04", 7384),
                                          ("1-02:03:04", 93784), ("INVALID", None), ("", None)])
def test_squeue_elapsed(text, seconds):
    assert squeue.parse_elapsed(text) == seconds


def test_every_state_and_its_figures():
    """The figures a user reads: throughput and efficiency against the baseline's mean per
    device, epoch k/N with elapsed and time left, SLURM's job and reason, a log's last line."""
    runs = {
        ("1x1", 0): status.Run({"throughput_samples_s": 100.0, "world_size": 1, "fit_time_s": 61.0}, "..."),
        ("1x1", 1): status.Run({"throughput_samples_s": 110.0, "world_size": 1, "fit_time_s": 59.0}, "..."),
        ("1x2", 0): status.Run({"throughput_samples_s": 189.0, "world_size": 2, "fit_time_s": 33.0}, "..."),
        # running: 2 of 5 epochs of 10 s, the last ended 4 s ago, 30 s into the fit
        ("1x2", 1): status.Run(None, "start\n" + progress_line(1, 5, 11, 150, 18, NOW - 16)
                               + "\n" + progress_line(2, 5, 10.0, 180.5, 30.0, NOW - 4) + "\nnoise\n"),
        ("2x1", 0): status.Run(None, "Traceback\n  ...\nRuntimeError: gloo timed out\n\n  \n"),
        # a job still ending after its metrics were written: done
        ("2x2", 0): status.Run({"throughput_samples_s": None, "world_size": 4}, ""),
    }
    jobs = {("2x1", 1): squeue.Job("77", "PENDING", "Resources", "c", HERE, 0.0),
            ("2x2", 0): squeue.Job("78", "COMPLETING", "None", "c", HERE, 50.0),
            ("2x2", 1): squeue.Job("79", "RUNNING", "None", "c", HERE, 3.0)}
    rows = status.rows(runs_of(["1x1", "1x2", "2x1", "2x2"], 2), "1x1", runs, jobs, {("1x2", 1)}, NOW)
    assert [(r.topology, r.repeat, r.state) for r in rows] == [
        ("1x1", 0, "done"), ("1x1", 1, "done"), ("1x2", 0, "done"), ("1x2", 1, "running"),
        ("2x1", 0, "failed"), ("2x1", 1, "queued"), ("2x2", 0, "done"), ("2x2", 1, "running")]
    # baseline mean 105 samples/s per device; 1x2: 189 / 2 = 94.5 per device -> 0.90
    assert row_of(rows, "1x1").detail == "100.0 samples/s, efficiency 0.95 vs 1x1, fit 1:01"
    assert row_of(rows, "1x2").detail == "189.0 samples/s, efficiency 0.90 vs 1x1, fit 0:33"
    # local: elapsed = fit 30 s + 4 s since the line; left = 3 epochs x 10 s - 4 s
    assert row_of(rows, "1x2", 1).detail == "epoch 2/5, elapsed 0:34, ~0:26 left, 180.5 samples/s last epoch"
    assert row_of(rows, "2x1").detail == "RuntimeError: gloo timed out"
    assert row_of(rows, "2x1", 1).detail == "SLURM job 77, reason Resources"
    assert row_of(rows, "2x2").detail == "throughput n/a (no steady epoch)"
    assert row_of(rows, "2x2", 1).detail == "SLURM job 79, starting, elapsed 0:03"


def test_running_on_slurm_takes_the_jobs_elapsed_and_ignores_an_earlier_attempts_line():
    log = progress_line(3, 10, 20.0, 50.0, 60.0, NOW - 30)
    job = squeue.Job("5", "RUNNING", "None", "c", HERE, 125.0)
    assert status.running_detail(log, job, NOW) == \
        "SLURM job 5, epoch 3/10, elapsed 2:05, ~1:50 left, 50.0 samples/s last epoch"
    # the line is older than the job: the retry's shell has not truncated the log yet
    retry = squeue.Job("6", "RUNNING", "None", "c", HERE, 5.0)
    assert status.running_detail(log, retry, NOW) == "SLURM job 6, starting, elapsed 0:05"
    # a run past its estimate shows no negative time
    assert "~0:00 left" in status.running_detail(progress_line(9, 10, 5.0, 1.0, 45.0, NOW - 60), None, NOW)


def test_efficiency_is_na_until_the_baseline_is_done_and_failed_logs_are_cut():
    runs = {("1x2", 0): status.Run({"throughput_samples_s": 200.0, "world_size": 2}, ""),
            ("1x1", 0): status.Run(None, "x" * 500 + "\n")}
    rows = status.rows(runs_of(["1x1", "1x2"]), "1x1", runs, {}, set(), NOW)
    assert row_of(rows, "1x2").detail == "200.0 samples/s, efficiency n/a (1x1 not done)"
    assert row_of(rows, "1x1").detail == "x" * 157 + "..."
    assert status.rows([("1x1", 0)], "1x1", {("1x1", 0): status.Run(None, "\n \n")}, {}, set(), NOW)[0].detail == \
        "(empty log: the job wrote nothing)"
    assert status.rows([("1x1", 0)], "1x1", {}, {}, set(), NOW) == [status.Row("1x1", 0, "not started")]


def test_table_is_aligned():
    rows = [status.Row("1x1", 0, "done", "a"), status.Row("12x4", 10, "not started"),
            status.Row("2x1", 1, "queued", "SLURM job 7, reason Resources")]
    lines = status.table(rows).splitlines()
    assert lines[0].split() == ["topology", "repeat", "state", "detail"]
    for column in ("repeat", "state", "detail"):
        at = lines[0].index(column)
        assert all(line[at - 2:at] == "  " and line[at] != " " for line in lines if len(line) > at), column
    assert lines[2] == "12x4      r10     not started"
    assert status.counts(rows) == "1 done, 0 running, 1 queued, 0 failed, 1 not started"


def test_lock_line():
    assert status.lock_line([], [], ["local"]) is None
    assert status.lock_line(["0.input.lock"], [4242], ["local"]) is None, "a live snakemake holds it"
    stale = status.lock_line(["0.input.lock", "0.output.lock"], [], ["local", "slurm"])
    assert "Stale Snakemake lock" in stale and "no snakemake runs" in stale and "\n" not in stale
    assert stale.endswith("fix with .venv/bin/snakemake --profile profiles/<name> --unlock (<name>: local, slurm)")
    assert "may be stale" in status.lock_line(["0.input.lock"], None, [])


def test_processes_are_told_apart_by_their_command_line():
    assert status.is_snakemake(["/x/.venv/bin/python3", "/x/.venv/bin/snakemake", "--profile", "profiles/local"])
    assert status.is_snakemake(["python", "-m", "snakemake", "--profile", "profiles/slurm", "scaling"])
    assert not status.is_snakemake(["python", "-m", "pytest", "tests/test_snakemake_lock.py"])
    # a job the main snakemake spawned (a SLURM job's, on a node that is this host): no lock
    assert not status.is_snakemake(["/x/python3", "-m", "snakemake", "--snakefile", "/x/workflow/Snakefile",
                                    "--target-jobs", "train_single_node:topology=1x2,repeat=0", "--mode", "remote"])
    runs = [("1x1", 0), ("1x2", 0), ("11x2", 0), ("1x2", 1)]
    shell = ["/bin/bash", "-c", "python scripts/train.py --nodes 1 --metrics results/runs/1x2/r0/metrics.json "
             "> results/logs/train/1x2/r0.log 2>&1"]
    assert status.run_named(shell, runs) == {("1x2", 0)}
    assert status.run_named(["srun", "python", "scripts/train.py", "--metrics",
                             "/abs/results/runs/11x2/r0/metrics.json"], runs) == {("11x2", 0)}
    # the workflow's ranks: their settings in the run's args file
    assert status.run_named(["python", "scripts/train.py", "--args-file=results/x/args/train/1x2/r1.json",
                             "--args-digest=ab"], runs) == {("1x2", 1)}


def test_live_processes_and_the_fallback_without_proc():
    wanted = [("1x1", 0), ("1x2", 0), ("2x1", 0)]
    runs = {("1x1", 0): status.Run(None, "log"), ("1x2", 0): status.Run(None, "log")}
    procs = [(10, ["/v/python3", "/v/snakemake", "--profile", "profiles/local"]),
             (11, ["/bin/bash", "-c", "python scripts/train.py --metrics results/runs/1x1/r0/metrics.json"])]
    assert status.live_here(procs, wanted, runs, locked=True) == ([10], {("1x1", 0)})
    assert status.live_here([], wanted, runs, locked=True) == ([], set())
    # no /proc: a held lock says snakemake may run, so may every run with a log
    assert status.live_here(None, wanted, runs, locked=True) == (None, {("1x1", 0), ("1x2", 0)})
    assert status.live_here(None, wanted, runs, locked=False) == (None, set())


def test_render_says_where_the_state_came_from():
    rows = [status.Row("1x1", 0, "done", "1.0 samples/s")]
    text = status.render(NOW, HERE, "experiment x: ...", rows, [10, 12], 3, "squeue", "Stale ...")
    lines = text.splitlines()
    assert lines[0].startswith("ddpscale status ") and lines[0].endswith(f" in {HERE}")
    assert lines[1] == "experiment x: ..."
    assert lines[2] == "snakemake: running here (pid 10, 12); SLURM: 3 queued or running job(s) of this directory"
    assert lines[-2:] == ["1 done, 0 running, 0 queued, 0 failed, 0 not started", "Stale ..."]
    assert status.render(NOW, HERE, "e", rows, None, None, "no squeue here", None).splitlines()[2] == \
        "snakemake: cannot tell (no /proc); SLURM: no squeue here, local runs only"


def test_overlays_merge_nested_keys_as_snakemake_does():
    """The experiment's folder comes from model.class_path: an overlay of init_args keeps it."""
    base = {"model": {"class_path": "pkg.mod.Net", "init_args": {"width": 8}}, "repeats": 1}
    merged = status.merge_configs(base, [{"model": {"init_args": {"width": 16}}}])
    assert merged["model"] == {"class_path": "pkg.mod.Net", "init_args": {"width": 16}}
    assert base["model"]["init_args"] == {"width": 8}, "the base config is left as it was"


def test_overlays_replace_top_level_keys():
    merged = status.merge_configs({"topologies": ["1x1", "1x2"], "repeats": 1, "baseline": "1x1"},
                                  [{"topologies": ["1 x 1", "2x2"]}, {"repeats": 3}])
    assert status.plan(merged) == (["1x1", "2x2"], 3, "1x1")


# -- the command on a results tree ------------------------------------------------------------


def test_command_reads_config_overlay_and_results(tmp_path):
    write_tree(tmp_path, lock=True)
    done = run_status(tmp_path, "--configfile", "config/more.yaml", "--results", "out")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    print(out)
    lines = {tuple(line.split()[:2]): line for line in out.splitlines() if re.match(r"^\d+x\d+ ", line)}
    assert re.search(r"^1x1 +r0 +done +100\.0 samples/s, efficiency 0\.95 vs 1x1, fit 0:12$", out, re.M)
    assert re.search(r"^1x2 +r0 +done +189\.0 samples/s, efficiency 0\.90 vs 1x1", out, re.M)
    assert lines[("1x2", "r1")].split()[2:] == ["not", "started"]
    assert re.search(r"^2x1 +r0 +failed +RuntimeError: rank 1 exited with signal 9$", out, re.M)
    assert len(lines) == 6, "3 topologies x 2 repeats (the overlay's)"
    assert "3 done, 0 running, 0 queued, 1 failed, 2 not started" in out
    assert "snakemake: not running here" in out
    # the test cluster may be up (the SLURM tests of this session): none of its jobs is this directory's
    assert re.search(r"^snakemake: not running here; SLURM: (0 queued or running job\(s\) of this directory|"
                     r".*, local runs only)$", out, re.M), out
    assert out.strip().splitlines()[-1] == (
        "Stale Snakemake lock: .snakemake/locks/ holds 1 file(s) but no snakemake runs in this directory (it "
        "was killed), so a rerun stops with 'Directory cannot be locked': fix with .venv/bin/snakemake "
        "--profile profiles/<name> --unlock (<name>: local)")

    (tmp_path / ".snakemake/locks/0.input.lock").unlink()
    assert "lock" not in run_status(tmp_path, "--configfile", "config/more.yaml", "--results", "out").stdout


def test_command_follows_the_experiment_of_its_config(tmp_path):
    """Two experiments side by side: each config's status shows its own runs, never the other's."""
    (tmp_path / "config").mkdir()
    (tmp_path / "config/config.yaml").write_text(yaml.safe_dump(
        {"topologies": ["1x1", "1x2"], "baseline": "1x1", "model": {"class_path": "pkg.mod.SpiralNet"}}))
    (tmp_path / "config/other.yaml").write_text(yaml.safe_dump({"experiment": "other", "topologies": ["1x1"]}))
    for folder, throughput in [("spiralnet", 100.0), ("other", 555.0)]:
        path = tmp_path / f"results/{folder}/runs/1x1/r0/metrics.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(make_run(throughput_samples_s=throughput, fit_time_s=3.0)))
    default = run_status(tmp_path)
    assert default.returncode == 0, default.stderr
    assert re.search(r"^1x1 +r0 +done +100\.0 samples/s", default.stdout, re.M) and "555.0" not in default.stdout
    assert re.search(r"^1x2 +r0 +not started", default.stdout, re.M)
    other = run_status(tmp_path, "--configfile", "config/other.yaml")
    assert re.search(r"^1x1 +r0 +done +555\.0 samples/s", other.stdout, re.M) and "1x2" not in other.stdout


def test_command_without_a_config_says_so_in_one_line(tmp_path):
    done = run_status(tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("ddpscale status: ") and "config/config.yaml" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_command_never_imports_torch(tmp_path):
    """It runs on a login node while jobs train: no torch, Lightning or pandas (seconds each)."""
    write_tree(tmp_path, lock=False)
    done = subprocess.run([sys.executable, "-X", "importtime", str(STATUS), "--results", "out"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "1x1  " in done.stdout
    imported = {line.split("|")[-1].strip().split(".")[0] for line in done.stderr.splitlines()
                if line.startswith("import time:")}
    assert "ddpscale" in imported and "yaml" in imported, "importtime lists the modules"
    assert not imported & {"torch", "lightning", "pytorch_lightning", "pandas", "numpy", "matplotlib"}


def test_auto_repeats_are_the_ones_the_workflow_resolved_for_its_site():
    config = {"topologies": ["1x1", "1x2"], "repeats": "auto", "measure": "auto"}
    assert status.plan(config, {"measure": "throughput", "repeats": 3})[1] == 3  # a cluster's run
    assert status.plan(config)[1] == 1  # nothing ran yet, the site unknown: one
    assert status.plan({**config, "measure": "throughput"})[1] == 3
    assert status.plan({**config, "repeats": 2}, {"repeats": 3})[1] == 2  # a number is the number


@pytest.mark.parametrize("content, why", [
    ('{"throughput_samples_s": 100.0, "wor', "not valid JSON"),  # cut short
    ("[1, 2]", "expected a JSON object"),
    (json.dumps({k: v for k, v in make_run("1x2").items() if k != "fit_time_s"}), "missing required key"),
    (json.dumps(make_run("1x2", world_size="two")), "world_size is text, not integer"),
], ids=["cut short", "a list", "a key missing", "a wrong kind"])
def test_an_unreadable_record_is_said_to_rerun_not_done(tmp_path, content, why):
    """What the workflow sets aside and retrains (runplan.set_aside_unreadable), status says so."""
    write_tree(tmp_path, lock=False)
    (tmp_path / "out/runs/1x2/r0/metrics.json").write_text(content)
    out = run_status(tmp_path, "--results", "out").stdout
    line = next(line for line in out.splitlines() if line.startswith("1x2 "))
    assert re.match(r"^1x2 +r0 +unreadable +metrics\.json unreadable: will rerun \(", line), out
    assert why in line and "done" not in line
    assert "1 unreadable" in out


@pytest.mark.parametrize("resolved", [{"repeats": -1}, {"repeats": 10**30}, {"repeats": 0}, {"repeats": True},
                                      {"repeats": "3"}, {"repeats": [3]}, [3], "3", None])
def test_a_plan_json_of_another_shape_counts_as_none(resolved):
    """plan.json is rewritten at the next run: one that is not what it writes is as good as none,
    never an empty table, a status that does not end or an OverflowError."""
    config = {"topologies": ["1x1"], "repeats": "auto", "measure": "auto"}
    assert status.plan(config, resolved) == (["1x1"], 1, "1x1")


@pytest.mark.parametrize("repeats", [-1, 0, 10**30, 1.5, True, "many"])
def test_repeats_out_of_the_schema_s_bounds_is_one_line_naming_the_fix(tmp_path, repeats):
    (tmp_path / "config").mkdir()
    (tmp_path / "config/config.yaml").write_text(yaml.safe_dump({"topologies": ["1x1"], "repeats": repeats}))
    done = run_status(tmp_path)
    assert done.returncode == 2 and done.stdout == "", done.stdout
    assert done.stderr == (f"ddpscale status: repeats is {repeats!r} in the config; set it to a whole number from "
                           "1 to 1000, or auto\n")


def test_status_bounds_repeats_as_the_config_schema_does():
    from ddpscale.run.measuremode import MAX_REPEATS

    schema = yaml.safe_load((ROOT / "workflow/schemas/config.schema.yaml").read_text())
    assert (schema["properties"]["repeats"]["minimum"], schema["properties"]["repeats"]["maximum"]) == (1, MAX_REPEATS)


def test_nothing_status_prints_carries_a_control_character(tmp_path):
    """A log line with terminal escape sequences (clear the screen, colour) and carriage returns
    is shown escaped: it cannot act on the terminal of whoever runs make status."""
    write_tree(tmp_path, lock=False)
    (tmp_path / "out/logs/train/2x1/r0.log").write_text(
        "epoch 1\r\x1b[2J\x1b[31mRuntimeError: boom\x1b[0m \x9b31m\n")
    out = run_status(tmp_path, "--results", "out").stdout
    assert re.search(r"^2x1 +r0 +failed +\\x1b\[2J\\x1b\[31mRuntimeError: boom\\x1b\[0m \\x9b31m$", out, re.M), out
    assert not re.search(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]", out), "a control character other than newline"
    row = status.Row("1x1", 0, "failed", "a\rb\x1b]0;title\x07")
    assert status.table([row]).splitlines()[1].endswith(r"a\rb\x1b]0;title\x07")


# -- what the workflow planned (plan.json) ------------------------------------------------------

def write_plan(results, topologies, repeats=1, experiment="spiralmlp", measure="full", baseline="1x1") -> dict:
    """plan.json as the workflow writes it (RunPlan.record) for these topologies."""
    from ddpscale.run.topology import parse_topology, stage_topologies

    data = planfile.written(experiment, measure, baseline,
                            stage_topologies(sorted(map(parse_topology, topologies)), baseline), repeats)
    results.mkdir(parents=True, exist_ok=True)
    write_json_atomic(results / "plan.json", data)  # as common.smk's write_plan: its keys sorted
    return data


def spiral_tree(root, topologies=("1x1", "1x2", "2x1")) -> None:
    """config/config.yaml of the spiral (experiment spiralmlp) and 1x1's finished repeat 0."""
    (root / "config").mkdir()
    (root / "config/config.yaml").write_text(yaml.safe_dump(
        {"topologies": list(topologies), "baseline": "1x1", "repeats": 1,
         "model": {"class_path": "pkg.mod.SpiralMLP"}}))
    path = root / "results/spiralmlp/runs/1x1/r0/metrics.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(make_run(throughput_samples_s=100.0, fit_time_s=3.0)))


def table_runs(out: str) -> list[tuple[str, str]]:
    return [tuple(line.split()[:2]) for line in out.splitlines() if re.match(r"^\d+x\d+ ", line)]


def test_the_plan_the_workflow_writes_reads_back():
    data = planfile.written("spiralmlp", "throughput", "1x1",
                            {"baseline": ["1x1"], "single_node": ["1x2", "1x4"], "multi_node": ["2x2"]}, 3)
    assert data["version"] == planfile.VERSION and data["experiment"] == "spiralmlp"
    planned, why = planfile.parse(json.loads(json.dumps(data)), "spiralmlp")
    assert why is None and planned.record() == data
    assert planned.runs() == [(t, r) for t in ("1x1", "1x2", "1x4", "2x2") for r in range(3)]
    assert planned.summary() == "measure throughput, 4 topologies, 3 repeats each"
    assert planfile.parse(data, "other") == (None, "is the plan of experiment spiralmlp, not of other")


def changed(data: dict, path: tuple, value) -> dict:
    data = json.loads(json.dumps(data))
    *head, last = path
    inner = data
    for key in head:
        inner = inner[key]
    if value is KeyError:
        del inner[last]
    else:
        inner[last] = value
    return data


PLAN = planfile.written("spiralmlp", "full", "1x1", {"baseline": ["1x1"], "single_node": ["1x2"], "multi_node": []}, 1)


@pytest.mark.parametrize("path, value", [
    (("version",), 2), (("version",), True), (("version",), KeyError), (("experiment",), "../up"),
    (("experiment",), 7), (("measure",), "auto"), (("baseline",), "1x2"), (("baseline",), "01x1"),
    (("stages", "multi_node"), KeyError), (("stages", "extra"), {"topologies": [], "repeats": 1}),
    (("stages", "single_node", "topologies"), ["1x1"]),  # twice, and not of its stage
    (("stages", "single_node", "topologies"), ["2x1"]),  # another stage's
    (("stages", "single_node", "topologies"), ["1" * 5000 + "x1"]),
    (("stages", "single_node", "repeats"), 0), (("stages", "single_node", "repeats"), 10**30),
    (("stages", "single_node", "repeats"), 1.0), (("stages", "single_node", "repeats"), "1"),
    (("stages", "baseline", "topologies"), []), (("extra",), 1),
])
def test_a_versioned_plan_of_another_shape_counts_as_none(path, value):
    planned, why = planfile.parse(changed(PLAN, path, value), "spiralmlp")
    assert planned is None and why and "\n" not in why


def test_command_shows_what_the_workflow_planned_and_names_the_experiment(tmp_path):
    """The run was started with overrides (here: two topologies, two repeats): status lists what
    it planned, not what config/config.yaml says, and which experiment that is."""
    spiral_tree(tmp_path)
    write_plan(tmp_path / "results/spiralmlp", ["1x1", "1x2"], repeats=2)
    done = run_status(tmp_path)
    assert done.returncode == 0, done.stderr
    assert table_runs(done.stdout) == [("1x1", "r0"), ("1x1", "r1"), ("1x2", "r0"), ("1x2", "r1")]
    assert done.stdout.splitlines()[1] == ("experiment spiralmlp: as its workflow planned it "
                                           "(results/spiralmlp/plan.json): measure full, 2 topologies, 2 repeats each")
    assert re.search(r"^1x1 +r0 +done +100\.0 samples/s", done.stdout, re.MULTILINE)


def test_command_before_any_run_says_so_and_shows_the_config(tmp_path):
    spiral_tree(tmp_path)
    write_plan(tmp_path / "results/other", ["1x1"], experiment="other")
    done = run_status(tmp_path)
    assert done.returncode == 0, done.stderr
    assert table_runs(done.stdout) == [("1x1", "r0"), ("1x2", "r0"), ("2x1", "r0")]
    assert done.stdout.splitlines()[1] == (
        "experiment spiralmlp: not planned yet: no results/spiralmlp/plan.json (the workflow writes it when its "
        "jobs start); showing the config's runs as given here; planned here: other (pick one with --config "
        "experiment=NAME)")


def test_command_takes_config_key_value_as_snakemake_does(tmp_path):
    """--config KEY=VALUE picks the experiment (and so its plan), as the run was started with."""
    spiral_tree(tmp_path)
    write_plan(tmp_path / "results/other", ["1x1", "2x1"], experiment="other")
    done = run_status(tmp_path, "--config", "experiment=other", "repeats=1")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[1].startswith("experiment other: as its workflow planned it")
    assert table_runs(done.stdout) == [("1x1", "r0"), ("2x1", "r0")]
    # before that run: the override applies to the config's runs
    unplanned = run_status(tmp_path, "-C", "experiment=new", "topologies=[1x1, 1x2]")
    assert unplanned.stdout.splitlines()[1].startswith("experiment new: not planned yet: no results/new/plan.json")
    assert table_runs(unplanned.stdout) == [("1x1", "r0"), ("1x2", "r0")]
    # a file where a key=value belongs: one line naming the flag that takes one
    wrong = run_status(tmp_path, "--config", "config/config.yaml")
    assert wrong.returncode == 2 and wrong.stdout == ""
    assert wrong.stderr == ("ddpscale status: --config 'config/config.yaml': --config takes KEY=VALUE, as snakemake's; "
                            "a config file goes with --configfile FILE\n")


def test_command_takes_several_configfiles_as_snakemake_does(tmp_path):
    spiral_tree(tmp_path)
    (tmp_path / "a.yaml").write_text(yaml.safe_dump({"experiment": "a", "topologies": ["1x1", "1x2"]}))
    (tmp_path / "b.yaml").write_text(yaml.safe_dump({"experiment": "b"}))
    done = run_status(tmp_path, "--configfile", "a.yaml", "b.yaml")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[1].startswith("experiment b: not planned yet")
    assert table_runs(done.stdout) == [("1x1", "r0"), ("1x2", "r0")]


@pytest.mark.parametrize("entries", [
    ["experiment=foo", "repeats=3", "measure=full", "seed=1.5", "flag=True", "empty="],
    ["topologies=[1x1, 2x2]", "model={class_path: a.B}", "quoted='x y'", "accuracy={tolerance: 0.1}"],
    ["nested={a: {b: 1}}", "nested={a: {c: 2}}", "dashed-key=1e3"],
])
def test_config_overrides_read_as_snakemake_reads_them(entries):
    from ddpscale.status.sources import parse_overrides
    from snakemake.cli import parse_config

    assert parse_overrides(entries) == parse_config(entries)


def hostile(kind, path, tmp_path) -> None:
    if kind == "a FIFO":
        os.mkfifo(path)
    elif kind == "a directory":
        path.mkdir()
    elif kind == "a link out of results":
        outside = tmp_path / "elsewhere.json"
        outside.write_text(json.dumps(PLAN))
        path.symlink_to(outside)
    elif kind == "huge":
        with open(path, "wb") as handle:
            handle.truncate(planfile.MAX_BYTES + 1)
    elif kind == "not UTF-8":
        path.write_bytes(b'{"version": 1, "experiment": "spiral\xff"}')
    elif kind == "nested deep":
        path.write_text("[" * 200_000 + "]" * 200_000)
    elif kind == "a 5000-digit number":
        path.write_text('{"version": ' + "9" * 5000 + "}")
    elif kind == "another experiment's":
        path.write_text(json.dumps(planfile.written("other", "full", "1x1", {"baseline": ["1x1"]}, 1)))


@pytest.mark.parametrize("kind, said", [
    ("a FIFO", "is a FIFO, not a regular file"), ("a directory", "is a directory, not a regular file"),
    ("a link out of results", "is a symbolic link, which the workflow never writes"),
    ("huge", f"holds {(1 << 20) + 1} bytes, more than a plan's {1 << 20}"),
    ("not UTF-8", "is not UTF-8 text (byte 36)"), ("nested deep", "is JSON nested too deep to read"),
    ("a 5000-digit number", "is not valid JSON (Exceeds the limit"),
    ("another experiment's", "is the plan of experiment other, not of spiralmlp"),
])
def test_a_hostile_plan_json_is_one_line_and_the_config_s_runs(tmp_path, kind, said):
    spiral_tree(tmp_path)
    path = tmp_path / "results/spiralmlp/plan.json"
    hostile(kind, path, tmp_path)
    done = run_status(tmp_path)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    line = done.stdout.splitlines()[1]
    assert line.startswith(f"experiment spiralmlp: not planned yet: results/spiralmlp/plan.json {said}"), line
    assert "as good as none (the next run rewrites it); showing the config's runs as given here" in line
    assert table_runs(done.stdout) == [("1x1", "r0"), ("1x2", "r0"), ("2x1", "r0")]


@pytest.mark.parametrize("kind", ["a FIFO", "a directory", "a link out of results", "huge", "not UTF-8",
                                  "nested deep", "a 5000-digit number", "another experiment's"])
def test_the_workflow_writes_its_plan_over_whatever_lies_there_or_names_it(tmp_path, kind):
    """The workflow's writer (common.smk's onstart) never raises: it replaces what one rename
    replaces, leaving a link's target untouched, and names a directory in one line; the run goes on."""
    path = tmp_path / "results/spiralmlp/plan.json"
    path.parent.mkdir(parents=True)
    hostile(kind, path, tmp_path)
    outside = (tmp_path / "elsewhere.json").read_text() if kind == "a link out of results" else None
    problem = planfile.write(path, PLAN)
    if kind == "a directory":
        assert problem == f"{path} is a directory, not the plan: move it away, and the next run writes the plan"
        return
    assert problem is None and not path.is_symlink() and json.loads(path.read_text()) == PLAN
    if outside is not None:
        assert (tmp_path / "elsewhere.json").read_text() == outside
    before = path.stat().st_mtime_ns
    assert planfile.write(path, PLAN) is None and path.stat().st_mtime_ns == before, "rewritten for nothing"


def test_a_plan_that_cannot_be_written_is_one_line(tmp_path):
    """A file where the experiment's folder should be: the plan is named in one line, never raised."""
    (tmp_path / "results").write_text("not a folder")
    path = tmp_path / "results/spiralmlp/plan.json"
    problem = planfile.write(path, PLAN)
    assert problem is not None and problem.startswith(f"{path} cannot be written ("), problem
    assert "\n" not in problem
