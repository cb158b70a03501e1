"""Every training sample counted once, when the data does not divide by the world size.

DistributedSampler (and ddpscale.workloads.resident, which follows it) pads each epoch to a multiple of
the world size by repeating the first indices, so every rank takes the same number of steps
(DDP's collectives need that in training). Index i of the padded order goes to rank
i % world at position i // world, so the repeats are the last position of the ranks from
n % world up: rank r holds len(range(r, n, world)) real samples, then at most one repeat.
Throughput counts the real ones only. The shard is read from the sampler the loader really
uses: Lightning's own, or a DistributedSampler the data module built itself (from
torch.distributed or from its trainer), with that sampler's num_replicas, rank and drop_last.
Evaluation is sharded without padding (ddpscale.training.samplecount).

Lightning keeps a DistributedSampler it finds and wraps any other sampler in its
DistributedSamplerWrapper, which shards the sampler's indices by rank: a custom sampler that
already shards by rank (but is not a DistributedSampler) is then sharded twice, and each rank
reads about 1/world^2 of the data. That is what sharded_twice() warns about.
"""

from __future__ import annotations

from torch.utils.data import DistributedSampler, Sampler


def real_samples(n: int, rank: int, world: int) -> int:
    """Samples of an n-sample epoch that rank holds before any padding."""
    return len(range(rank, n, world))


def shard_of(loader) -> tuple[int, int, int] | None:
    """(n, rank, world) of a loader sharded with padding, or None when nothing is repeated
    (one rank, drop_last sharding, an unpadded or unknown sampler): then every sample counts."""
    from ddpscale.workloads.resident import ResidentBatches

    if isinstance(loader, ResidentBatches):
        return (len(loader.tensors[0]), loader.rank, loader.world) if loader.pad and loader.world > 1 else None
    sampler = getattr(loader, "sampler", None)
    if isinstance(sampler, DistributedSampler) and not sampler.drop_last and sampler.num_replicas > 1:
        n = len(sampler.dataset)
        if sampler.total_size > n:  # not an unpadded sampler (UnrepeatedDistributedSampler: total_size == n)
            return n, sampler.rank, sampler.num_replicas
    return None


def counted(seen: int, shard: tuple[int, int, int] | None) -> int:
    """Samples to count of `seen` taken in order from the start of a rank's shard: the padding
    repeat sits at its end, so whatever goes beyond the real samples is a repeat."""
    return seen if shard is None else min(seen, real_samples(*shard))


def sharded_twice(loaders, world_size: int) -> str | None:
    """A warning when Lightning wrapped a sampler that declares it shards by rank itself
    (num_replicas > 1) but is not a DistributedSampler; None otherwise. loaders: the trainer's
    train_dataloader (one loader, or a list or dict of them)."""
    from lightning_fabric.utilities.distributed import DistributedSamplerWrapper

    if isinstance(loaders, dict):
        loaders = list(loaders.values())
    for loader in loaders if isinstance(loaders, (list, tuple)) else [loaders]:
        sampler = getattr(loader, "sampler", None)
        if not isinstance(sampler, DistributedSamplerWrapper):
            continue
        inner = sampler.dataset._sampler  # the user's sampler, as Lightning wrapped it
        replicas = getattr(inner, "num_replicas", None)
        if isinstance(replicas, int) and replicas > 1:
            return (f"ddpscale: warning: the train dataloader's sampler {type(inner).__name__} shards by rank "
                    f"itself (num_replicas={replicas}) but is not a torch DistributedSampler, so Lightning "
                    f"sharded it again: each rank reads about 1/{replicas * world_size} of the training set. "
                    "Make it a subclass of torch.utils.data.DistributedSampler (Lightning keeps those), or "
                    "pass a plain sampler and let Lightning shard it")
    return None


def epoch_samples_here(loader, batches: int, batch_size: int) -> int:
    """Real samples this rank trains in one whole epoch of `batches` batches (Lightning's
    num_training_batches, after limit_train_batches): what its sampler draws, where it says
    (a short last batch is not a full one), without the padding repeat."""
    full = batches * batch_size
    drawn = None
    if hasattr(loader, "samples_per_rank"):  # ddpscale.workloads.resident
        drawn = loader.samples_per_rank()
    else:
        sampler = getattr(loader, "sampler", None)
        try:
            drawn = len(sampler) if isinstance(sampler, Sampler) else None
        except TypeError:  # a sampler without a length
            drawn = None
    return counted(full if drawn is None else min(full, drawn), shard_of(loader))
