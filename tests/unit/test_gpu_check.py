"""make gpu-check (benchmarks/gpu_check.py): what it runs where, the table it prints, the figures
it keeps when stopped midway, and its refusal without a GPU."""
import json
import os
import subprocess
import sys

import pytest

from helpers.devices import gpu_check
from helpers.workflow import ROOT


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


def test_a_check_stopped_midway_keeps_the_figures_of_the_workloads_it_finished(tmp_path, monkeypatch):
    """A lent GPU's time ran out in the third workload: the first two's figures were lost with
    it, because the file was written only at the end."""
    from types import SimpleNamespace

    run = {"topology": "1x1", "device_name": "NVIDIA H200", "fit_time_s": 43.9, "throughput_samples_s": 8558.8,
           "mfu": 0.0, "gpu_utilization_pct": None, "flops_per_sample": 16064, "flops_per_sample_analytic": 16064,
           "compile_recompiles": None}
    done = []

    def workload(snakemake, name, topologies):
        if len(done) == 2:
            raise KeyboardInterrupt  # the device's limit: the process is killed
        done.append(name)
        return 0, [{**run, "workload_seen": name}]

    monkeypatch.setattr(gpu_check, "visible_gpus", lambda: SimpleNamespace(count=1, source="test"))
    monkeypatch.setattr(gpu_check, "snakemake_command", lambda: ["snakemake"])
    monkeypatch.setattr(gpu_check, "run_workload", workload)
    out = tmp_path / "figures.json"
    with pytest.raises(KeyboardInterrupt):
        gpu_check.main(["--skip-tests", "--out", str(out)])
    figures = json.loads(out.read_text())
    assert [r["workload"] for r in figures["runs"]] == done == ["reference", "transformer"]
    assert figures["runs"][0]["throughput_samples_s"] == 8558.8 and not list(tmp_path.glob("*.part"))
