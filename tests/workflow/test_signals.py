"""Signals, stops and hangs: a terminated run exits non-zero and resumes
mid-epoch with its time counted once; a dead or stuck rank ends its job within the collective
timeout, and says which rank and how."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import pytorch_lightning as pl
import torch

from helpers.training import launched, throughput, train_args
from helpers.workflow import ROOT, tiny_config
from ddpscale.run import runspec
from ddpscale.job.launch.spawner import describe_exit, run
from ddpscale.job import build, callbacks
from ddpscale.job.resume.signals import HANDLED, StopRequested, check_due, exit_code, stop_message
from ddpscale.workloads.models import SpiralMLP
from ddpscale.workloads.resident import ResidentBatches

# --- pure parts ------------------------------------------------------------------------------


def test_a_stop_on_a_signal_exits_non_zero_with_the_shell_convention():
    assert exit_code(signal.SIGTERM) == 143 and exit_code(signal.SIGUSR1) == 138


def test_the_stop_message_says_what_happened_and_what_to_do():
    line = stop_message(signal.SIGUSR1, "/ckpt/last.ckpt")
    assert "SIGUSR1" in line and "/ckpt/last.ckpt" in line and "resumes" in line
    assert "\n" not in line
    assert "SIGTERM" in stop_message(signal.SIGTERM, None) and "resumes" in stop_message(signal.SIGTERM, None)


def test_ranks_agree_every_k_steps_counted_alike_on_every_rank():
    assert [s for s in range(1, 31) if check_due(s, 10)] == [10, 20, 30]


def test_launcher_names_the_rank_and_how_it_ended():
    assert describe_exit(1, -9) == "rank 1 was killed by signal 9 (SIGKILL)"
    assert describe_exit(0, 143) == "rank 0 exited with code 143: it stopped on SIGTERM"
    assert describe_exit(2, 3) == "rank 2 exited with code 3"


def test_launcher_blames_the_killed_rank_even_when_a_peer_exits_first(capfd):
    """The race the full suite met on a loaded machine: rank 0 (its collective lost the
    connection) ended with code 1 before rank 1's SIGKILL was reaped. Here rank 0 exits at
    once and rank 1 is killed 0.3 s later: the launcher must name rank 1 and its signal."""

    script = 'if [ "$RANK" = 0 ]; then exit 1; fi; sleep 0.3; kill -9 $$'
    assert run(1, 2, ["sh", "-c", script]) == -9
    assert "ddpscale launch: rank 1 was killed by signal 9 (SIGKILL); stopping the other ranks" in capfd.readouterr().err
    # both ended between two polls (2 s apart here): the kill is still named first
    script = 'if [ "$RANK" = 1 ]; then kill -9 $$; fi; sleep 0.2; exit 1'
    assert run(1, 2, ["sh", "-c", script], poll_s=2) == -9
    assert "ddpscale launch: rank 1 was killed by signal 9 (SIGKILL)" in capfd.readouterr().err


# --- real runs ---------------------------------------------------------------------------------


# --- where in an epoch the stop lands (in-process, one rank) ----------------------------------


class TinySpiral(pl.LightningDataModule):
    """4 training batches of 16 and one validation batch: every moment of an epoch is one hook."""

    def __init__(self):
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(80, 2, generator=generator), torch.randint(0, 2, (80,), generator=generator)

    def train_dataloader(self):
        return ResidentBatches((self.x[:64], self.y[:64]), 16, shuffle=False)

    def val_dataloader(self):
        return ResidentBatches((self.x[64:], self.y[64:]), 16, shuffle=False)


class SignalDuringEpochZero(pl.Callback):
    """Sends this process SIGUSR1 once, at the start of a training batch or of validation."""

    def __init__(self, when: str):
        self.when, self.sent = when, False

    def _send(self) -> None:
        if not self.sent:
            self.sent = True
            os.kill(os.getpid(), signal.SIGUSR1)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        last = trainer.num_training_batches - 1
        if trainer.current_epoch == 0 and batch_idx == {"batch before last": last - 1, "last batch": last}.get(self.when):
            self._send()

    def on_validation_start(self, trainer, pl_module) -> None:
        if trainer.current_epoch == 0 and self.when == "validation":
            self._send()


def fit_tiny(tmp_path: Path, *extra: pl.Callback):
    """One rank's fit with train.py's callbacks (the stop checked at every step), resuming
    from the checkpoint if there is one."""
    # two epochs, checkpoints in tmp_path/ckpt; the data flags go unused (TinySpiral feeds it)
    # TinySpiral's batch (checked at fit start)
    spec = runspec.parse([*train_args(tmp_path / "unused.npz", tmp_path), "--batch-size", "16"])
    measured = callbacks.build(spec)
    measured.stop.every = 1
    trainer = build.build_trainer(spec, [*measured.all(), *extra])
    last = tmp_path / "ckpt/last.ckpt"
    trainer.fit(SpiralMLP(), datamodule=TinySpiral(), ckpt_path=str(last) if last.exists() else None)
    return measured.timing


@pytest.mark.parametrize("when,saved_mid_epoch", [
    ("batch before last", True),
    # a checkpoint saved on an epoch's last batch would make Lightning train that epoch again
    ("last batch", False),
    # the issue-12 CI failure: SLURM's warning landed in validation, and the retry rightly
    # began the next epoch (the test expected a mid-epoch resume)
    ("validation", False),
])
def test_a_signal_late_in_an_epoch_stops_at_the_next_epochs_start_and_loses_nothing(tmp_path, when, saved_mid_epoch):
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGUSR1, signal.SIGTERM)}
    try:
        with pytest.raises(StopRequested) as stopped:
            fit_tiny(tmp_path, SignalDuringEpochZero(when))
        assert stopped.value.signum == signal.SIGUSR1
        assert (stopped.value.checkpoint is not None) == saved_mid_epoch
        left = torch.load(tmp_path / "ckpt/last.ckpt", weights_only=False)["callbacks"]["EpochTiming"]
        if saved_mid_epoch:
            assert left["partial"]["epoch"] == 0 and left["epoch_times"] == []
        else:
            assert left["partial"] is None and len(left["epoch_times"]) == 1, "epoch 0 was not kept whole"

        timing = fit_tiny(tmp_path)
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    assert timing.resumed_mid_epoch == saved_mid_epoch
    assert timing.resumed_from_epoch == (0 if saved_mid_epoch else 1)
    # each epoch counted once: epoch 0 finished in the retry only when it was split
    assert timing.epoch_attempts == ([2, 2] if saved_mid_epoch else [1, 2])
    assert timing.samples == [64, 64]

# 30 000 samples, 16 per step: an epoch of ~1300 steps (about 8 s here; one thread per rank,
# as on a busy machine more threads than cores make each step many times slower), so a
# signal sent a second after training starts lands mid-epoch.
LONG_SAMPLES = 30000


@pytest.fixture(scope="module")
def long_data(tmp_path_factory) -> str:
    from ddpscale.core.spiral import write_dataset

    folder = tmp_path_factory.mktemp("long")
    write_dataset(str(folder / "data.npz"), str(folder / "manifest.json"), LONG_SAMPLES, 0.2, 7, [0.7, 0.15, 0.15])
    return str(folder / "data.npz")


def train_command(tmp_path: Path, data_file: str, nodes: int, devices: int, *extra: str) -> list[str]:
    train = [sys.executable, str(ROOT / "scripts/train.py"), "--topology", f"{nodes}x{devices}",
             "--num-nodes", str(nodes), "--devices-per-node", str(devices),
             *throughput(), "--accelerator", "cpu", "--threads", "1",
             "--max-epochs", "2", "--warmup-epochs", "0", "--scaling", "strong", "--batch-size", "16",
             "--model-class", "ddpscale.workloads.models.SpiralMLP",
             "--data-class", "ddpscale.workloads.spiral_datamodule.SpiralDataModule", "--data-file", data_file,
             "--ckpt-dir", str(tmp_path / "ckpt"), "--metrics", str(tmp_path / "metrics.json"), *extra]
    return launched(train, nodes, devices)


def start_training(command: list[str], out: Path) -> subprocess.Popen:
    """Start a run and return once it trains with every rank's signal handlers in place (rank 0
    says so after a barrier; the world-size banner comes earlier, before the handlers)."""
    proc = subprocess.Popen(command, cwd=ROOT, stdout=out.open("w"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while HANDLED not in out.read_text() and time.monotonic() < deadline:
        assert proc.poll() is None, out.read_text()[-3000:]
        time.sleep(0.05)
    assert HANDLED in out.read_text(), "training never started"
    return proc


def ranks_of(proc: subprocess.Popen) -> dict[int, psutil.Process]:
    """Rank -> process: the run itself (one rank) or the local launcher's children."""
    parent = psutil.Process(proc.pid)
    children = parent.children()
    if not children:
        return {0: parent}
    # forked in rank order (ddpscale.job.launch.spawner), and a fork's /proc environ is its parent's
    return dict(enumerate(sorted(children, key=lambda child: (child.create_time(), child.pid))))


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("nodes,devices,signum,to", [
    (1, 1, signal.SIGTERM, "run"),  # as `kill` or a scheduler would
    (1, 2, signal.SIGTERM, "run"),  # the launcher passes it on to every rank
    (1, 2, signal.SIGUSR1, "rank 1"),  # one rank only: the others must still stop with it
])
def test_signal_stops_every_rank_at_one_step_and_the_rerun_resumes_mid_epoch(
        tmp_path, long_data, nodes, devices, signum, to):
    command = train_command(tmp_path, long_data, nodes, devices)
    out = tmp_path / "first.log"
    proc = start_training(command, out)
    target = psutil.Process(proc.pid) if to == "run" else ranks_of(proc)[1]
    target.send_signal(signum)
    code = proc.wait(120)
    log = out.read_text()
    assert code == 128 + signum, log[-3000:]
    assert f"terminated by {signal.Signals(signum).name}" in log and "saved a checkpoint" in log
    assert "Traceback" not in log
    assert not (tmp_path / "metrics.json").exists()
    assert (tmp_path / "ckpt/last.ckpt").exists() and not (tmp_path / "ckpt/last.ckpt.partial").exists()

    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["attempts"] == 2 and metrics["resumed_mid_epoch"]
    assert metrics["resumed_from_epoch"] == 0, "the signal landed in epoch 0; lengthen the epoch"
    # epoch 0 ran in two processes and counts once, whole: its samples are a full epoch's
    assert metrics["epochs_completed"] == 2 and metrics["epoch_attempts"] == [2, 2]
    train_samples = int(LONG_SAMPLES * 0.7)
    assert metrics["steady_samples"] == pytest.approx(2 * train_samples, abs=16 * devices * nodes)
    # and its time is both parts: the time of attempt 1 is not lost from fit time
    assert metrics["fit_time_s"] == pytest.approx(sum(metrics["epoch_times_s"]), rel=1e-4)
    steady_time = sum(metrics["train_times_s"])
    assert metrics["throughput_samples_s"] == pytest.approx(metrics["steady_samples"] / steady_time, rel=1e-3)


@pytest.mark.slow
@pytest.mark.timeout(240)  # the default collective timeout (30 min) would end it here
def test_stuck_rank_ends_its_job_at_the_collective_timeout(tmp_path, long_data):
    command = train_command(tmp_path, long_data, 1, 2, "--collective-timeout-s", "10")
    out = tmp_path / "run.log"
    proc = start_training(command, out)
    stuck = ranks_of(proc)[1]
    stuck.send_signal(signal.SIGSTOP)
    start = time.monotonic()
    code = proc.wait(200)
    print(f"\nSIGSTOPped rank: its job ended {time.monotonic() - start:.1f} s later (timeout 10 s)")
    assert code != 0
    assert not stuck.is_running() or stuck.status() == psutil.STATUS_ZOMBIE, "the stuck rank was left behind"
    assert "ddpscale launch: rank 0 exited with code" in out.read_text()


def launcher_of(cwd: Path, topology: str) -> psutil.Process | None:
    for proc in psutil.process_iter(["cmdline", "cwd"]):
        cmdline = proc.info["cmdline"] or []
        if (proc.info["cwd"] == str(cwd) and f"--topology={topology}" in cmdline
                and any(a.endswith("launch_local.py") for a in cmdline)):
            return proc
    return None


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_killed_rank_fails_its_job_naming_it_the_others_finish_and_a_rerun_resumes(workspace):
    config = tiny_config(topologies=["1x1", "1x2"], max_epochs=8)
    config["dataset"]["samples"] = 6000
    workspace.write_config(config)
    proc = workspace.start_until_checkpoint("1x2")
    launcher = launcher_of(workspace.path, "1x2")
    assert launcher is not None
    victim = sorted(launcher.children(), key=lambda child: (child.create_time(), child.pid))[1]
    victim.send_signal(signal.SIGKILL)
    start = time.monotonic()
    launcher.wait(120)
    print(f"\nSIGKILLed rank: its local job failed {time.monotonic() - start:.1f} s later")
    assert proc.wait(300) != 0
    log = (workspace.results / "logs/train/1x2/r0.log").read_text()
    # "; stopping the other ranks" follows when a poll saw the kill before the peer ended too
    assert "ddpscale launch: rank 1 was killed by signal 9 (SIGKILL)" in log
    assert workspace.metrics("1x1").exists(), "keep-going: the other topology finishes"
    assert not workspace.metrics("1x2").exists()

    result = workspace.snakemake()
    assert result.returncode == 0, result.stderr[-4000:]
    metrics = json.loads(workspace.metrics("1x2").read_text())
    assert metrics["attempts"] == 2 and len(metrics["epoch_times_s"]) == 8
