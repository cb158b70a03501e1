"""The probe runs inside the first repeat's training job (train.py --probe), on the process
group Lightning formed, before the first epoch: one allocation per topology and repeat."""

from __future__ import annotations

import json
import os

import pytest

from helpers.training import kill_after_first_checkpoint, run, train_command

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def trained(tmp_path, data_file, nodes, devices, *extra):
    result = run(train_command(tmp_path, data_file, nodes, devices, "--seed", "7", *extra))
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads((tmp_path / "metrics.json").read_text()), result.stdout


def test_probed_run_trains_as_an_unprobed_one_would(tmp_path, data_file):
    probed, log = trained(tmp_path / "probed", data_file, 1, 2, "--probe")
    plain, plain_log = trained(tmp_path / "plain", data_file, 1, 2)

    probe = probed["probe"]
    assert probe["world_size"] == 2 and probe["node_ranks"] == [0, 0] and probe["backend"] == "gloo"
    assert probe["allreduce"][-1]["bytes"] == probe["gradient_bytes"] and probe["step"]["compute_s"] > 0
    # Lightning's per-batch SIGTERM broadcast, timed on the run's two ranks
    step = probe["step"]
    assert step["sync_step_with_loop_sync_s"] > 0 and step["loop_sync_s"] == max(0.0, step["loop_sync_diff_s"])
    assert "compute_by_batch" not in step, "only the baseline times other batch sizes"
    assert log.count("ddpscale probe: 1x2 world size 2") == 1 and "ddpscale probe:" not in plain_log
    assert "probe" not in plain
    # the probe draws random numbers (a model, a shuffled loader): training must not see them
    for key in ("val_loss", "val_acc", "test_acc"):
        assert probed[key] == plain[key], key
    # fit_wall_s is training's: the probe's time is its own figure
    assert probe["probe_wall_s"] > 0 and probed["fit_wall_s"] >= probed["fit_time_s"]
    # the devices were held from the process's start to the record: start-up, the probe, the
    # epochs and the test pass, so more than training and the probe together
    assert probed["held_from"] == "process start"
    assert probed["held_s"] >= probed["fit_wall_s"] + probe["probe_wall_s"]
    # every epoch's samples over both ranks: the 840 training samples twice
    assert probed["samples_trained"] == plain["samples_trained"] == 840 * 2


def test_the_baseline_times_its_compute_at_every_batch_it_is_given(tmp_path, data_file):
    """train.py --probe-batch-sizes (the workflow gives the baseline every topology's per-device
    batch): the probe's record holds the compute at each, its own batch (32) its own timing."""
    metrics, _ = trained(tmp_path, data_file, 1, 1, "--probe", "--probe-batch-sizes", "[8, 16, 32]")
    step = metrics["probe"]["step"]
    assert [r["batch_per_device"] for r in step["compute_by_batch"]] == [8, 16, 32]
    assert step["compute_by_batch"][2]["compute_s"] == step["compute_s"]
    assert all(r["compute_s"] > 0 for r in step["compute_by_batch"]), step["compute_by_batch"]
    assert step["loop_sync_s"] == 0, "one rank: Lightning does not broadcast"


def test_resumed_run_keeps_its_probe_and_does_not_probe_again(tmp_path, data_file):
    command = train_command(tmp_path, data_file, 1, 1, "--probe")
    command[command.index("--max-epochs") + 1] = "8"
    first_log = tmp_path / "first.log"
    with open(first_log, "w") as out:
        kill_after_first_checkpoint(command, tmp_path, out)
    assert "ddpscale probe: 1x1" in first_log.read_text()

    result = run(command)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "ddpscale probe:" not in result.stdout, "the resumed run probed again"
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["attempts"] == 2 and metrics["resumed_from_epoch"] >= 1
    assert metrics["probe"]["topology"] == "1x1" and metrics["probe"]["world_size"] == 1


def test_a_probe_that_fails_on_one_rank_is_na_on_every_rank_and_the_run_trains(tmp_path, data_file):
    """Rank 1 alone cannot copy its module: rank 0, which could, must not wait for it in a
    collective. Both agree the probe is n/a (naming rank 1) and train."""
    (tmp_path / "lockmods.py").write_text(
        "import threading\n\n"
        "from ddpscale.workloads.models import SpiralMLP\n\n\n"
        "class LockOnRankOne(SpiralMLP):\n"
        "    def setup(self, stage):\n"
        "        if self.trainer.global_rank == 1:\n"
        "            self.lock = threading.Lock()  # trains fine, but cannot be deep-copied\n")
    command = train_command(tmp_path, data_file, 1, 2, "--probe")
    command[command.index("--model-class") + 1] = "lockmods.LockOnRankOne"
    result = run(command, env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    reason = "TypeError: cannot pickle '_thread.lock' object (in copying the module, rank 1)"
    assert metrics["probe"] == {"status": "n/a", "reason": reason, "topology": "1x2",
                                "world_size": 2}
    assert result.stdout.count(f"ddpscale probe: n/a for 1x2: {reason}; training goes on") == 1
    assert metrics["epochs_completed"] == 2 and metrics["world_size"] == 2
