"""A dropped SSH session leaves a training job running; the next snakemake must not submit a
second job of the same run into the same checkpoint. On the test cluster."""

from __future__ import annotations

import subprocess

import pytest

from helpers.slurm import run_slurm, slurm_workspace, squeue_jobs, squeue_state, wait_for_state
from helpers.workflow import tiny_config

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.timeout(600)]


def test_a_live_job_of_the_same_run_stops_the_next_snakemake_before_it_submits(slurm_cluster, workspace):
    slurm_workspace(workspace).write_config(tiny_config(topologies=["1x1", "1x2"]))
    # what an earlier snakemake left: a running job with the plugin's comment for 1x2 repeat 0,
    # in this directory (a sleep stands in for its training)
    earlier = subprocess.run(
        ["sbatch", "--parsable", "--comment=rule_train_single_node_wildcards_1x2_0", f"--chdir={workspace.path}",
         "--partition=debug", "--time=10", "--wrap=sleep 600"],
        capture_output=True, text=True, check=True).stdout.strip().split(";")[0]
    try:
        wait_for_state(earlier, "RUNNING")
        code, log = run_slurm(workspace)
        assert code != 0
        assert (f"SLURM job {earlier} (RUNNING), submitted by an earlier snakemake, still trains 1x2 repeat 0 "
                f"of this directory") in log, log[-3000:]
        assert f"scancel {earlier}" in log
        # nothing was submitted for 1x2, and the earlier job was left alone
        assert not workspace.metrics("1x2").exists()
        assert [j for j, _, comment in squeue_jobs(workspace.path) if comment.endswith("_wildcards_1x2_0") and j != earlier] == []
        assert squeue_state(earlier) == "RUNNING"
    finally:
        subprocess.run(["scancel", earlier], check=False)
