"""The executor plugin's status path through accounting (slurm-status-command: sacct), as on the
sites: the test cluster runs slurmdbd (tests/slurm/accounting.sh). A finished job, a failed
one (its reason reaches Snakemake's output and `make status`) and a node failure (NODE_FAIL,
with the node named) are each read back from sacct.
"""

from __future__ import annotations

import re
import subprocess

import pytest

from conftest import tiny_config
from slurmtools import SUBMITTED, run_slurm, running_train_job, sacct_job, slurm_workspace
from test_status_slurm import status_of

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.timeout(600)]


def test_a_finished_job_is_completed_in_accounting_under_the_profiles_account(slurm_cluster, workspace):
    slurm_workspace(workspace).write_config(tiny_config(topologies=["1x1"]))
    code, log = run_slurm(workspace, "scaling")
    assert code == 0, log[-4000:]
    [job_id] = SUBMITTED.findall(log)
    job = sacct_job(job_id)
    assert (job["State"], job["ExitCode"]) == ("COMPLETED", "0:0")
    assert (job["Account"], job["Partition"], job["QOS"]) == ("test_account", "debug", "normal")
    assert job["Comment"] == "rule_train_baseline_wildcards_1x1_0"


def test_a_failed_jobs_state_and_reason_reach_snakemake_and_make_status(slurm_cluster, workspace):
    """accelerator gpu on nodes whose GPUs are device files: the run stops at start (exit 3,
    naming torch's CUDA). With squeue the plugin could only say 'Detailed failure reason
    unavailable'."""
    slurm_workspace(workspace).write_config(tiny_config(topologies=["1x1"], accelerator="gpu"))
    code, log = run_slurm(workspace, "scaling")
    assert code != 0
    [job_id] = SUBMITTED.findall(log)
    job = sacct_job(job_id)
    assert job["State"] == "FAILED" and job["ExitCode"] != "0:0", job
    assert f"SLURM-job '{job_id}' failed, SLURM status is: 'FAILED'. Reason" in log, log[-3000:]
    assert "Detailed failure reason unavailable" not in log
    # the training log names the cause, and so does make status, which reads it
    train_log = (workspace.results / "logs/train/1x1/r0.log").read_text()
    assert "CUDA" in train_log, train_log[-2000:]
    status = status_of(workspace.path)
    print(f"\nstatus after the failed job:\n{status}")
    # make status shows the cause, not srun's "Exited with exit code 3" and "Terminating StepId"
    # lines after it (ddpscale.core.io.cause_line)
    assert re.search(r"^1x1 +r0 +failed +ddpscale train: accelerator gpu, but torch \S+ sees no CUDA device",
                     status, re.M), status


def test_a_node_failure_is_node_fail_and_the_plugin_names_it(slurm_cluster, workspace):
    """The node under a running 2-rank job is set DOWN (as slurmctld does to a node that stops
    answering): SLURM ends the job as NODE_FAIL (JobRequeue=0, so it is not requeued) and the
    plugin, reading sacct, reports a node failure and excludes the node from later jobs."""
    slurm_workspace(workspace, retries=0).write_config(tiny_config(topologies=["1x2"], baseline="1x2", max_epochs=200,
                                                                                 measure="full"))
    downed = []

    def down_its_node():
        job_id = running_train_job("1x2")
        if job_id is None:
            return False
        # squeue, not sacct: accounting learns the node a moment after the job starts
        node = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%N"], capture_output=True,
                              text=True).stdout.strip()
        if not node:
            return False
        subprocess.run(["scontrol", "update", f"NodeName={node}", "State=DOWN",
                        "Reason=ddpscale test: node failure"], check=True)
        downed.append((job_id, node))
        return True

    try:
        code, log = run_slurm(workspace, "scaling", timeout=300, during=down_its_node)
    finally:
        for _, node in downed:   # ReturnToService=2 usually brings it back on its own
            subprocess.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"], capture_output=True)
    assert downed, "the 1x2 job was never seen running"
    job_id, node = downed[0]
    assert code != 0
    job = sacct_job(job_id)
    print(f"\nsacct after the node went down: {job}")
    assert (job["State"], job["NodeList"]) == ("NODE_FAIL", node)
    assert f"SLURM-job '{job_id}' failed due to a node failure, SLURM status is: 'NODE_FAIL'" in log, log[-3000:]
