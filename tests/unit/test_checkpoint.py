"""EpochCheckpoint: the resume file written at each epoch end, with no per-step work."""

from __future__ import annotations


import pytorch_lightning as pl
import torch

from ddpscale.job import build
from ddpscale.plan.runspec import RunSpec
from ddpscale.job.checkpoint import EpochCheckpoint, epoch_checkpoint
from ddpscale.workloads.models import SpiralMLP
from ddpscale.workloads.resident import ResidentBatches


class TinyData(pl.LightningDataModule):
    def __init__(self):
        super().__init__()
        self.x, self.y = torch.randn(64, 2), torch.randint(0, 2, (64,))

    def train_dataloader(self):
        return ResidentBatches((self.x, self.y), 16, shuffle=True)


def test_state_key_is_formatted_once_and_names_the_settings(tmp_path):
    ckpt = epoch_checkpoint(str(tmp_path))
    first = ckpt.state_key
    assert ckpt.state_key is first, "formatted again: the cache is not used"
    assert first.startswith("EpochCheckpoint{") and "'every_n_epochs': 1" in first


def test_each_epoch_end_rewrites_one_file_and_steps_write_nothing(tmp_path):
    ckpt = epoch_checkpoint(str(tmp_path / "ckpt"))
    seen = []

    class Watch(pl.Callback):
        def on_train_batch_end(self, trainer, *args):
            seen.append(sorted(p.name for p in (tmp_path / "ckpt").glob("*")) if (tmp_path / "ckpt").exists() else [])

    spec = RunSpec(topology="1x1", nodes=1, devices=1, model_class="m.M", data_class="d.D", scaling="weak",
                   batch_size=16, max_epochs=2, accelerator="cpu")
    trainer = build.build_trainer(spec, [Watch(), ckpt])
    trainer.fit(SpiralMLP(), datamodule=TinyData())
    assert seen[:4] == [[]] * 4, "a checkpoint appeared during the first epoch"
    assert seen[4:] == [["last.ckpt"]] * 4, "epoch 1 did not leave exactly last.ckpt"
    saved = torch.load(tmp_path / "ckpt/last.ckpt", weights_only=False)
    assert saved["epoch"] == 1 and ckpt.state_key in saved["callbacks"]
    assert isinstance(ckpt, EpochCheckpoint)
