"""`make status` on the throwaway SLURM cluster, with one run queued, one running and one done
at the same moment. Every job is submitted held (sbatch --hold through site_slurm_extra) and
the test releases them in turn, so the three states do not depend on how fast this machine is:
1x1 is released and finishes, then 1x2 is released and sampled after its first epoch while 2x1
stays held (reason JobHeldUser). The status printed here goes in the release note."""

from __future__ import annotations

import json
import re
import subprocess

import pytest

from helpers.slurm import INTERRUPT, paced, run_slurm, slurm_workspace, squeue_state, wait_for_state
from helpers.status import status_of
from helpers.workflow import tiny_config
from ddpscale.core.io import cause_line
from ddpscale.core.record import last_progress
from ddpscale.plan.site import squeue
from ddpscale.status import rows as status

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.timeout(600)]

# 1x1 trains unpaced; 1x2 is paced (helpers.slurm.paced: about 5 s of sleep an epoch per rank), so
# after its first epoch 9 more keep it running for the seconds the sample takes, at no CPU.
EPOCHS = 10


def held_job(path, topology: str) -> str | None:
    """The pending training job of `topology` (any stage rule) submitted from `path`."""
    out = subprocess.run(["squeue", "-h", "-o", squeue.SQUEUE_FORMAT], capture_output=True, text=True).stdout
    for job in squeue.parse_squeue(out):
        if job.state == "PENDING" and job.workdir == str(path) and squeue.job_run(job.comment) == (topology, 0):
            return job.id
    return None


def test_status_while_one_run_is_queued_one_running_one_done(slurm_cluster, workspace):
    slurm_workspace(workspace, retries=0, site={"site_slurm_extra": "--hold"})
    config = tiny_config(topologies=["1x1", "1x2", "2x1"], max_epochs=EPOCHS, measure="full")
    pace = paced(workspace, config)
    pace.unlink()  # until 1x2 is released
    workspace.write_config(config)
    log_1x2 = workspace.results / "logs/train/1x2/r0.log"
    released, seen = {}, []

    def release(topology: str) -> None:
        job_id = held_job(workspace.path, topology)
        if job_id is not None:
            subprocess.run(["scontrol", "release", job_id], check=True)
            released[topology] = job_id

    def drive():
        if "1x1" not in released:
            release("1x1")
        elif "1x2" not in released and workspace.metrics("1x1").exists():
            pace.touch()
            release("1x2")
        elif "1x2" in released and log_1x2.exists() and last_progress(log_1x2.read_text()):
            queued = held_job(workspace.path, "2x1")
            seen.extend([status_of(workspace.path), queued])
            # sampled: end the other two runs rather than wait for them. The held job is left to
            # snakemake's Ctrl-C: held, it has no eligible time, and sacct's time window (the
            # plugin's status query) never lists a job cancelled then (docs/clusters.md)
            subprocess.run(["scancel", released["1x2"]], check=True)
            return INTERRUPT
        return False

    code, log = run_slurm(workspace, "scaling", timeout=480, during=drive)
    assert seen, f"1x2 never trained an epoch while 2x1 was held:\n{log[-3000:]}"
    live, queued_id = seen
    print(f"\nstatus with one run queued, one running, one done:\n{live}")
    assert code != 0, "two runs were cancelled"
    assert queued_id is not None, "2x1 was not held when sampled"

    metrics = json.loads(workspace.metrics("1x1").read_text())
    assert re.search(rf"^1x1 +r0 +done +{metrics['throughput_samples_s']:.1f} samples/s, efficiency 1\.00 vs 1x1, "
                     r"fit \d+:\d\d$", live, re.M), live
    running = re.search(rf"^1x2 +r0 +running +SLURM job {released['1x2']}, epoch (\d+)/{EPOCHS}, "
                        r"elapsed \d+:\d\d, ~\d+:\d\d left, ([\d.]+) samples/s last epoch$", live, re.M)
    assert running, live
    epoch, throughput = int(running.group(1)), float(running.group(2))
    assert 1 <= epoch < EPOCHS
    lines = [last_progress(line) for line in log_1x2.read_text().splitlines()]
    assert throughput in [round(p.throughput, 1) for p in lines if p and p.epoch == epoch], "not the log's figure"
    assert re.search(rf"^2x1 +r0 +queued +SLURM job {queued_id}, reason JobHeldUser$", live, re.M), live
    # the workflow's own snakemake only, not the jobs' (whose nodes are this host here)
    assert re.search(r"snakemake: running here \(pid \d+\);", live), live
    # 1x2 and 2x1, and 1x1's job if it is still ending (its metrics.json makes it done)
    assert re.search(r"SLURM: [23] queued or running job\(s\) of this directory", live), live
    assert "1 done, 1 running, 1 queued, 0 failed, 0 not started" in live

    # Snakemake's Ctrl-C cancels the jobs it holds as active, a list that is empty during each of
    # its status checks (docs/clusters.md, An unattended night): a Ctrl-C landing in one left the
    # held job queued on a loaded machine. Then status must say so, and the user cancels it.
    if squeue_state(queued_id) == "PENDING":
        left = status_of(workspace.path)
        print(f"status after a Ctrl-C that missed the held job:\n{left}")
        assert re.search(rf"^2x1 +r0 +queued +SLURM job {queued_id}, reason JobHeldUser$", left, re.M), left
        subprocess.run(["scancel", queued_id], check=True)
        wait_for_state(queued_id, "CANCELLED")
    # after snakemake ended, the files decide: the cancelled run failed; the held one never ran
    # (snakemake's Ctrl-C cancelled it and removed the empty log it had made for it). Once SLURM
    # has let the cancelled job go: on a loaded machine squeue still listed it as running when
    # snakemake returned, and status rightly believes squeue
    wait_for_state(released["1x2"], "CANCELLED")
    after = status_of(workspace.path)
    print(f"status after the two runs were cancelled:\n{after}")
    # its row shows the rank's own last words, not srun's lines after them
    cause = cause_line(log_1x2.read_text())
    # (SIGTERM's checkpoint message; slurmstepd's CANCELLED line if SIGKILL came first on a loaded machine)
    assert cause.startswith(("ddpscale train: terminated by SIGTERM", "slurmstepd")), cause
    assert re.search(rf"^1x2 +r0 +failed +{re.escape(cause[:100])}", after, re.M), after
    assert re.search(r"^2x1 +r0 +not started$", after, re.M), after
    assert "snakemake: not running here" in after and "lock" not in after
