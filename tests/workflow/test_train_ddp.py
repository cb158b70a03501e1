"""Real Lightning training on CPU through the local launcher: world sizes, node ranks, resume."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from helpers.devices import require_cuda
from helpers.training import kill_after_first_checkpoint, run, train_command
from helpers.workflow import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


@pytest.mark.parametrize("nodes,devices,data_args", [(1, 2, "{}"), (2, 1, "{}"), (1, 2, '{"resident": true}')])
def test_two_rank_ddp_forms_the_requested_world(tmp_path, data_file, nodes, devices, data_args):
    result = run(train_command(tmp_path, data_file, nodes, devices, "--data-args", data_args))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "terminate called" not in result.stderr, "a rank aborted at exit (tests/workflow/test_teardown.py)"
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["world_size"] == 2
    assert metrics["backend"] == "gloo"
    assert metrics["node_ranks"] == ([0, 0] if nodes == 1 else [0, 1])
    assert metrics["device_name"] == "cpu, simulated" and metrics["simulated"] is True
    assert metrics["effective_batch"] == 64
    assert metrics["epochs_completed"] == 2 and len(metrics["epoch_times_s"]) == 2
    # steady state = epoch 2 only: 840 training samples over both ranks, none dropped
    assert metrics["steady_samples"] == 840
    assert metrics["throughput_samples_s"] == pytest.approx(840 / metrics["train_times_s"][1], rel=1e-4)
    assert 0.0 <= metrics["val_acc"] <= 1.0 and 0.0 <= metrics["test_acc"] <= 1.0
    assert not (tmp_path / "ckpt/last.ckpt").exists(), "a finished run must not leave a resume checkpoint"
    # SpiralMLP 2-64-32-16-2: forward 2 x 2720 multiply-adds per sample, backward the weight
    # gradients (5440) plus the input gradients of the three upper layers (2 x 2592)
    assert metrics["flops_per_sample"] == 16064
    assert metrics["achieved_tflops"] == pytest.approx(16064 * metrics["throughput_samples_s"] / 1e12)
    assert metrics["mfu"] is None and metrics["peak_tflops_per_device"] is None  # no peak for a CPU
    assert metrics["peak_precision"] is None and metrics["flops_conv_share"] == 0.0
    # the float32 arithmetic training ran under, read by rank 0 at fit time
    assert metrics["float32_matmul_precision"] in ("highest", "high", "medium")
    assert isinstance(metrics["cuda_matmul_allow_tf32"], bool) and isinstance(metrics["cudnn_allow_tf32"], bool)


def test_each_repeat_trains_with_a_seed_of_its_own(tmp_path, data_file):
    """Issue 29 item 4: repeats are seeds (seed + repeat, recorded), so accuracy over repeats is a
    test over seeds; repeat r of another topology shares repeat r's seed."""
    finals = {}
    for repeat in (0, 1):
        out = tmp_path / f"r{repeat}"
        result = run(train_command(out, data_file, 1, 1, "--seed", "42", "--repeat", str(repeat), "--max-epochs", "1"))
        assert result.returncode == 0, result.stderr[-3000:]
        metrics = json.loads((out / "metrics.json").read_text())
        assert metrics["seed"] == 42 + repeat
        finals[repeat] = metrics["val_loss"]
    assert finals[0] != finals[1], "two repeats trained the same seed"


def test_killed_run_resumes_from_its_last_checkpoint(tmp_path, data_file):
    command = train_command(tmp_path, data_file, 1, 1)
    command[command.index("--max-epochs") + 1] = "8"
    kill_after_first_checkpoint(command, tmp_path)
    assert not (tmp_path / "metrics.json").exists()

    result = run(command)
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["attempts"] == 2
    assert metrics["resumed_from_epoch"] >= 1
    # each epoch counted once: the interrupted partial epoch is not in the total
    assert metrics["epochs_completed"] == 8 and len(metrics["epoch_times_s"]) == 8
    assert metrics["fit_time_s"] == pytest.approx(sum(metrics["epoch_times_s"]), rel=1e-4)
    # the resumed process had its own cold epoch: it is warm-up too, not steady state
    resumed = metrics["resumed_from_epoch"]
    assert metrics["epoch_attempts"] == [1] * resumed + [2] * (8 - resumed)
    cold = {0, resumed}
    assert metrics["steady_epochs"] == [i for i in range(8) if i not in cold]
    steady_time = sum(metrics["train_times_s"][i] for i in metrics["steady_epochs"])
    assert metrics["throughput_samples_s"] == pytest.approx(metrics["steady_samples"] / steady_time, rel=1e-3)


def test_checkpoint_of_other_settings_is_not_resumed(tmp_path, data_file):
    first = run(train_command(tmp_path, data_file, 1, 1))
    assert first.returncode == 0
    # plant a checkpoint as if a run with other settings had been killed
    (tmp_path / "ckpt").mkdir(exist_ok=True)
    (tmp_path / "ckpt/last.ckpt").write_bytes(b"not a checkpoint")
    (tmp_path / "ckpt/fingerprint.json").write_text(json.dumps({"fingerprint": "other"}))
    result = run(train_command(tmp_path, data_file, 1, 1))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "written with other settings" in result.stdout
    assert json.loads((tmp_path / "metrics.json").read_text())["attempts"] == 1


def test_non_finite_loss_stops_with_a_clear_message(tmp_path, data_file):
    result = run(train_command(tmp_path, data_file, 1, 2, "--model-args", '{"lr": 1e30}'))
    assert result.returncode != 0
    assert "non-finite" in result.stderr and "learning rate" in result.stderr
    assert not (tmp_path / "metrics.json").exists()


def test_corrupt_data_file_names_the_fix(tmp_path, data_file):
    corrupt = tmp_path / "data.npz"
    corrupt.write_bytes(Path(data_file).read_bytes()[:-10] + b"0123456789")
    (tmp_path / "manifest.json").write_text(Path(data_file).with_name("manifest.json").read_text())
    result = run(train_command(tmp_path, str(corrupt), 1, 1))
    assert result.returncode == 3
    assert "does not match its manifest checksum" in result.stderr
    assert "regenerate" in result.stderr


def test_launcher_stops_every_rank_when_one_fails(tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(
        "import os, sys, time\n"
        "if os.environ['RANK'] == '1':\n    sys.exit(7)\n"
        "time.sleep(60)\n"
    )
    start = time.monotonic()
    result = run([sys.executable, str(ROOT / "scripts/launch_local.py"), "--nodes", "2",
                  "--procs-per-node", "2", "--", sys.executable, str(script)])
    assert result.returncode == 7
    assert time.monotonic() - start < 30, "the surviving ranks were not stopped"


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed", "bf16-true"])
def test_single_gpu_run_reports_the_gpu_and_its_mfu(tmp_path, data_file, precision):
    # The default data path (resident batches on the GPU): the first H100 run had MFU n/a on
    # every such run while a DataLoader test passed.
    torch = require_cuda()
    command = train_command(tmp_path, data_file, 1, 1, "--data-args", '{"resident": true}',
                            "--precision", precision)
    command[command.index("--accelerator") + 1] = "gpu"
    result = run(command)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "could not count FLOPs" not in result.stdout
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["device_kind"] == "cuda" and metrics["simulated"] is False and metrics["world_size"] == 1
    assert metrics["device_name"] == torch.cuda.get_device_name(0)
    assert metrics["flops_per_sample"] == metrics["flops_per_sample_analytic"] == 16064
    assert metrics["peak_tflops_per_device"] is not None, f"no peak known for {metrics['device_name']}"
    assert 0 < metrics["mfu"] < 1


def test_retry_of_a_finished_run_reemits_its_metrics_but_a_new_command_retrains(tmp_path, data_file):
    """A job killed after it finished (SLURM time limit during exit) is not trained twice."""
    command = train_command(tmp_path, data_file, 1, 1)
    assert run(command).returncode == 0
    first = (tmp_path / "metrics.json").read_text()
    (tmp_path / "metrics.json").unlink()  # what Snakemake does to a job reported as failed

    retry = run(command + ["--attempt", "2"])
    assert retry.returncode == 0 and "finished in an earlier attempt" in retry.stdout
    assert (tmp_path / "metrics.json").read_text() == first

    again = run(command)  # a new command, attempt 1: measure afresh
    assert again.returncode == 0 and "finished in an earlier attempt" not in again.stdout
    assert json.loads((tmp_path / "metrics.json").read_text())["started_at"] >= json.loads(first)["finished_at"]


def test_a_world_smaller_than_the_topology_fails_at_fit_start():
    """Ranks that never started must fail the run, not shrink it."""
    from types import SimpleNamespace

    from ddpscale.job.measure.timing import EpochTiming, WorldSizeError

    one_rank = SimpleNamespace(global_rank=0, node_rank=0, local_rank=0)  # no process group
    module = SimpleNamespace(device="cpu")
    EpochTiming(expected_world_size=1).on_fit_start(one_rank, module)
    with pytest.raises(WorldSizeError, match="has 1 rank\\(s\\) but the topology asks for 2"):
        EpochTiming(expected_world_size=2).on_fit_start(one_rank, module)
