"""The SLURM side for real: a throwaway multi-node cluster (tests/slurm/minicluster.sh), real
sbatch and srun, `snakemake --executor slurm` through the same rules and resource mapping as
the cluster profiles. Run alone with `pytest -m slurm`. Resuming after a time limit, a signal
or a killed rank: tests/slurm/test_slurm_resume.py.
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from helpers.profiles import load_profile
from helpers.slurm import SUBMITTED, job_fields, run_slurm, slurm_workspace, squeue_jobs
from helpers.workflow import tiny_config
from helpers.configs import rule

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.timeout(600)]


def test_test_profile_differs_from_the_generic_one_only_in_site_facts():
    generic, test = load_profile("slurm"), load_profile("tests/slurm/profile")
    # status through accounting on both: the test cluster has slurmdbd, as sites do
    site_keys = {"jobs", "latency-wait", "slurm-init-seconds-before-status-checks", "default-resources"}
    assert generic["slurm-status-command"] == test["slurm-status-command"] == "sacct"
    assert {k: v for k, v in generic.items() if k not in site_keys | {"set-resources"}} == \
           {k: v for k, v in test.items() if k not in site_keys | {"set-resources"}}
    # site facts in one entry, `train`; per-stage entries beside it (the test cluster sets its own)
    assert set(generic["set-resources"]) == {"train", "train_baseline"}
    assert set(test["set-resources"]) == {"train", "train_baseline", "train_multi_node"}
    # the generic profile leaves site_env commented out; the test cluster names its fabric's interface
    assert set(test["set-resources"]["train"]) - set(generic["set-resources"]["train"]) == {"site_env"}
    assert set(generic["set-resources"]["train"]) <= set(test["set-resources"]["train"])
    assert test["set-resources"]["train"]["site_launcher"] == generic["set-resources"]["train"]["site_launcher"] == "srun"


def test_whole_workflow_on_the_cluster(slurm_cluster, workspace):
    # a cluster profile measures throughput (measure: auto); windows of 2 steps, looks from 5
    # windows on and a precision any settled windows reach, so each run stops after a look at a
    # step we know, within a few epochs of 14 steps (20 configured)
    throughput = {"precision": 0.9, "window_steps": 2, "min_windows": 5, "max_steps": 2000, "max_minutes": 10}
    slurm_workspace(workspace).write_config(tiny_config(topologies=["1x1", "1x2", "2x1", "2x2"],
                                                        throughput=throughput, max_epochs=20))
    start = time.monotonic()
    code, log = run_slurm(workspace)
    print(f"\nworkflow with 4 topologies through SLURM: {time.monotonic() - start:.1f} s")
    assert code == 0, log[-4000:]
    submitted = SUBMITTED.findall(log)
    assert len(submitted) == 4, "one SLURM job per topology and repeat (the probe inside it); data and report run locally"
    expected = {"1x1": [0], "1x2": [0, 0], "2x1": [0, 1], "2x2": [0, 0, 1, 1]}
    # every stage ran, each with its profile entry's time limit (tests/slurm/profile)
    stages = {"1x1": ("train_baseline", "00:10:00"), "1x2": ("train_single_node", "00:05:00"),
              "2x1": ("train_multi_node", "00:07:00"), "2x2": ("train_multi_node", "00:07:00")}
    comments = {job_id: comment for job_id, _, comment in squeue_jobs()}
    job_ids = set()
    for topology, node_ranks in expected.items():
        metrics = json.loads(workspace.metrics(topology).read_text())
        # the world that formed, not the exit code: a multi-node job wrapped in `srun -n1`
        # would train on one rank and still "succeed"
        assert metrics["world_size"] == len(node_ranks)
        assert metrics["node_ranks"] == node_ranks
        assert metrics["slurm_job_id"] in submitted
        job_ids.add(metrics["slurm_job_id"])
        stage_rule, limit = stages[topology]
        assert comments[metrics["slurm_job_id"]] == f"rule_{stage_rule}_wildcards_{topology}_0"
        assert job_fields(metrics["slurm_job_id"])["TimeLimit"] == limit
        # the probe ran in the training job, before training: its all-reduce spans every rank
        probe = metrics["probe"]
        assert probe["world_size"] == len(node_ranks) and probe["node_ranks"] == node_ranks
        # each node is a host of its own on the nodes' network: ranks of 2 nodes crossed it,
        # gloo on ib0 (site_env), and the report does not call them simulated
        assert len(metrics["hosts"]) == len(set(node_ranks)), metrics["hosts"]
        assert set(metrics["hosts"]) <= {"n1", "n2", "n3", "n4"}, metrics["hosts"]
        if len(node_ranks) > 1:
            assert {rank["interface"] for rank in metrics["transport"]} == {"ib0"}, metrics["transport"]
        assert not metrics["simulated_nodes_on_one_host"]
        # held from the job's start (Slurm 22.05 sets no SLURM_JOB_START_TIME: scontrol's StartTime)
        assert metrics["held_from"] == "slurm job start" and metrics["held_s"] > metrics["fit_wall_s"]
        # throughput mode: every rank, on every node, stopped after the window the rule decided on
        windows_used = metrics["windows_warmup"] + metrics["windows_steady"]
        assert metrics["measure"] == "throughput" and metrics["stop_reason"] == "precision reached"
        assert rule(min_windows=5).looks_at(windows_used)
        assert metrics["stop_steps_by_rank"] == [2 * windows_used] * len(node_ranks)
        assert metrics["epochs_completed"] < 20 and metrics["throughput_from"] == "windows"
    assert len(job_ids) == 4
    assert (workspace.results / "report/report.html").exists()


def test_cancelled_run_is_the_only_one_resubmitted(slurm_cluster, workspace):
    slurm_workspace(workspace).write_config(tiny_config(topologies=["1x1", "1x2", "2x2"]))
    cancelled = []

    def cancel_2x2():
        for job_id, state, comment in squeue_jobs(workspace.path):
            if "_wildcards_2x2_" in comment and state in ("PENDING", "RUNNING"):
                subprocess.run(["scancel", job_id], check=True)
                cancelled.append(job_id)
                return True
        return False

    code, log = run_slurm(workspace, during=cancel_2x2)
    assert cancelled, "the 2x2 job was never seen in squeue"
    assert code != 0
    # sacct says "CANCELLED by 0"; plugin 2.8.0 alone would poll the job forever (pluginstates)
    assert f"SLURM-job '{cancelled[0]}' failed, SLURM status is: 'CANCELLED'" in log, log[-3000:]
    assert workspace.metrics("1x1").exists() and workspace.metrics("1x2").exists()
    assert not workspace.metrics("2x2").exists()

    code, log = run_slurm(workspace)
    assert code == 0, log[-4000:]
    assert len(SUBMITTED.findall(log)) == 1
    assert "topology=2x2" in log
    assert json.loads(workspace.metrics("2x2").read_text())["world_size"] == 4


def test_topology_the_cluster_cannot_satisfy_fails_fast(slurm_cluster, workspace):
    # A profile that claims 8 GPUs per node on 4-GPU nodes: our own check passes, SLURM refuses.
    slurm_workspace(workspace, site={"site_gpus_per_node": 8}).write_config(
        tiny_config(topologies=["1x1", "1x5"], batch={"scaling": "strong", "size": 60}))
    start = time.monotonic()
    code, log = run_slurm(workspace, timeout=240)
    assert code != 0
    assert time.monotonic() - start < 180, "a refused job must not be waited on"
    assert "topology=1x5" in log and "Requested node configuration is not available" in log
    assert workspace.metrics("1x1").exists(), "keep-going: the satisfiable run still finishes"


def test_cluster_run_without_site_facts_is_refused_before_submission(slurm_cluster, workspace):
    """--set-resources on the command line replaces the profile's, site facts included: the
    jobs would start every rank on one node. The run must stop before any sbatch."""
    slurm_workspace(workspace).write_config(tiny_config(topologies=["1x1", "1x2"]))
    code, log = run_slurm(workspace, "--set-resources", "train_baseline:runtime=5", timeout=120)
    assert code != 0
    assert "set-resources train has no site facts" in log and "repeat the profile's site_* entries" in log
    assert not SUBMITTED.findall(log)


def test_allocation_pins_tasks_per_node_and_jobs_get_their_own_port(slurm_cluster, workspace):
    """The allocation carries --ntasks-per-node, not only --ntasks
    (SLURM could place 7 + 1). sbatch exports the submitting shell's environment, so a
    MASTER_PORT / MASTER_ADDR set there reached every job; here two 2-rank runs train at once
    (1x1 and 1x2, two repeats: 6 of the cluster's 8 CPUs). All nodes of the test cluster are
    processes on this one host, so any two jobs share its ports as two jobs on one node of a
    real cluster do."""
    slurm_workspace(workspace).write_config(tiny_config(topologies=["1x1", "1x2"], repeats=2, max_epochs=6))
    inherited = {"MASTER_PORT": "29555", "MASTER_ADDR": "login-node.invalid"}
    code, log = run_slurm(workspace, "scaling", env=inherited)
    assert code == 0, log[-4000:]
    runs = {(t, r): json.loads(workspace.metrics(t, r).read_text()) for t in ("1x1", "1x2") for r in (0, 1)}
    for (topology, _), metrics in runs.items():
        job = job_fields(metrics["slurm_job_id"])
        nodes, per_node = topology.split("x")
        assert job["NtasksPerN:B:S:C"].split(":")[0] == per_node, job
        assert job["NumNodes"] == nodes
        # every rank's place: on CPU, no GPU is used
        places = metrics["placement"]
        assert [p["rank"] for p in places] == list(range(int(per_node))) and metrics["gpu_per_rank"] is False
        assert {p["device"] for p in places} == {"cpu"} and {p["gpu_uuid"] for p in places} == {None}
    for r in (0, 1):
        assert runs[("1x2", r)]["placement"][0]["master_addr"] != inherited["MASTER_ADDR"]
    ports = [runs[("1x2", r)]["placement"][0]["master_port"] for r in (0, 1)]
    assert inherited["MASTER_PORT"] not in ports and ports[0] != ports[1]
    # the two 1x2 runs trained at the same time, so a shared port would have failed one
    spans = [(job_fields(runs[("1x2", r)]["slurm_job_id"])["StartTime"],
              job_fields(runs[("1x2", r)]["slurm_job_id"])["EndTime"]) for r in (0, 1)]
    print(f"\n1x2 r0 and r1 ran {spans[0]} and {spans[1]} on ports {ports}")
    assert spans[0][0] < spans[1][1] and spans[1][0] < spans[0][1], "the two runs did not overlap"
