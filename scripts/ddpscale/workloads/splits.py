"""The loader of one split of a built-in data module: resident batches or a DataLoader."""

from __future__ import annotations

from torch.utils.data import DataLoader

from ddpscale.job.measure.samplecount import evaluation_sampler
from ddpscale.workloads import resident as resident_batches


def split_loader(dataset, name: str, batch_size: int, shuffle: bool, trainer, *, resident: bool,
                 drop_last: bool, loader_args: dict):
    """The loader of one split of a built-in data module: resident batches, or a DataLoader.

    Validation and test see each sample once (not DistributedSampler's padded shards); only
    training drops its last partial batch when asked (torch.compile's one shape per step).
    """
    drop_last = drop_last and name == "train"
    evaluating = name != "train"
    if resident:
        return resident_batches.from_dataset(dataset, batch_size, shuffle, trainer, drop_last=drop_last,
                                             pad=not evaluating)
    sampler = evaluation_sampler(dataset) if evaluating else None
    # for training, Lightning swaps in a DistributedSampler under DDP, so each rank reads its shard
    return DataLoader(dataset, batch_size=batch_size, shuffle=shuffle, drop_last=drop_last, sampler=sampler,
                      **loader_args)
