"""GPU facts of a training run: peak memory and nvidia-smi utilisation (ddpscale.measurement.gpufacts)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from ddpscale.measurement import gpufacts

from conftest import require_cuda
from test_train_ddp import run, train_command


def test_parse_utilization():
    assert gpufacts.parse_utilization("87\n") == 87
    assert gpufacts.parse_utilization("\n  5 \n") == 5
    assert gpufacts.parse_utilization("100 %") == 100
    assert gpufacts.parse_utilization("[N/A]") is None
    assert gpufacts.parse_utilization("") is None
    assert gpufacts.parse_utilization("No devices were found") is None


def test_smi_index_maps_through_cuda_visible_devices():
    assert gpufacts.smi_index(1, "") == "1"
    assert gpufacts.smi_index(1, "4,6") == "6"
    assert gpufacts.smi_index(0, "GPU-1a2b, GPU-3c4d") == "GPU-1a2b"


def test_gpu_summary_over_ranks():
    ranks = [{"peak_memory_mb": 100.0, "utilization": [50, 70]},
             {"peak_memory_mb": 250.5, "utilization": [90]}]
    # each rank's mean (60, 90), then the mean over ranks; samples counted over ranks
    assert gpufacts.summarize(ranks) == {"gpu_peak_memory_mb": 250.5, "gpu_utilization_pct": 75.0,
                                         "gpu_utilization_samples": 3}
    no_samples = [{"peak_memory_mb": 10.0, "utilization": []}]
    assert gpufacts.summarize(no_samples) == {"gpu_peak_memory_mb": 10.0, "gpu_utilization_pct": None,
                                              "gpu_utilization_samples": 0}
    assert gpufacts.peak_memory_mb("cpu") is None


# -- utilisation sampler with a stand-in nvidia-smi (this machine has no GPU) ---------------

def _fake_smi(folder: Path, body: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "nvidia-smi"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(0o755)
    return folder


def test_sampler_collects_what_nvidia_smi_prints(tmp_path, monkeypatch):
    calls = tmp_path / "calls.txt"
    bin_dir = _fake_smi(tmp_path / "bin", f'echo "$@" >> {calls}\necho 42\n')
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,3")
    sampler = gpufacts.UtilizationSampler(1, interval_s=0.02).start()
    deadline = time.monotonic() + 20
    while len(sampler.samples) < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    samples = sampler.stop()
    assert len(samples) >= 3 and set(samples) == {42}
    first_call = calls.read_text().splitlines()[0].split()
    assert "--query-gpu=utilization.gpu" in first_call and "--format=csv,noheader,nounits" in first_call
    assert first_call[-2:] == ["-i", "3"], "local CUDA device 1 is physical GPU 3 here"
    count = len(samples)
    time.sleep(0.1)
    assert len(sampler.samples) == count, "sampling went on after stop()"


def test_sampler_without_nvidia_smi_returns_nothing(tmp_path, monkeypatch):
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    sampler = gpufacts.UtilizationSampler(0, interval_s=0.01).start()
    time.sleep(0.05)
    assert sampler.stop() == []


def test_sampler_stops_quietly_when_nvidia_smi_fails(tmp_path, monkeypatch):
    bin_dir = _fake_smi(tmp_path / "bin", "echo 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    sampler = gpufacts.UtilizationSampler(0, interval_s=0.01).start()
    time.sleep(0.2)
    assert sampler.stop() == []


# -- GPU facts in a training run's metrics ---------------------------------------------------

@pytest.mark.slow
def test_training_on_cpu_records_no_gpu_facts(tmp_path, data_file):
    result = run(train_command(tmp_path, data_file, 1, 1, "--max-epochs", "1", "--warmup-epochs", "0"))
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["gpu_peak_memory_mb"] is None
    assert metrics["gpu_utilization_pct"] is None
    assert metrics["gpu_utilization_samples"] == 0


@pytest.mark.gpu
@pytest.mark.slow
def test_training_on_a_gpu_records_its_memory_and_utilization(tmp_path, data_file):
    require_cuda()
    result = run(train_command(tmp_path, data_file, 1, 1, "--accelerator", "gpu", "--max-epochs", "3",
                               "--warmup-epochs", "0", "--batch-size", "8"))
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["gpu_peak_memory_mb"] > 0
    samples = metrics["gpu_utilization_samples"]
    if samples:  # one per second of fit; none if nvidia-smi is absent or fit took under a second
        assert 0 <= metrics["gpu_utilization_pct"] <= 100
    else:
        assert metrics["gpu_utilization_pct"] is None
