"""Synthetic classification data made in memory from a seed: a compute-bound workload needs
wide inputs, and writing them to a file would only add I/O to what is measured."""

from __future__ import annotations

import pytorch_lightning as pl
import torch
from torch.utils.data import TensorDataset

from ddpscale.workloads import resident as resident_batches
from ddpscale.workloads import splits


class SyntheticDataModule(pl.LightningDataModule):
    def __init__(self, batch_size: int = 32, samples: int = 8192, features: int = 256,
                 classes: int = 10, seed: int = 0, num_workers: int = 0, resident: bool = False,
                 drop_last: bool = False):
        super().__init__()
        resident_batches.check_no_workers(resident, num_workers)
        # drop_last (training only): set by the pipeline under torch.compile, for one batch shape
        self.drop_last = drop_last
        self.batch_size, self.num_workers, self.resident = batch_size, num_workers, resident
        self.samples, self.features, self.classes, self.seed = samples, features, classes, seed
        self.splits: dict[str, TensorDataset] = {}

    def setup(self, stage: str | None = None) -> None:
        if self.splits:
            return
        gen = torch.Generator().manual_seed(self.seed)
        centres = torch.randn(self.classes, self.features, generator=gen)
        labels = torch.arange(self.samples) % self.classes
        points = centres[labels] + 2.0 * torch.randn(self.samples, self.features, generator=gen)
        train, val = int(self.samples * 0.8), int(self.samples * 0.9)
        self.splits = {"train": TensorDataset(points[:train], labels[:train]),
                       "val": TensorDataset(points[train:val], labels[train:val]),
                       "test": TensorDataset(points[val:], labels[val:])}

    def _loader(self, name: str, shuffle: bool):
        return splits.split_loader(self.splits[name], name, self.batch_size, shuffle, self.trainer,
                                   resident=self.resident, drop_last=self.drop_last,
                                   loader_args={"num_workers": self.num_workers})

    def train_dataloader(self):
        return self._loader("train", shuffle=True)

    def val_dataloader(self):
        return self._loader("val", shuffle=False)

    def test_dataloader(self):
        return self._loader("test", shuffle=False)
