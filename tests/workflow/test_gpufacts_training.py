"""GPU facts in a training run's metrics (tests/unit/job/device/test_gpufacts.py has the sampling and the
callback): none on the CPU; memory and NVML utilisation on a GPU, also over a throughput run's
steady windows."""

from __future__ import annotations

import json
import sys

import pytest

from helpers.devices import require_cuda
from helpers.training import run, throughput, train_command
from helpers.workflow import ROOT


@pytest.mark.slow
def test_training_on_cpu_records_no_gpu_facts(tmp_path, data_file):
    result = run(train_command(tmp_path, data_file, 1, 1, "--max-epochs", "1", "--warmup-epochs", "0"))
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["gpu_peak_memory_mb"] is None
    assert metrics["gpu_utilization_pct"] is None
    assert metrics["gpu_utilization_samples"] == 0
    assert metrics["gpu_utilization_reason"] is None  # not a GPU run: nothing to explain


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
    if samples:  # one per second of steady training; none if NVML is absent or epochs are short
        assert 0 <= metrics["gpu_utilization_pct"] <= 100
    else:
        assert metrics["gpu_utilization_pct"] is None and metrics["gpu_utilization_reason"]


@pytest.mark.gpu
@pytest.mark.slow
def test_a_throughput_run_on_a_gpu_reads_its_utilisation_over_the_steady_windows(tmp_path):
    """The first H100 run's throughput runs all had utilisation n/a. One long epoch, so NVML's
    1 s periods fit inside uninterrupted training; the precision is never reached, the step
    cap ends the run."""
    require_cuda()
    model = {"vocab_size": 256, "seq_len": 64, "d_model": 64, "n_layers": 2, "n_heads": 2, "lr": 0.003}
    data = {"vocab_size": 256, "seq_len": 64, "steps_per_epoch": 4000, "val_batches": 2, "test_batches": 2,
            "branching": 4, "seed": 0}
    command = [sys.executable, str(ROOT / "scripts/train.py"), "--topology", "1x1", "--num-nodes", "1",
               "--devices-per-node", "1", *throughput(),
               "--accelerator", "gpu", "--max-epochs", "2", "--scaling", "weak", "--batch-size", "8",
               "--measure", "throughput", *throughput(precision=0.0001, max_steps=3000),
               "--model-class", "ddpscale.workloads.transformer.TransformerLM", "--model-args", json.dumps(model),
               "--data-class", "ddpscale.workloads.markov_datamodule.MarkovTokens", "--data-args", json.dumps(data),
               "--ckpt-dir", str(tmp_path / "ckpt"), "--metrics", str(tmp_path / "metrics.json")]
    result = run(command)
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["stop_reason"] == "step cap reached"
    if metrics["gpu_utilization_reason"] and "nvidia-ml-py" in metrics["gpu_utilization_reason"]:
        pytest.skip(metrics["gpu_utilization_reason"])
    assert metrics["gpu_utilization_samples"] > 0, metrics["gpu_utilization_reason"]
    assert 0 < metrics["gpu_utilization_pct"] <= 100
