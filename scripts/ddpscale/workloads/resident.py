"""Batches sliced from tensors held in memory, instead of a DataLoader collating samples.

A DataLoader over a TensorDataset indexes every sample and stacks them again: for a small
dataset that fits on the device, that Python work is most of a step (docs/performance.md).
Here one epoch is one permutation, and a batch is one index_select per tensor.

Lightning only swaps samplers in real DataLoaders, so the DDP sharding that a
DistributedSampler would do is done here, with the same rules: indices padded by wrapping
to a multiple of the world size (every rank takes the same number of steps, or DDP hangs),
rank r taking every world-th index from r. Lightning calls `sampler.set_epoch` on every
train/val dataloader at each epoch start, also after a resume, so the shuffle order of
epoch e is the same whether the run was interrupted or not.
"""

from __future__ import annotations

import math
import os

import torch
import torch.distributed as dist


def rank_and_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def shard_indices(n: int, rank: int, world: int, order: torch.Tensor | None = None, pad: bool = True) -> torch.Tensor:
    """This rank's indices of n samples in the given order (DistributedSampler's padding rule;
    pad=False: no repeats, ranks may differ by one sample, for evaluation: ddpscale.job.measure.samplecount)."""
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is outside a world of {world}")
    order = torch.arange(n) if order is None else order
    total = math.ceil(n / world) * world if pad else n
    if total > n:
        order = torch.cat([order, order[: total - n]])
    return order[rank:total:world]


class ResidentBatches:
    def __init__(self, tensors: tuple[torch.Tensor, ...], batch_size: int, shuffle: bool,
                 seed: int = 0, device: torch.device | str | None = None, drop_last: bool = False,
                 pad: bool = True):
        if not tensors or any(len(t) != len(tensors[0]) for t in tensors):
            raise ValueError("resident batches need tensors of equal length")
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, not {batch_size}")
        self.tensors = tuple(t.to(device) for t in tensors) if device is not None else tuple(tensors)
        self.batch_size, self.shuffle, self.seed = batch_size, shuffle, seed
        # drop_last: no partial last batch, so a compiled step sees one shape (no recompile)
        self.drop_last = drop_last
        self.pad = pad  # False for validation and test: each sample once (ddpscale.job.measure.samplecount)
        self.epoch = 0
        self.rank, self.world = rank_and_world()
        # Lightning reads these DataLoader attributes: set_epoch is called on `sampler`, and
        # `batch_sampler` is looked up when it checks val/test loaders for shuffling
        self.sampler, self.batch_sampler = self, None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _indices(self) -> torch.Tensor:
        n = len(self.tensors[0])
        order = None
        if self.shuffle:
            # the same permutation on every rank, as DistributedSampler draws it
            order = torch.randperm(n, generator=torch.Generator().manual_seed(self.seed + self.epoch))
        return shard_indices(n, self.rank, self.world, order, self.pad).to(self.tensors[0].device)

    def samples_per_rank(self) -> int:
        """Samples this rank draws in an epoch, the padding repeat included (as a sampler's len)."""
        n = len(self.tensors[0])
        per_rank = math.ceil(n / self.world) if self.pad else len(range(self.rank, n, self.world))
        return per_rank // self.batch_size * self.batch_size if self.drop_last else per_rank

    def __len__(self) -> int:
        return math.ceil(self.samples_per_rank() / self.batch_size)

    def __iter__(self):
        indices = self._indices()
        for start in range(0, len(self) * self.batch_size, self.batch_size):
            chosen = indices[start:start + self.batch_size]
            yield tuple(t.index_select(0, chosen) for t in self.tensors)


def check_no_workers(resident: bool, num_workers: int) -> None:
    if resident and num_workers > 0:
        raise ValueError("data.init_args.resident slices batches in the training process, so it takes no "
                         "DataLoader workers; set dataloader.num_workers: 0 or data.init_args.resident: false")


def from_dataset(dataset, batch_size: int, shuffle: bool, trainer=None, drop_last: bool = False,
                 pad: bool = True) -> ResidentBatches:
    """A TensorDataset's tensors as resident batches, on the trainer's device when the data
    module is attached to one (outside a Trainer they stay where they are).

    The shuffle seed is the one Lightning gives its DistributedSampler: PL_GLOBAL_SEED, set by
    pl.seed_everything, else 0. It must be the same on every rank, or the shards overlap."""
    device = trainer.strategy.root_device if trainer is not None else None
    return ResidentBatches(dataset.tensors, batch_size, shuffle, seed=int(os.environ.get("PL_GLOBAL_SEED", 0)),
                           device=device, drop_last=drop_last, pad=pad)
