"""Runs that stop before they finish resume where they stopped: on the throwaway SLURM cluster
(a time limit with and without the warning signal, a killed rank of a two-node run) and, for
comparison, a local run killed mid-epoch.
"""

from __future__ import annotations

import json
import math
import re
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from helpers.profiles import load_profile
from helpers.slurm import (
    SUBMITTED, job_end_epoch, paced, rank_process, run_slurm, running_train_job, slurm_workspace, squeue_jobs,
    squeue_state, training_processes,
)
from helpers.workflow import Workspace, tiny_config

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.timeout(600)]


def test_timed_out_run_is_retried_and_resumes(slurm_cluster, workspace):
    """A job killed by its SLURM time limit (TIMEOUT) is retried with the shipped profiles'
    retries and resumes its epochs: one snakemake call, left alone, ends with the report.

    Once the job has a checkpoint, the test shortens that job's limit to one minute, the least
    SLURM keeps (it stores limits in whole minutes): SLURM kills it at its first check after
    the job is a minute old, between 60 and 90 s in (state TIMEOUT), and the retry gets the
    profile's full limit. Until then the training process is stopped (SIGSTOP): epochs here
    took 0.2 to 0.9 s by how busy the machine was, and a fast run finished all of them before
    the limit struck, whatever their number, so no count of epochs made the kill land in time.
    The run is paced (about 11 s an epoch of sleep) until it is stopped, so it is stopped in its
    second epoch, and the retry trains the rest unpaced.
    """
    slurm_workspace(workspace, retries=load_profile("slurm")["retries"])
    config = tiny_config(topologies=["1x1"], max_epochs=TIMEOUT_EPOCHS, measure="full")
    pace = paced(workspace, config)
    workspace.write_config(config)
    checkpoint = workspace.results / "checkpoints/1x1/r0/last.ckpt"
    shortened = []

    def stop_at_checkpoint():
        if not checkpoint.exists():
            return False
        job_id = running_train_job("1x1")
        # the rank, not the step's launcher: SLURM's kill at the limit ends a stopped process
        ranks = [p for p in training_processes(workspace.path, "1x1") if Path(p.cmdline()[0]).name != "srun"]
        if job_id is None or not ranks:
            return False
        for rank in ranks:
            rank.send_signal(signal.SIGSTOP)
        subprocess.run(["scontrol", "update", f"JobId={job_id}", "TimeLimit=1"], check=True)
        shortened.append(job_id)
        pace.unlink()
        return True

    start = time.monotonic()
    # every target, the report too; it and prepare_data run where snakemake does (localrules),
    # so every submission below is the training job's
    code, log = run_slurm(workspace, timeout=480, during=stop_at_checkpoint)
    print(f"\nTIMEOUT + retry scenario: {time.monotonic() - start:.1f} s")
    assert code == 0, log[-4000:]
    assert shortened, "the job finished before its limit could be shortened; lengthen it"
    submitted = SUBMITTED.findall(log)
    states = {job_id: state for job_id, state, _ in squeue_jobs()}
    assert submitted[0] == shortened[0] and len(submitted) == 2
    assert [states[j] for j in submitted] == ["TIMEOUT", "COMPLETED"]
    metrics = json.loads(workspace.metrics("1x1").read_text())
    assert metrics["slurm_job_id"] == submitted[1]
    assert metrics["attempts"] == 2
    assert 1 <= metrics["resumed_from_epoch"] < TIMEOUT_EPOCHS, "it started over instead of resuming"
    # useful work only: every epoch once, the one cut by the time limit not at all
    assert len(metrics["epoch_times_s"]) == TIMEOUT_EPOCHS
    assert metrics["fit_time_s"] == pytest.approx(sum(metrics["epoch_times_s"]), rel=1e-4)
    assert (workspace.results / "report/report.html").exists()


# The run is stopped in its second epoch until the limit kills it, so the epochs only need to be
# more than two; the retry trains the rest, unpaced, well inside its limit.
TIMEOUT_EPOCHS = 4


def test_local_run_killed_mid_epoch_resumes(workspace):
    """The same resume without SLURM: SIGKILL a local training run, run the command again."""
    config = tiny_config(topologies=["1x1", "1x2"], max_epochs=8, measure="full")
    config["dataset"]["samples"] = 6000
    workspace.write_config(config)
    assert workspace.snakemake("baseline").returncode == 0
    kept = workspace.metrics("1x1").read_bytes()

    proc = workspace.start_until_checkpoint("1x2", timeout=180)
    victims = training_processes(workspace.path, "1x2")
    assert victims, "found no training process to kill"
    for victim in victims:
        victim.send_signal(signal.SIGKILL)
    assert proc.wait(120) != 0
    assert not workspace.metrics("1x2").exists()

    result = workspace.snakemake()
    assert result.returncode == 0, result.stderr[-4000:]
    assert "wildcards: topology=1x2, repeat=0" in result.stderr
    assert "topology=1x1, repeat=0" not in result.stderr, "no other training run reruns"
    assert workspace.metrics("1x1").read_bytes() == kept
    metrics = json.loads(workspace.metrics("1x2").read_text())
    assert metrics["attempts"] == 2 and metrics["resumed_from_epoch"] >= 1
    assert len(metrics["epoch_times_s"]) == 8


# SLURM keeps time limits in whole minutes (seconds round up: 0:93 is 2 minutes) and enforces
# them on a 30 s tick. The limit set below is the first whole minute at least LIMIT_AHEAD_S
# ahead, so the job ends 35 to 125 s after it is set; with --signal=USR1@60 a tick in between
# sends the warning first.
LIMIT_AHEAD_S = 35


# The scenarios: (topology, signal_s). Their runs train the spiral MLP paced to about 11 s an
# epoch of sleep (helpers.slurm.paced), so the kill lands well before the run ends (the 23 epochs
# after the first last about 250 s, the limit comes 35-125 s after the first) whatever else the
# machine runs, and the three wait out their limits at once instead of one after another (they
# took 18 minutes of the suite in turn, most of it training on the cores the other tests use).
# Once the first job has ended the pacing stops, and the retry trains the rest in seconds.
TIME_LIMITS = {"warning-signal": ("1x2", 60), "no-signal": ("1x2", 0), "warning-signal-1-rank": ("1x1", 60)}
PACED_EPOCHS = 24


@pytest.mark.timeout(1200)
def test_time_limit_with_warning_signal_resumes_mid_epoch(slurm_cluster, tmp_path):
    """Once the first epoch's checkpoint exists the job's limit is set 35-125 s ahead: with
    `--signal=USR1@60` the ranks stop together, save mid-epoch and exit non-zero before the
    limit; without it SLURM kills them at the limit. The retry resumes either way. Each scenario
    in TIME_LIMITS runs in a workspace of its own, all at once; each one's failure is named.
    Printed: the training done after the last checkpoint of the first job (lost to the limit)."""
    with ThreadPoolExecutor(len(TIME_LIMITS)) as pool:
        running = {name: pool.submit(time_limit_resumes, Workspace(tmp_path / name), name, *scenario)
                   for name, scenario in TIME_LIMITS.items()}
    failed = {}
    for name, future in running.items():
        try:
            print(future.result())
        except BaseException as err:  # noqa: BLE001 - pytest.fail's Failed too: every scenario is reported
            failed[name] = f"{type(err).__name__}: {err}"
    assert not failed, "\n".join(f"{name}: {why}" for name, why in failed.items())


def time_limit_resumes(workspace, name: str, topology: str, signal_s: int) -> str:
    """One scenario of the test above; returns what it prints."""
    # the first job's limit is cut short below; its retry gets 15 minutes for the rest
    slurm_workspace(workspace, retries=1, site={"site_signal_s": signal_s, "runtime": 15})
    config = tiny_config(topologies=["1x1", "1x2"], max_epochs=PACED_EPOCHS, measure="full")
    pace = paced(workspace, config)
    workspace.write_config(config)
    checkpoint = workspace.results / f"checkpoints/{topology}/r0/last.ckpt"
    first, saved, left = [], [], []

    def watch():
        if checkpoint.exists() and (not first or squeue_state(first[0]) == "RUNNING"):
            saved.append(checkpoint.stat().st_mtime)
        if first and squeue_state(first[0]) in ("FAILED", "TIMEOUT"):
            # what the first job left for its retry, read before the retry's first save
            # (its start-up and one epoch later); the attempt it records below checks that it was
            left.append(checkpoint_left(checkpoint))
            pace.unlink()
            return True
        if first or not checkpoint.exists():
            return False
        job_id = running_train_job(topology, workspace.path)
        if job_id is not None:
            elapsed = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%M"], capture_output=True,
                                     text=True).stdout.strip()
            minutes, seconds = (elapsed.split(":")[-2:] + ["0"])[:2] if ":" in elapsed else ("0", elapsed)
            limit_minutes = math.ceil((int(minutes) * 60 + int(seconds) + LIMIT_AHEAD_S) / 60)
            subprocess.run(["scontrol", "update", f"JobId={job_id}", f"TimeLimit={limit_minutes}"], check=True)
            first.append(job_id)
        return False

    # the 2-rank run alone: its ranks are the tasks of an srun step, which SLURM signals
    target = workspace.metrics(topology).relative_to(workspace.path)
    code, log = run_slurm(workspace, str(target), timeout=900, during=watch)
    assert code == 0, log[-4000:]
    assert first, "the first epoch never finished in the job"
    submitted = SUBMITTED.findall(log)
    states = {job_id: state for job_id, state, _ in squeue_jobs()}
    assert submitted[0] == first[0] and len(submitted) == 2
    lost = job_end_epoch(first[0]) - max(saved)
    said = [f"{name}: TIMEOUT of {topology} with signal_s={signal_s}: first job {states[first[0]]}, training "
            f"after its last checkpoint (lost) {lost:.0f} s"]
    metrics = json.loads(workspace.metrics(topology).read_text())
    assert metrics["attempts"] == 2 and len(metrics["epoch_times_s"]) == PACED_EPOCHS
    assert left, "the first job's end was never seen"
    assert left[0] is not None, "the first job finished training before its limit (no checkpoint left): lengthen the run"
    attempt, partial, finished = left[0]
    # by the attempt it records, not its time: the first job's ranks may still be saving in
    # SLURM's KillWait after the end SLURM records (a suite run saw the save land 1.01 s after)
    assert attempt == 1, "read the retry's checkpoint, not the first job's"
    if signal_s:
        assert states[first[0]] == "FAILED", "it should stop itself before the limit"
    else:
        # SLURM's SIGTERM at the limit also stops the ranks together; whether their save fits
        # in KillWait (2 s here, 30 s by default) before SIGKILL varies, so mid-epoch or not
        assert states[first[0]] == "TIMEOUT"
    # The retry resumes where the first job's checkpoint says. With the warning that is
    # mid-epoch, unless it landed in an epoch's last steps or its validation (where SLURM's
    # 30 s tick puts it is chance): the ranks then stop at the next epoch's start, which the
    # epoch's checkpoint already holds, and the retry starts that epoch.
    if partial is not None:
        assert metrics["resumed_mid_epoch"], "the retry started the epoch over"
        assert metrics["resumed_from_epoch"] == partial["epoch"]
    else:
        assert not metrics["resumed_mid_epoch"] and metrics["resumed_from_epoch"] == finished
    where = f"mid-epoch {partial['epoch']}" if partial else f"after epoch {finished - 1}"
    said.append(f"{name}: the first job's checkpoint: {where}; the retry resumed at epoch {metrics['resumed_from_epoch']}")
    return "\n".join(said)


def checkpoint_left(checkpoint) -> tuple[int, dict | None, int] | None:
    """(the attempt that saved it, the partial epoch a signal's save kept or None, epochs
    finished) of a checkpoint; None without one (a run that finished drops it)."""
    import torch

    if not checkpoint.exists():
        return None
    timing = torch.load(checkpoint, map_location="cpu", weights_only=False)["callbacks"]["EpochTiming"]
    return timing["attempts"], timing["partial"], len(timing["epoch_times"])


def test_killed_rank_of_a_two_node_run_fails_its_job_and_the_rerun_resumes(slurm_cluster, workspace):
    """Issue 11 item 5 on SLURM: SIGKILL rank 1 (on the second node) of a 2x1 run. srun's
    --kill-on-bad-exit ends the step at once, well within the collective timeout; the job
    fails and says which task died, the other topology finishes, and a rerun resumes. Paced
    until the kill, so rank 1 is surely still training after the first checkpoint."""
    slurm_workspace(workspace, retries=0)
    config = tiny_config(topologies=["1x1", "2x1"], max_epochs=8, collective_timeout_s=60,
                         measure="full")
    pace = paced(workspace, config)
    workspace.write_config(config)
    checkpoint = workspace.results / "checkpoints/2x1/r0/last.ckpt"
    killed, ended = [], []

    def kill_rank_one():
        if not killed and checkpoint.exists():
            victim = rank_process(workspace.path, "2x1", 1)
            job = running_train_job("2x1")
            if victim is not None and job is not None:
                victim.send_signal(signal.SIGKILL)
                killed.append((job, time.monotonic()))
                pace.unlink()
        elif killed and not ended and squeue_state(killed[0][0]) not in ("RUNNING", "COMPLETING"):
            ended.append(time.monotonic())
        return False

    code, log = run_slurm(workspace, "scaling", timeout=480, during=kill_rank_one)
    assert killed, "rank 1 was never found running after the first checkpoint"
    job, at = killed[0]
    assert ended, "the killed run's job did not end while snakemake ran"
    took = ended[0] - at
    print(f"\nSIGKILLed rank 1 of a 2-node run: its SLURM job {job} ended {took:.1f} s later "
          f"(state {squeue_state(job)}; collective timeout 60 s)")
    assert code != 0
    assert squeue_state(job) == "FAILED"
    assert took < 60 + 30, "the job outlived the collective timeout"
    train_log = (workspace.results / "logs/train/2x1/r0.log").read_text()
    assert re.search(r"task 1: Killed", train_log), train_log[-3000:]
    assert workspace.metrics("1x1").exists(), "keep-going: the other topology finishes"
    assert not workspace.metrics("2x1").exists()
    kept = workspace.metrics("1x1").read_bytes()

    code, log = run_slurm(workspace, "scaling", timeout=480)
    assert code == 0, log[-4000:]
    assert len(SUBMITTED.findall(log)) == 1, "only the failed run is submitted again"
    assert workspace.metrics("1x1").read_bytes() == kept
    metrics = json.loads(workspace.metrics("2x1").read_text())
    assert metrics["attempts"] == 2 and metrics["resumed_from_epoch"] >= 1
    assert len(metrics["epoch_times_s"]) == 8 and metrics["world_size"] == 2
