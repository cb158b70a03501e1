"""The probe's data wait: batches drawn from the run's own train loader on the
run's device, and data_s the wait the training loop is exposed to, not the draw's whole cost
when DataLoader workers prepare batches while a step runs."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from ddpscale.job.probe import inrun
from ddpscale.workloads.resident import ResidentBatches

from helpers.probe import fit_with_probe

STEP = {"data_s": 0.005, "compute_s": 0.002, "sync_step_s": 0.003, "method": "timed"}


def test_workers_hide_the_draw_behind_the_step_the_training_process_does_not():
    hidden = inrun.exposed_data_wait(STEP, beside_steps=True)
    assert hidden["data_drawn_s"] == 0.005 and hidden["data_s"] == pytest.approx(0.002)  # 5 ms - 3 ms step
    assert inrun.exposed_data_wait({**STEP, "data_s": 0.001}, beside_steps=True)["data_s"] == 0.0
    whole = inrun.exposed_data_wait(STEP, beside_steps=False)
    assert whole["data_s"] == whole["data_drawn_s"] == 0.005
    assert "workers" in hidden["data_method"] and "between steps" in whole["data_method"]
    assert hidden["compute_s"] == STEP["compute_s"] and hidden["method"] == "timed"  # the rest kept


def test_only_dataloader_workers_load_beside_the_steps():
    data = TensorDataset(torch.zeros(8, 2))
    assert not inrun.loads_beside_steps(DataLoader(data))
    assert inrun.loads_beside_steps(DataLoader(data, num_workers=1))
    assert not inrun.loads_beside_steps(ResidentBatches((torch.zeros(8, 2),), 4, shuffle=False))
    assert inrun.loads_beside_steps({"a": DataLoader(data), "b": DataLoader(data, num_workers=2)})


def test_the_probe_draws_training_s_own_resident_batches_on_the_run_s_device(data_file, monkeypatch, tmp_path):
    """Resident batches are built for the trainer's device; the probe slices those, not a CPU
    copy it would move."""
    from ddpscale.workloads.models import SpiralMLP
    from ddpscale.workloads.spiral_datamodule import SpiralDataModule

    monkeypatch.chdir(tmp_path)
    seen = {}
    source = inrun.batch_source

    def watched(view):
        seen["loader"], seen["device"] = view.train_dataloader, view.strategy.root_device
        return source(view)

    monkeypatch.setattr(inrun, "batch_source", watched)
    probed, trainer = fit_with_probe(SpiralMLP(), SpiralDataModule(data_file, batch_size=32, resident=True))
    assert seen["loader"] is trainer.train_dataloader and isinstance(seen["loader"], ResidentBatches)
    assert all(t.device == seen["device"] for t in seen["loader"].tensors)
    step = probed.record["step"]
    assert step["data_loads_beside_steps"] is False and step["data_s"] == step["data_drawn_s"] > 0


def test_a_probe_with_dataloader_workers_reports_the_exposed_wait(usermods):
    data = usermods.imagedata.TrainerShardedImages(batch_size=16, train_samples=37, num_workers=1)
    probed, _ = fit_with_probe(usermods.cnn.SmallCNN(), data)
    step = probed.record["step"]
    assert step["data_loads_beside_steps"] is True
    assert step["data_s"] == pytest.approx(max(0.0, step["data_drawn_s"] - step["sync_step_s"]))
