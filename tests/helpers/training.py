"""train.py run for real, as the workflow runs it: the rank variables a test must not inherit,
the command on the spiral data (under the local launcher beyond one rank), a user's module
trained from a folder of its own, a run killed at its first checkpoint, and what a record must
hold (every sample counted once, the speedup the report derives)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ddpscale.job.resume import checksum
from helpers.configs import rule
from helpers.workflow import ROOT


def throughput(**changes) -> list[str]:
    """train.py's --throughput: the stopping rule of the schema's defaults, without caps, changes
    applied by their config names; a later --throughput replaces an earlier one whole."""
    return ["--throughput", json.dumps(rule(**changes).settings())]


def clean_distributed_env(monkeypatch) -> None:
    """Drop rank and SLURM variables: a test must not inherit them, nor leak its own."""
    for name in list(os.environ):
        if name.startswith(("SLURM_", "DDPSCALE_")) or name in (
            "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK",
        ):
            monkeypatch.delenv(name, raising=False)


def launched(command: list[str], nodes: int, devices: int) -> list[str]:
    """The command as the local profile starts it: alone for one rank, else under launch_local."""
    if nodes * devices == 1:
        return command
    return [sys.executable, str(ROOT / "scripts/launch_local.py"), "--nodes", str(nodes),
            "--procs-per-node", str(devices), "--", *command]


SPIRAL = ["--model-class", "ddpscale.workloads.models.SpiralMLP",
          "--data-class", "ddpscale.workloads.spiral_datamodule.SpiralDataModule"]


def train_args(data_file: Path, tmp_path: Path, nodes: int = 1, devices: int = 1) -> list[str]:
    return ["--topology", f"{nodes}x{devices}", "--num-nodes", str(nodes), "--devices-per-node", str(devices),
            *throughput(),
            "--accelerator", "cpu", "--max-epochs", "2", "--scaling", "weak", "--batch-size", "32",
            *SPIRAL, "--data-file", str(data_file),
            "--ckpt-dir", str(tmp_path / "ckpt"), "--metrics", str(tmp_path / "metrics.json")]


def train_command(tmp_path: Path, data_file: str, nodes: int, devices: int, *extra: str) -> list[str]:
    train = [sys.executable, str(ROOT / "scripts/train.py"), "--topology", f"{nodes}x{devices}",
             "--num-nodes", str(nodes), "--devices-per-node", str(devices), *throughput(), "--accelerator", "cpu",
             "--max-epochs", "2", "--scaling", "weak", "--batch-size", "32",
             "--model-class", "ddpscale.workloads.models.SpiralMLP",
             "--data-class", "ddpscale.workloads.spiral_datamodule.SpiralDataModule", "--data-file", data_file,
             "--ckpt-dir", str(tmp_path / "ckpt"), "--metrics", str(tmp_path / "metrics.json"), *extra]
    return launched(train, nodes, devices)


def run(command, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, timeout=150, cwd=ROOT, **kwargs)


def kill_after_first_checkpoint(command, tmp_path, out=subprocess.DEVNULL) -> None:
    """Start a training run and SIGKILL it once its first checkpoint is whole: signed. The file
    alone is not enough: a kill between Lightning's write and the signature leaves an unsigned
    checkpoint, which is rightly never resumed (on a busy host that window is long)."""
    proc = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    signed = checksum.sidecar(tmp_path / "ckpt/last.ckpt")
    deadline = time.monotonic() + 120
    while not signed.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert signed.exists(), "no signed checkpoint appeared before the run ended"
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def measured(tmp_path: Path, data_file: str, nodes: int, devices: int, *flags: str, log: list | None = None,
             **rule_changes) -> dict:
    """The record of a run of windows of 5 steps whose rule first looks at 5 windows, rule_changes
    (by config name: precision, max_steps, ...) applied."""
    command = train_command(tmp_path, data_file, nodes, devices,
                            *throughput(**{"window_steps": 5, "min_windows": 5, **rule_changes}), *flags)
    result = subprocess.run(command, capture_output=True, text=True, timeout=150, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    if log is not None:
        log.append(result.stdout + result.stderr)
    return json.loads((tmp_path / "metrics.json").read_text())


def run_user_module(tmp_path: Path, source: str, class_path: str, data_file: str, *flags: str,
                    nodes: int = 1, devices: int = 1, timeout: int = 280) -> subprocess.CompletedProcess:
    """train.py on the spiral data with a model module written to tmp_path as `source` (its file
    named by class_path's module) and imported from there, as a user's own module is; flags come
    last, so they override the defaults here (CPU, 2 epochs, weak scaling, batch 32 per device)."""
    (tmp_path / f"{class_path.partition('.')[0]}.py").write_text(source)
    train = [sys.executable, str(ROOT / "scripts/train.py"), "--topology", f"{nodes}x{devices}",
             "--num-nodes", str(nodes), "--devices-per-node", str(devices), *throughput(),
             "--accelerator", "cpu", "--max-epochs", "2", "--scaling", "weak",
             "--batch-size", "32", "--model-class", class_path,
             "--data-class", "ddpscale.workloads.spiral_datamodule.SpiralDataModule", "--data-file", data_file,
             "--ckpt-dir", str(tmp_path / "ckpt"), "--metrics", str(tmp_path / "metrics.json"), *flags]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT / "scripts")])}
    return subprocess.run(launched(train, nodes, devices), capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env=env)


def trained_on_one_and_two(tmp_path_factory, source: str, class_path: str, data_file: str,
                           *flags: str) -> dict[int, tuple[dict, str]]:
    """A user's module trained on 1x1 and on 1x2 (run_user_module, full mode, 3 epochs):
    {devices: (its metrics.json, what it printed)}."""
    out = {}
    for devices in (1, 2):
        folder = tmp_path_factory.mktemp(f"{class_path.partition('.')[0]}1x{devices}")
        done = run_user_module(folder, source, class_path, data_file, "--max-epochs", "3", "--measure", "full",
                               *flags, devices=devices)
        assert done.returncode == 0, done.stderr[-3000:]
        out[devices] = json.loads((folder / "metrics.json").read_text()), done.stdout + done.stderr
    return out


def assert_counted(m: dict, said: str, per_epoch: int) -> None:
    """Every epoch's samples counted once (per_epoch: the data module's true size), and the
    throughput those samples over the run's own steady train time."""
    assert m["samples_uncounted"] is None and "samples not counted" not in said
    assert m["samples_trained"] == per_epoch * m["epochs_completed"]
    steady = m["steady_epochs"]
    assert m["throughput_samples_s"] == pytest.approx(
        per_epoch * len(steady) / sum(m["train_times_s"][i] for i in steady), rel=1e-3)  # times kept to the us


def assert_speedup_of(runs: dict[int, tuple[dict, str]]) -> None:
    """The report of the 1x1 and 1x2 runs: 1x2's speedup is the ratio of their throughputs,
    and no row says its samples were not counted."""
    from helpers.records import build

    summary = build([runs[1][0], runs[2][0]]).summary.set_index("topology")
    one, two = (runs[d][0]["throughput_samples_s"] for d in (1, 2))
    assert summary.loc["1x2", "speedup"] == pytest.approx(two / one, rel=2e-2)
    assert not any("samples not counted" in str(c) for c in summary["caveats"])


def shard_flags(n: int, world: int, rank: int) -> list[bool]:
    """DistributedSampler's shard of rank: each place, whether it holds a real sample (the
    padded order repeats the first indices past n; the rank takes every world-th place)."""
    return [place < n for place in range(-(-n // world) * world)][rank::world]


def epoch_truth(sizes: dict[str, int], world: int, mode: str, batch: int = 16) -> tuple[int, int]:
    """(real samples, padding repeats) an epoch trains over all ranks, each loader's batches
    taken as the mode takes them: min_size stops with the shortest, max_size with the longest,
    max_size_cycle starts a shorter one again (what it yields again is trained again)."""
    real = padding = 0
    for rank in range(world):
        passes = {name: [shard_flags(n, world, rank)[i:i + batch] for i in range(0, -(-n // world), batch)]
                  for name, n in sizes.items()}
        lengths = [len(p) for p in passes.values()]
        steps = min(lengths) if mode == "min_size" else max(lengths)
        for batches in passes.values():
            taken = [batches[step % len(batches)] for step in range(steps)
                     if mode != "max_size" or step < len(batches)]
            real += sum(flag for b in taken for flag in b)
            padding += sum(not flag for b in taken for flag in b)
    return real, padding


def loader_sizes() -> dict[str, int]:
    from fixtures.usermods.multiloader import LabeledAndUnlabeled

    data = LabeledAndUnlabeled(batch_size=16)
    data.setup("fit")
    return {"labeled": len(data.labeled_set), "unlabeled": len(data.unlabeled_set)}
