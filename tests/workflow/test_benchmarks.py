"""The performance harness runs and measures both loops; it never judges timings (those are
printed by `make bench`, see docs/performance.md)."""

import argparse
import importlib.util
import json
import re
import subprocess
import sys

import pytest

from helpers.workflow import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def loops(tmp_path, *args: str) -> dict:
    out = tmp_path / "loops.json"
    done = subprocess.run([sys.executable, "benchmarks/loops.py", *args, "--out", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text())


def test_both_loops_train_the_same_workload_and_report_throughput(tmp_path):
    result = loops(tmp_path, "--workload", "wide", "--epochs", "2", "--rounds", "2",
                   "--variant", "lightning,resident", "--variant", "plain,resident")
    assert result["workload"] == "wide" and result["world_size"] == 1 and result["batch_per_rank"] == 32
    # one steady-state figure and one first-epoch time per round for each loop, measured
    for name in ("lightning,resident", "plain,resident"):
        run = result["variants"][name]
        assert len(run["throughput"]) == 2 and all(0 < v < float("inf") for v in run["throughput"])
        assert len(run["first_epoch_s"]) == 2 and all(v > 0 for v in run["first_epoch_s"])


def test_a_diagnosis_run_takes_parts_out_of_the_lightning_loop(tmp_path, data_file):
    result = loops(tmp_path, "--workload", "spiral", "--data-file", data_file, "--epochs", "2", "--rounds", "1",
                   "--variant", "lightning,resident,bf16,no-checkpoint")
    assert list(result["variants"]) == ["lightning,resident,bf16,no-checkpoint"]
    assert result["variants"]["lightning,resident,bf16,no-checkpoint"]["throughput"][0] > 0
    assert not (ROOT / "checkpoints").exists(), "Lightning's default checkpoint callback replaced ours"


@pytest.mark.parametrize("text, message", [
    ("pytorch", "LOOP one of ('lightning', 'plain')"),
    ("lightning,fast", "OPTION of"),
    ("plain,no-checkpoint", "the plain loop has no Lightning parts to remove"),
])
def test_a_misspelt_variant_is_refused_naming_the_choices(text, message):
    loops_module = load_benchmark("loops")
    with pytest.raises(argparse.ArgumentTypeError, match=re.escape(message)):
        loops_module.Variant.parse(text)


def test_the_gap_is_split_into_priced_parts_and_the_rest():
    run = load_benchmark("run")
    steps = {run.LIGHTNING: 7.5, run.PLAIN: 4.5, "a": 7.0, "b": 6.5}
    parts = run.gap_parts(steps, {"first": "a", "second": "b"})
    assert parts == pytest.approx({"gap": 3.0, "first": 0.5, "second": 1.0, "Lightning loop (rest)": 1.5})


def load_benchmark(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / f"benchmarks/{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_two_rank_comparison_runs_as_make_bench_runs_it(tmp_path, data_file):
    # make bench died here (AttributeError: no collective_timeout_s) while every test above ran
    # one rank: the 2-rank path goes through launch_local and the SIGTERM ablation only it has
    run = load_benchmark("run")
    variants = [run.LIGHTNING, run.PLAIN, run.ABLATED["SIGTERM broadcast"]]
    res = run.compare("spiral", 2, variants, data_file, 1, tmp_path)
    assert set(res) == set(variants)
    assert all(0 < v["step_ms"] < float("inf") and v["throughput"] > 0 for v in res.values())


def test_synthetic_data_is_reproducible_and_split():
    from ddpscale.workloads.synthetic_datamodule import SyntheticDataModule

    a, b = SyntheticDataModule(samples=100, features=8, classes=4, seed=3), SyntheticDataModule(samples=100, features=8, classes=4, seed=3)
    a.setup("fit"), b.setup("fit")
    x, y = a.splits["train"].tensors
    assert x.shape == (80, 8) and set(y.tolist()) == {0, 1, 2, 3}
    assert (x == b.splits["train"].tensors[0]).all()
    assert len(a.val_dataloader().dataset) == 10 and len(a.test_dataloader().dataset) == 10


def test_callback_costs_are_timed_for_each_callback_of_ours_and_the_stock_checkpoint():
    costs = load_benchmark("callbacks").per_step_us(number=100, repeat=2)
    assert set(costs) == {"EpochTiming", "EpochCheckpoint", "FlopsCount", "ModelCheckpoint"}
    assert all(abs(us) < float("inf") for us in costs.values())  # measured, not judged


def test_the_throughput_mode_comparison_runs_as_make_bench_runs_it(tmp_path, data_file, monkeypatch):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import throughput_mode

    monkeypatch.setattr(throughput_mode, "EPOCHS", 3)
    full = throughput_mode.train(tmp_path, data_file, 1, 1, "full")
    fast = throughput_mode.train(tmp_path, data_file, 1, 1, "throughput")
    assert full["measure"] == "full" and fast["measure"] == "throughput"
    r = throughput_mode.compare(full, fast)
    # every figure the bench prints is measured: the projection from the throughput run's own record
    assert r["projection_why_na"] is None and r["projected_s"] > 0 and r["measured_s"] > 0
    assert r["full_throughput"] == full["window_throughput_samples_s"] and r["throughput"] == fast["throughput_samples_s"]
    assert r["full_epochs_throughput"] == full["throughput_samples_s"]
    assert 0 < r["training_share"] and 0 < r["held_share"]
