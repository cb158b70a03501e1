"""The SLURM side for real: a throwaway multi-node cluster (tests/slurm/minicluster.sh), real
sbatch and srun, `snakemake --executor slurm` through the same rules and resource mapping as
the cluster profiles. Run alone with `pytest -m slurm`.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest
import yaml

from conftest import ROOT, SNAKEMAKE, load_profile, tiny_config

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.timeout(600)]
MINICLUSTER = ROOT / "tests/slurm/minicluster.sh"
SUBMITTED = re.compile(r"Job \d+ has been submitted with SLURM jobid (\d+)")


@pytest.fixture(scope="session")
def slurm_cluster():
    """Bring the cluster up once; skip where it cannot come up, except under CI=true.

    One cluster serves one pytest session at a time: a second session waits on the lock,
    else its teardown would stop the daemons under the first one's jobs."""
    lock = open("/tmp/ddpscale-slurm-tests.lock", "w")
    fcntl.flock(lock, fcntl.LOCK_EX)
    if os.geteuid() != 0:
        reason = "the throwaway SLURM cluster needs root (it installs slurm-wlm and writes /etc/slurm)"
    else:
        start = time.monotonic()
        up = subprocess.run(["bash", str(MINICLUSTER), "up"], capture_output=True, text=True, timeout=600)
        reason = None if up.returncode == 0 else f"minicluster.sh up failed: {(up.stdout + up.stderr)[-1500:]}"
        print(f"\nSLURM test cluster up in {time.monotonic() - start:.1f} s")
    if reason:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the SLURM tests, but: {reason}")
        pytest.skip(reason)
    try:
        yield
    finally:
        subprocess.run(["bash", str(MINICLUSTER), "down"], capture_output=True, timeout=120)
        lock.close()


def slurm_workspace(workspace, **profile_changes):
    """The workspace with the test cluster's profile as profiles/minicluster."""
    profile = load_profile("tests/slurm/profile")
    for key, value in profile_changes.items():
        if key == "site":
            profile["set-resources"]["train"].update(value)
        else:
            profile[key] = value
    target = workspace.path / "profiles/minicluster"
    target.mkdir()
    (target / "config.yaml").write_text(yaml.safe_dump(profile))
    return workspace


def run_slurm(workspace, *args, timeout: int = 420, during=None, env: dict | None = None) -> tuple[int, str]:
    """Snakemake through the SLURM executor. On timeout it gets SIGINT, not SIGTERM: only
    SIGINT makes it scancel its jobs (SIGTERM leaves them running)."""
    log = workspace.path / f"snakemake-{time.monotonic_ns()}.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([*SNAKEMAKE, "--profile", "profiles/minicluster", *args],
                                cwd=workspace.path, stdout=out, stderr=subprocess.STDOUT, text=True,
                                env={**os.environ, **(env or {})})
        deadline = time.monotonic() + timeout
        while proc.poll() is None and time.monotonic() < deadline:
            if during is not None and during():
                during = None
            time.sleep(0.5)
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.wait(60)
            pytest.fail(f"snakemake did not finish in {timeout} s:\n{log.read_text()[-3000:]}")
    return proc.returncode, log.read_text()


def squeue_jobs() -> list[tuple[str, str, str]]:
    """(job id, state, comment) of every job the controller still remembers."""
    out = subprocess.run(["squeue", "-h", "--states=all", "-o", "%i|%T|%k"], capture_output=True, text=True).stdout
    return [tuple(line.split("|", 2)) for line in out.splitlines() if line.strip()]


def training_processes(cwd: Path, topology: str) -> list[psutil.Process]:
    """The launcher and every rank of one local training run (forked ranks share its cmdline)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "cwd"]):
        cmdline = proc.info["cmdline"] or []
        if proc.info["cwd"] == str(cwd) and topology in cmdline and any(a.endswith("train.py") for a in cmdline):
            found.append(proc)
    return found


def test_test_profile_differs_from_the_generic_one_only_in_site_facts():
    generic, test = load_profile("slurm"), load_profile("tests/slurm/profile")
    # status: sacct needs slurmdbd, which the test cluster lacks (squeue there, sacct on sites)
    site_keys = {"jobs", "latency-wait", "slurm-init-seconds-before-status-checks", "default-resources",
                 "slurm-status-command"}
    assert (generic["slurm-status-command"], test["slurm-status-command"]) == ("sacct", "squeue")
    assert {k: v for k, v in generic.items() if k not in site_keys | {"set-resources"}} == \
           {k: v for k, v in test.items() if k not in site_keys | {"set-resources"}}
    assert set(generic["set-resources"]) == set(test["set-resources"]) == {"train"}
    assert set(generic["set-resources"]["train"]) == set(test["set-resources"]["train"])
    assert test["set-resources"]["train"]["site_launcher"] == generic["set-resources"]["train"]["site_launcher"] == "srun"


def test_whole_workflow_on_the_cluster(slurm_cluster, workspace):
    slurm_workspace(workspace).write_config(tiny_config(topologies=["1x1", "1x2", "2x1", "2x2"]))
    start = time.monotonic()
    code, log = run_slurm(workspace)
    print(f"\nworkflow with 4 topologies through SLURM: {time.monotonic() - start:.1f} s")
    assert code == 0, log[-4000:]
    submitted = SUBMITTED.findall(log)
    assert len(submitted) == 8, "one SLURM job per training run and per probe; data and report run locally"
    expected = {"1x1": [0], "1x2": [0, 0], "2x1": [0, 1], "2x2": [0, 0, 1, 1]}
    job_ids = set()
    for topology, node_ranks in expected.items():
        metrics = json.loads(workspace.metrics(topology).read_text())
        # the world that formed, not the exit code: a multi-node job wrapped in `srun -n1`
        # would train on one rank and still "succeed"
        assert metrics["world_size"] == len(node_ranks)
        assert metrics["node_ranks"] == node_ranks
        assert metrics["slurm_job_id"] in submitted
        job_ids.add(metrics["slurm_job_id"])
        # the probe ran on the same shape of allocation: its all-reduce spans every rank
        probe = json.loads((workspace.path / f"results/runs/{topology}/probe.json").read_text())
        assert probe["world_size"] == len(node_ranks)
    assert len(job_ids) == 4
    assert (workspace.path / "results/report/report.html").exists()


def test_cancelled_run_is_the_only_one_resubmitted(slurm_cluster, workspace):
    slurm_workspace(workspace).write_config(tiny_config(topologies=["1x1", "1x2", "2x2"]))
    cancelled = []

    def cancel_2x2():
        for job_id, state, comment in squeue_jobs():
            if comment.startswith("rule_train_") and "2x2" in comment and state in ("PENDING", "RUNNING"):
                subprocess.run(["scancel", job_id], check=True)
                cancelled.append(job_id)
                return True
        return False

    code, log = run_slurm(workspace, during=cancel_2x2)
    assert cancelled, "the 2x2 job was never seen in squeue"
    assert code != 0
    assert workspace.metrics("1x1").exists() and workspace.metrics("1x2").exists()
    assert not workspace.metrics("2x2").exists()

    code, log = run_slurm(workspace)
    assert code == 0, log[-4000:]
    assert len(SUBMITTED.findall(log)) == 1
    assert "topology=2x2" in log
    assert json.loads(workspace.metrics("2x2").read_text())["world_size"] == 4


def test_timed_out_run_is_retried_and_resumes(slurm_cluster, workspace):
    """A job killed by its SLURM time limit (TIMEOUT) is retried and resumes its epochs.

    SLURM enforces limits only every 30 s, so a fixed 1-minute limit ends a job anywhere
    between 60 and 95 s in and the number of attempts would vary. Instead, once the job has a
    checkpoint, the test shortens that job's limit to 10 s: SLURM kills it at its next check
    (state TIMEOUT) and the retry gets the profile's full limit.
    """
    slurm_workspace(workspace, retries=1)
    config = tiny_config(topologies=["1x1"], max_epochs=TIMEOUT_EPOCHS)
    config["dataset"]["samples"] = TIMEOUT_SAMPLES
    workspace.write_config(config)
    checkpoint = workspace.path / "results/checkpoints/1x1/r0/last.ckpt"
    shortened = []

    def shorten_time_limit():
        if not checkpoint.exists():
            return False
        for job_id, state, comment in squeue_jobs():
            if comment.startswith("rule_train_") and "1x1" in comment and state == "RUNNING":
                subprocess.run(["scontrol", "update", f"JobId={job_id}", "TimeLimit=0:10"], check=True)
                shortened.append(job_id)
                return True
        return False

    start = time.monotonic()
    # target `scaling`: training only, so every submission below is the training job's
    code, log = run_slurm(workspace, "scaling", timeout=480, during=shorten_time_limit)
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


# 0.3 to 0.9 s per epoch with one CPU on this 2-core machine, by how busy it is. The kill must
# land while the job still trains: slurmctld enforces a shortened limit at its next check, up
# to ~30 s later; 80 epochs once finished first (70 s), and 160 did too on a quiet machine (48 s),
# so the run (rightly) finished and was re-emitted instead of resumed. 300 epochs give it 90 s
# at the fastest; at the slowest the retry (about 250 epochs left) still fits the profile's
# 5-minute limit.
TIMEOUT_EPOCHS = 300
TIMEOUT_SAMPLES = 20000


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


def test_local_run_killed_mid_epoch_resumes(workspace):
    """The same resume without SLURM: SIGKILL a local training run, run the command again."""
    config = tiny_config(topologies=["1x1", "1x2"], max_epochs=8)
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


def test_cluster_run_without_site_facts_is_refused_before_submission(slurm_cluster, workspace):
    """--set-resources on the command line replaces the profile's, site facts included: the
    jobs would start every rank on one node. The run must stop before any sbatch."""
    slurm_workspace(workspace).write_config(tiny_config(topologies=["1x1", "1x2"]))
    code, log = run_slurm(workspace, "--set-resources", "train:runtime=5", timeout=120)
    assert code != 0
    assert "rule train has no site facts" in log and "repeat the profile's site_* entries" in log
    assert not SUBMITTED.findall(log)


def job_fields(job_id: str) -> dict:
    """`scontrol show job` as a dict (MinJobAge=600 keeps finished jobs there)."""
    out = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True, check=True).stdout
    return dict(item.split("=", 1) for item in out.split() if "=" in item)


def test_allocation_pins_tasks_per_node_and_jobs_get_their_own_port(slurm_cluster, workspace):
    """Items 6 and 8 of issue 11. The allocation carries --ntasks-per-node, not only --ntasks
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


def job_end_epoch(job_id: str) -> float:
    """When a job ended, from squeue (seconds resolution; MinJobAge keeps it listed)."""
    out = subprocess.run(["squeue", "-h", "--states=all", "-j", job_id, "-o", "%e"],
                         capture_output=True, text=True).stdout.strip()
    return time.mktime(time.strptime(out, "%Y-%m-%dT%H:%M:%S"))


# (topology, signal_s, epochs): the limit's kill, up to 95 s after it is set, must land before
# the run ends; one rank trains an epoch of these 200000 samples in about 6 s, two in 10 s
@pytest.mark.parametrize("topology,signal_s,epochs", [("1x2", 60, 12), ("1x2", 0, 12), ("1x1", 60, 30)],
                         ids=["warning-signal", "no-signal", "warning-signal-1-rank"])
def test_time_limit_with_warning_signal_resumes_mid_epoch(slurm_cluster, workspace, topology, signal_s, epochs):
    """Issue 11 item 4. Once the first epoch's checkpoint exists the job's limit is set 65 s
    ahead: with `--signal=USR1@60` the ranks stop together, save mid-epoch and exit non-zero
    before the limit; without it SLURM kills them at the limit. The retry resumes either way.
    Printed: the training done after the last checkpoint of the first job (lost to the limit)."""
    slurm_workspace(workspace, retries=1, site={"site_signal_s": signal_s})
    config = tiny_config(topologies=["1x1", "1x2"], max_epochs=epochs)
    config["dataset"]["samples"] = 200000
    workspace.write_config(config)
    checkpoint = workspace.path / f"results/checkpoints/{topology}/r0/last.ckpt"
    first, saved = [], []

    def watch():
        if checkpoint.exists() and (not first or squeue_state(first[0]) == "RUNNING"):
            saved.append(checkpoint.stat().st_mtime)
        if first or not checkpoint.exists():
            return False
        for job_id, state, comment in squeue_jobs():
            if comment.startswith("rule_train_") and topology in comment and state == "RUNNING":
                elapsed = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%M"], capture_output=True,
                                         text=True).stdout.strip()
                minutes, seconds = (elapsed.split(":")[-2:] + ["0"])[:2] if ":" in elapsed else ("0", elapsed)
                limit = int(minutes) * 60 + int(seconds) + 65
                subprocess.run(["scontrol", "update", f"JobId={job_id}", f"TimeLimit=0:{limit}"], check=True)
                first.append(job_id)
        return False

    # the 2-rank run alone: its ranks are the tasks of an srun step, which SLURM signals
    code, log = run_slurm(workspace, f"results/runs/{topology}/r0/metrics.json", timeout=560, during=watch)
    assert code == 0, log[-4000:]
    assert first, "the first epoch never finished in the job"
    submitted = SUBMITTED.findall(log)
    states = {job_id: state for job_id, state, _ in squeue_jobs()}
    assert submitted[0] == first[0] and len(submitted) == 2
    lost = job_end_epoch(first[0]) - max(saved)
    print(f"\nTIMEOUT of {topology} with signal_s={signal_s}: first job {states[first[0]]}, training after its last "
          f"checkpoint (lost) {lost:.0f} s")
    metrics = json.loads(workspace.metrics(topology).read_text())
    assert metrics["attempts"] == 2 and len(metrics["epoch_times_s"]) == epochs
    if signal_s:
        assert states[first[0]] == "FAILED", "it should stop itself before the limit"
        assert metrics["resumed_mid_epoch"], "the retry started the epoch over"
    else:
        # SLURM's SIGTERM at the limit also stops the ranks together; whether their save fits
        # in KillWait (2 s here, 30 s by default) before SIGKILL varies, so mid-epoch or not
        assert states[first[0]] == "TIMEOUT"


def squeue_state(job_id: str) -> str:
    return {j: s for j, s, _ in squeue_jobs()}.get(job_id, "")


def rank_process(cwd: Path, topology: str, rank: int) -> psutil.Process | None:
    """One srun-launched rank of a run: the python process whose SLURM_PROCID is `rank`
    (all nodes of the test cluster are this host, so its environment tells them apart)."""
    for proc in psutil.process_iter(["cmdline", "cwd"]):
        cmdline = proc.info["cmdline"] or []
        if (proc.info["cwd"] == str(cwd) and cmdline and "python" in Path(cmdline[0]).name
                and topology in cmdline and any(a.endswith("train.py") for a in cmdline)):
            try:
                if proc.environ().get("SLURM_PROCID") == str(rank):
                    return proc
            except psutil.Error:
                continue
    return None


def test_killed_rank_of_a_two_node_run_fails_its_job_and_the_rerun_resumes(slurm_cluster, workspace):
    """Issue 11 item 5 on SLURM: SIGKILL rank 1 (on the second node) of a 2x1 run. srun's
    --kill-on-bad-exit ends the step at once, well within the collective timeout; the job
    fails and says which task died, the other topology finishes, and a rerun resumes."""
    slurm_workspace(workspace, retries=0)
    config = tiny_config(topologies=["1x1", "2x1"], max_epochs=8, collective_timeout_s=60)
    config["dataset"]["samples"] = 60000
    workspace.write_config(config)
    checkpoint = workspace.path / "results/checkpoints/2x1/r0/last.ckpt"
    killed, ended = [], []

    def kill_rank_one():
        if not killed and checkpoint.exists():
            victim = rank_process(workspace.path, "2x1", 1)
            job = next((j for j, s, c in squeue_jobs() if c.startswith("rule_train_") and "2x1" in c
                        and s == "RUNNING"), None)
            if victim is not None and job is not None:
                victim.send_signal(signal.SIGKILL)
                killed.append((job, time.monotonic()))
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
    train_log = (workspace.path / "results/logs/train/2x1/r0.log").read_text()
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
