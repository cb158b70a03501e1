"""LightningDataModule over the prepared spiral file. Never generates data itself."""

from __future__ import annotations

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from ddpscale.workloads import resident as resident_batches
from ddpscale.workloads import splits
from ddpscale.core.spiral import load_checked


class SpiralDataModule(pl.LightningDataModule):
    def __init__(self, data_file: str, batch_size: int = 32, num_workers: int = 0,
                 pin_memory: bool = False, persistent_workers: bool = False,
                 prefetch_factor: int | None = None, resident: bool = False, drop_last: bool = False):
        super().__init__()
        resident_batches.check_no_workers(resident, num_workers)
        self.data_file = data_file
        # drop_last (training only): set by the pipeline under torch.compile, for one batch shape
        self.drop_last = drop_last
        self.batch_size, self.resident = batch_size, resident
        self.loader_args = {"num_workers": num_workers, "pin_memory": pin_memory}
        if num_workers > 0:
            # DataLoader rejects these two without worker processes
            self.loader_args["persistent_workers"] = persistent_workers
            self.loader_args["prefetch_factor"] = prefetch_factor
        self.splits: dict[str, TensorDataset] = {}

    def setup(self, stage: str | None = None) -> None:
        if self.splits:
            return
        arrays = load_checked(self.data_file)
        for name in ("train", "val", "test"):
            self.splits[name] = TensorDataset(
                torch.from_numpy(arrays[f"x_{name}"]), torch.from_numpy(arrays[f"y_{name}"])
            )

    def _loader(self, name: str, shuffle: bool):
        return splits.split_loader(self.splits[name], name, self.batch_size, shuffle, self.trainer,
                                   resident=self.resident, drop_last=self.drop_last,
                                   loader_args=self.loader_args)

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", shuffle=False)
