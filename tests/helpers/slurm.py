"""The throwaway SLURM cluster of the tests (tests/slurm/minicluster.sh; its fixtures are in
tests/slurm/conftest.py) and what the SLURM tests ask it: run snakemake through the executor,
read squeue and scontrol, find a rank."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest
import yaml

from helpers.profiles import load_profile
from helpers.workflow import ROOT, WORKFLOW_PYTHON

MINICLUSTER = ROOT / "tests/slurm/minicluster.sh"
SUBMITTED = re.compile(r"Job \d+ has been submitted with SLURM jobid (\d+)")
# snakemake with the executor's status checks kept frequent (its docstring says why)
SNAKEMAKE_POLLING = [WORKFLOW_PYTHON, str(ROOT / "tests/slurm/polling/snakemake")]


def slurm_workspace(workspace, **profile_changes):
    """The workspace with the test cluster's profile as profiles/minicluster; retries 0 unless
    given (the profile's are the shipped ones), so a test that makes a job fail sees it fail."""
    profile = load_profile("tests/slurm/profile")
    for key, value in {"retries": 0, **profile_changes}.items():
        if key == "site":
            profile["set-resources"]["train"].update(value)
        else:
            profile[key] = value
    target = workspace.path / "profiles/minicluster"
    target.mkdir()
    (target / "config.yaml").write_text(yaml.safe_dump(profile))
    # The test cluster's GPUs are device files: its runs train on the CPU, which a cluster
    # run does only when the config says cpu (auto means the GPU there).
    write_config = workspace.write_config
    workspace.write_config = lambda config: write_config(
        {**config, "accelerator": "cpu"} if config.get("accelerator", "auto") == "auto" else config)
    return workspace


# the dataset of a paced run: with `step_s` 0.4 and tiny_config's batch, about 11 s of sleep an
# epoch on one rank
PACED_SAMPLES = 2400


def paced(workspace, config: dict, step_s: float = 0.4) -> Path:
    """The config trains the spiral MLP of PACED_SAMPLES samples paced by `step_s` of sleep a
    step (usermods.paced), while the returned file exists: a run lasts minutes of wall time but
    not of CPU until the test removes it, and the rest (a retry, a rerun) then trains at full
    speed."""
    config["dataset"]["samples"] = PACED_SAMPLES
    shutil.copytree(ROOT / "tests/fixtures/usermods", workspace.path / "usermods")
    config["model"] = {"class_path": "usermods.paced.PacedSpiralMLP",
                       "init_args": {"step_s": step_s, "while_exists": "pace"}}
    pace = workspace.path / "pace"
    pace.touch()
    return pace


# what `during` returns to interrupt snakemake once it is done
INTERRUPT = "interrupt"


def run_slurm(workspace, *args, timeout: int = 420, during=None, env: dict | None = None,
              profile: str = "profiles/minicluster") -> tuple[int, str]:
    """Snakemake through the SLURM executor; `during()` is called while it runs until it returns
    true (INTERRUPT: then snakemake gets SIGINT). On timeout it gets SIGINT, not SIGTERM: only
    SIGINT makes it scancel its jobs (SIGTERM leaves them running)."""
    log = workspace.path / f"snakemake-{time.monotonic_ns()}.log"
    with open(log, "w") as out:
        # SIGINT as a terminal delivers it: a shell without job control starts its background
        # commands (a test run with `&`) with SIGINT ignored, and snakemake would inherit that and
        # never stop on the test's Ctrl-C
        proc = subprocess.Popen([*SNAKEMAKE_POLLING, "--profile", profile, *args],
                                cwd=workspace.path, stdout=out, stderr=subprocess.STDOUT, text=True,
                                env={**os.environ, **(env or {})},
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        deadline = time.monotonic() + timeout
        while proc.poll() is None and time.monotonic() < deadline:
            done = during() if during is not None else False
            if done == INTERRUPT:  # as a user's Ctrl-C: snakemake scancels its jobs and stops
                proc.send_signal(signal.SIGINT)
            if done:
                during = None
            time.sleep(0.5)
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.wait(60)
            pytest.fail(f"snakemake did not finish in {timeout} s:\n{log.read_text()[-3000:]}")
    return proc.returncode, log.read_text()


def squeue_jobs(workdir: Path | None = None) -> list[tuple[str, str, str]]:
    """(job id, state, comment) of every job the controller still remembers (finished ones for
    MinJobAge), or only those submitted from workdir."""
    out = subprocess.run(["squeue", "-h", "--states=all", "-o", "%i|%T|%Z|%k"], capture_output=True, text=True).stdout
    jobs = [line.split("|", 3) for line in out.splitlines() if line.strip()]
    where = None if workdir is None else os.path.realpath(workdir)
    return [(job, state, comment) for job, state, cwd, comment in jobs
            if where is None or os.path.realpath(cwd) == where]


def training_processes(cwd: Path, topology: str) -> list[psutil.Process]:
    """The launcher and every rank of one local training run (forked ranks share its cmdline)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "cwd"]):
        cmdline = proc.info["cmdline"] or []
        if (proc.info["cwd"] == str(cwd) and f"--topology={topology}" in cmdline
                and any(a.endswith("train.py") for a in cmdline)):
            found.append(proc)
    return found


def squeue_state(job_id: str) -> str:
    return {j: s for j, s, _ in squeue_jobs()}.get(job_id, "")


def wait_for_state(job_id: str, state: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while squeue_state(job_id) != state:
        assert time.monotonic() < deadline, f"job {job_id} is {squeue_state(job_id)!r}, never {state}"
        time.sleep(0.5)


def running_train_job(topology: str, workdir: Path | None = None) -> str | None:
    """The RUNNING SLURM job training `topology` (any stage rule), or None; only one submitted
    from workdir where given (tests that run at once). The executor plugin comments each job
    `rule_<rule>_wildcards_<topology>_<repeat>`."""
    for job_id, state, comment in squeue_jobs(workdir):
        if state == "RUNNING" and f"_wildcards_{topology}_" in comment:
            return job_id
    return None


def job_fields(job_id: str) -> dict:
    """`scontrol show job` as a dict (MinJobAge=600 keeps finished jobs there)."""
    out = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True, check=True).stdout
    return dict(item.split("=", 1) for item in out.split() if "=" in item)


def job_end_epoch(job_id: str) -> float:
    """When a job ended, from squeue (seconds resolution; MinJobAge keeps it listed)."""
    out = subprocess.run(["squeue", "-h", "--states=all", "-j", job_id, "-o", "%e"],
                         capture_output=True, text=True).stdout.strip()
    return time.mktime(time.strptime(out, "%Y-%m-%dT%H:%M:%S"))


def rank_process(cwd: Path, topology: str, rank: int) -> psutil.Process | None:
    """One srun-launched rank of a run: the python process whose SLURM_PROCID is `rank`
    (all nodes of the test cluster are this host, so its environment tells them apart)."""
    for proc in psutil.process_iter(["cmdline", "cwd"]):
        cmdline = proc.info["cmdline"] or []
        if (proc.info["cwd"] == str(cwd) and cmdline and "python" in Path(cmdline[0]).name
                and f"--topology={topology}" in cmdline and any(a.endswith("train.py") for a in cmdline)):
            try:
                if proc.environ().get("SLURM_PROCID") == str(rank):
                    return proc
            except psutil.Error:
                continue
    return None


SACCT_FIELDS = ("JobID", "State", "ExitCode", "Reason", "Account", "Partition", "QOS", "NodeList", "NNodes",
                "Constraints", "ReqTRES", "Comment", "Start", "SubmitLine")


def sacct_job(job_id: str) -> dict:
    """One job's allocation as accounting recorded it (sacct -X): what the executor plugin's
    status path reads, and what a site keeps after the job has left squeue."""
    out = subprocess.run(["sacct", "-X", "-n", "-P", "-j", job_id, "-o", ",".join(SACCT_FIELDS)],
                         capture_output=True, text=True, check=True).stdout
    lines = [line for line in out.splitlines() if line.startswith(f"{job_id}|")]
    assert lines, f"sacct has no job {job_id}: {out!r}"
    # SubmitLine is last: the only field that may itself hold a '|'
    return dict(zip(SACCT_FIELDS, lines[-1].split("|", len(SACCT_FIELDS) - 1)))
