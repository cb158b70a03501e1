"""The performance harness runs and measures both loops; it never judges timings (those are
printed by `make bench`, see docs/performance.md)."""

import json
import subprocess
import sys

import pytest

from conftest import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_both_loops_train_the_same_workload_and_report_throughput(tmp_path):
    out = tmp_path / "wide.json"
    cmd = [sys.executable, "benchmarks/loops.py", "--workload", "wide", "--epochs", "2", "--rounds", "2",
           "--resident", "--out", str(out)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["workload"] == "wide" and result["world_size"] == 1 and result["batch_per_rank"] == 32
    assert result["resident"] is True and result["compile"] == "none"
    # one steady-state figure per round for each loop, measured (positive, finite)
    for kind in ("lightning", "plain"):
        assert len(result[kind]) == 2 and all(0 < v < float("inf") for v in result[kind])
    assert len(result["lightning_first_epoch_s"]) == 2


def test_a_fast_path_run_measures_the_lightning_loop_alone(tmp_path, data_file):
    out = tmp_path / "spiral.json"
    cmd = [sys.executable, "benchmarks/loops.py", "--workload", "spiral", "--data-file", data_file,
           "--epochs", "2", "--rounds", "1", "--lightning-only", "--resident", "--precision", "bf16-mixed",
           "--out", str(out)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["precision"] == "bf16-mixed" and result["plain"] == []
    assert len(result["lightning"]) == 1 and result["lightning"][0] > 0


def test_synthetic_data_is_reproducible_and_split():
    from ddpscale.synthetic_datamodule import SyntheticDataModule

    a, b = SyntheticDataModule(samples=100, features=8, classes=4, seed=3), SyntheticDataModule(samples=100, features=8, classes=4, seed=3)
    a.setup("fit"), b.setup("fit")
    x, y = a.splits["train"].tensors
    assert x.shape == (80, 8) and set(y.tolist()) == {0, 1, 2, 3}
    assert (x == b.splits["train"].tensors[0]).all()
    assert len(a.val_dataloader().dataset) == 10 and len(a.test_dataloader().dataset) == 10
