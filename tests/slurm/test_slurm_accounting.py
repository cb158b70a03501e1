"""The executor plugin's status path through accounting (slurm-status-command: sacct), as on the
sites: the test cluster runs slurmdbd (tests/slurm/accounting.sh). A finished job, a failed
one (its reason reaches Snakemake's output and `make status`) and a node failure (NODE_FAIL,
with the node named, never requeued by SLURM, retried by Snakemake) are each read back from sacct.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess

import psutil
import pytest

from helpers.profiles import load_profile
from helpers.slurm import (
    SUBMITTED, job_fields, paced, run_slurm, running_train_job, sacct_job, slurm_workspace, training_processes,
)
from helpers.status import status_of
from helpers.workflow import tiny_config

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


def test_a_node_failure_is_node_fail_never_requeued_and_the_retry_resumes(slurm_cluster, workspace):
    """The node under a running 2-rank job is set DOWN once the job has a checkpoint (as slurmctld
    does to a node that stops answering). The cluster requeues batch jobs (JobRequeue=1, SLURM's
    default) but the profile says slurm-no-requeue: SLURM ends the job as NODE_FAIL and never
    restarts it, the plugin reads that from sacct, names the node and excludes it, and the
    profile's retries submit the run again, which resumes from the checkpoint on another node.
    At no time do two jobs train the run (one checkpoint, one writer)."""
    slurm_workspace(workspace, retries=load_profile("slurm")["retries"])
    # paced (helpers.slurm.paced): epochs of about 11 s of sleep, so the job is seen running after its
    # first checkpoint whatever else the machine runs; its retry trains unpaced
    config = tiny_config(topologies=["1x2"], baseline="1x2", max_epochs=NODE_FAIL_EPOCHS, measure="full")
    pace = paced(workspace, config)
    workspace.write_config(config)
    checkpoint = workspace.results / "checkpoints/1x2/r0/last.ckpt"
    downed, training_jobs = [], []

    def down_its_node_and_watch():
        # the SLURM jobs whose processes train the run right now
        training_jobs.append(jobs_training(workspace.path, "1x2"))
        job_id = running_train_job("1x2")
        if downed or job_id is None or not checkpoint.exists():
            return False
        # squeue, not sacct: accounting learns the node a moment after the job starts
        node = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%N"], capture_output=True,
                              text=True).stdout.strip()
        if node:
            subprocess.run(["scontrol", "update", f"NodeName={node}", "State=DOWN",
                            "Reason=ddpscale test: node failure"], check=True)
            downed.append((job_id, node))
            pace.unlink()
        return False

    try:
        code, log = run_slurm(workspace, timeout=420, during=down_its_node_and_watch)
    finally:
        for job_id, node in downed:   # ReturnToService=2 usually brings it back on its own
            subprocess.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"], capture_output=True)
            # A real node that fails takes its processes with it; this one is the host, and the
            # lost job's own snakemake (the plugin's job step) outlives it here.
            for proc in job_processes(job_id):
                with contextlib.suppress(psutil.Error):
                    proc.kill()
    assert downed, "the 1x2 job was never seen running after its first checkpoint"
    job_id, node = downed[0]
    assert code == 0, log[-4000:]
    submitted = SUBMITTED.findall(log)
    assert submitted[0] == job_id and len(submitted) == 2, submitted
    job = sacct_job(job_id)
    print(f"\nsacct after the node went down: {job}")
    assert (job["State"], job["NodeList"]) == ("NODE_FAIL", node)
    assert f"SLURM-job '{job_id}' failed due to a node failure, SLURM status is: 'NODE_FAIL'" in log, log[-3000:]
    # never requeued: accounting holds one record of the job (a requeue adds one per start), and
    # the controller counts no restart
    records = subprocess.run(["sacct", "-D", "-X", "-n", "-P", "-j", job_id, "-o", "JobID,State"],
                             capture_output=True, text=True, check=True).stdout.split()
    assert records == [f"{job_id}|NODE_FAIL"], records
    assert job_fields(job_id)["Restarts"] == "0"
    assert sacct_job(submitted[1])["NodeList"] != node, "the plugin excludes the failed node"
    assert max(len(jobs) for jobs in training_jobs) == 1, "two jobs trained the run at once"
    metrics = json.loads(workspace.metrics("1x2").read_text())
    assert metrics["slurm_job_id"] == submitted[1] and metrics["attempts"] == 2
    assert metrics["resumed_from_epoch"] >= 1 and len(metrics["epoch_times_s"]) == NODE_FAIL_EPOCHS
    assert (workspace.results / "report/report.html").exists(), "one snakemake call, to the report"


NODE_FAIL_EPOCHS = 4


def job_processes(job_id: str) -> list[psutil.Process]:
    """Every process on this host that runs inside SLURM job `job_id` (by its environment)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("SLURM_JOB_ID") == job_id:
                found.append(proc)
        except psutil.Error:
            continue  # ended, or a kernel thread
    return found


def jobs_training(workdir, topology: str) -> set[str]:
    """The SLURM job ids of the processes that train `topology` in workdir (launcher and ranks)."""
    found = set()
    for proc in training_processes(workdir, topology):
        try:
            found.add(proc.environ().get("SLURM_JOB_ID"))
        except psutil.Error:
            continue  # ended between the listing and the read
    return found - {None}
