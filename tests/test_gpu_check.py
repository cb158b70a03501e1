"""make gpu-check (benchmarks/gpu_check.py): what it runs where, and its refusal without a GPU."""
import importlib.util
import os
import subprocess
import sys

import pytest

from conftest import ROOT

spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks/gpu_check.py")
gpu_check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_check)


@pytest.mark.parametrize("gpus, expected", [
    (1, ["1x1"]),
    (2, ["1x1", "1x2", "2x1"]),
    (4, ["1x1", "1x2", "1x4", "2x2"]),
    (6, ["1x1", "1x2", "1x4", "2x2"]),
    (8, ["1x1", "1x2", "1x4", "1x8", "2x4"]),
])
def test_every_topology_the_gpus_hold_and_no_more(gpus, expected):
    assert gpu_check.topologies_for(gpus) == expected


def test_without_a_gpu_it_stops_and_says_so():
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks/gpu_check.py")], capture_output=True, text=True,
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": ""}, timeout=60)
    assert done.returncode == 2
    assert "needs a CUDA GPU and found none" in done.stderr


def test_the_table_shows_the_figures_a_user_reads():
    run = {"topology": "1x1", "device_name": "NVIDIA H100 80GB HBM3", "fit_time_s": 11.84,
           "throughput_samples_s": 29613.0, "mfu": 0.0004, "gpu_utilization_pct": 41.0,
           "flops_per_sample": 16064, "flops_per_sample_analytic": 16064, "compile_recompiles": None}
    text = gpu_check.table([("reference", run), ("reference", {**run, "flops_per_sample": None, "mfu": None})])
    lines = text.splitlines()
    assert lines[2].split()[:2] == ["reference", "1x1"]
    assert "11.8" in lines[2] and "29,613" in lines[2] and "0.0%" in lines[2] and "16,064 = 16,064" in lines[2]
    assert "n/a != 16,064" in lines[3]


@pytest.mark.slow
def test_the_plain_loop_trains_the_preset_it_is_compared_with():
    samples_s = gpu_check.plain_throughput("config/transformer_tiny.yaml", steps=4, warmup=1, device="cpu")
    assert samples_s > 0
