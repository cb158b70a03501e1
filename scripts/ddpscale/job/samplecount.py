"""Every training sample counted once, when the data does not divide by the world size.

DistributedSampler (and ddpscale.workloads.resident, which follows it) pads each epoch to a multiple of
the world size by repeating the first indices, so every rank takes the same number of steps
(DDP's collectives need that in training). Index i of the padded order goes to rank
i % world at position i // world, so the repeats are the last position of the ranks from
n % world up: rank r holds len(range(r, n, world)) real samples, then at most one repeat.
Throughput counts the real ones only. The shard is read from the sampler the loader really
uses: Lightning's own, or a DistributedSampler the data module built itself (from
torch.distributed or from its trainer), with that sampler's num_replicas, rank and drop_last.
Evaluation is sharded without padding (ddpscale.job.evalsampler).

Lightning keeps a DistributedSampler it finds and wraps any other sampler in its
DistributedSamplerWrapper, which shards the sampler's indices by rank: a custom sampler that
already shards by rank (but is not a DistributedSampler) is then sharded twice, and each rank
reads about 1/world^2 of the data. That is what sharded_twice() warns about.

How many samples a batch holds is not guessed from its first tensor (a padding collator's
BatchEncoding, a sequence-first tensor, a tuple whose first element is not batched all fool
that). It comes from the loader's own accounting where it has one (LoaderPlan: batch i of a
rank's n drawn samples holds min(batch_size, n - i * batch_size)), cross-checked against
every tensor of the batch along the batch dimension (config batch.dim, 0 by default), or from
the module's own `samples_in_batch(batch)` where it states it. Where the two disagree, or
neither can tell, the batch is uncounted and the run says why (samples_of): a per-sample
figure is then n/a, never a wrong one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler, Sampler

# What the run says where a batch cannot be counted: the two ways to tell ddpscale
DECLARE = ("set config batch.dim to the dimension of the batch's tensors that indexes samples, or give "
           "the module a samples_in_batch(self, batch) method that returns the number")


def real_samples(n: int, rank: int, world: int) -> int:
    """Samples of an n-sample epoch that rank holds before any padding."""
    return len(range(rank, n, world))


def is_resident(loader) -> bool:
    """A loader of ddpscale.workloads.resident, known by what it offers: the workloads build on
    the job's code, so importing them here would turn the arrow between the two around."""
    return callable(getattr(loader, "samples_per_rank", None)) and hasattr(loader, "tensors")


def shard_of(loader) -> tuple[int, int, int] | None:
    """(n, rank, world) of a loader sharded with padding, or None when nothing is repeated
    (one rank, drop_last sharding, an unpadded or unknown sampler): then every sample counts."""
    if is_resident(loader):
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
    if is_resident(loader):
        drawn = loader.samples_per_rank()
    else:
        sampler = getattr(loader, "sampler", None)
        try:
            drawn = len(sampler) if isinstance(sampler, Sampler) else None
        except TypeError:  # a sampler without a length
            drawn = None
    return counted(full if drawn is None else min(full, drawn), shard_of(loader))


class BatchSizeError(RuntimeError):
    pass


def batch_size_problem(loader, per_device: int) -> str | None:
    """Why the run cannot measure what it was asked to, where the train loader's fixed batch
    is not the batch per device ddpscale gave the data module (it ignores its batch_size):
    every figure about the batch, strong or weak scaling, the probe's prediction, would be of
    another batch. None where it is, or where batches have no fixed size (a batch sampler of
    the user's own)."""
    plan = loader_plan(loader)
    if plan is None or plan.batch_size == per_device:
        return None
    return (f"the train dataloader's batch_size is {plan.batch_size}, but ddpscale gave the data module a batch "
            f"per device of {per_device} (config batch.size and batch.scaling): the data module does not use "
            "its batch_size argument; pass self.batch_size to the DataLoader in its train_dataloader")


@dataclass(frozen=True)
class LoaderPlan:
    """What a rank's train loader says of its batches: their size (batch_size), whether a
    short last batch is dropped, and the samples its sampler draws in an epoch (None where it
    has no length: an iterable dataset)."""
    batch_size: int
    drop_last: bool
    drawn: int | None

    def expected(self, position: int) -> tuple[int, bool]:
        """(samples of the batch at this position of the epoch, whether exact): exact where the
        sampler's length says; otherwise batch_size is only the most a batch holds."""
        if self.drawn is not None and position * self.batch_size < self.drawn:
            return (self.batch_size if self.drop_last else
                    min(self.batch_size, self.drawn - position * self.batch_size)), True
        return self.batch_size, False


def loader_plan(loader) -> LoaderPlan | None:
    """The loader's own accounting, or None where it keeps none a batch can be checked against:
    a batch sampler of the user's own (its batches may be of any size), no automatic batching,
    several loaders at once."""
    if is_resident(loader):
        return LoaderPlan(loader.batch_size, loader.drop_last, loader.samples_per_rank())
    if not isinstance(loader, DataLoader):
        return None
    size, drop_last = loader.batch_size, loader.drop_last
    if size is None and type(loader.batch_sampler) is BatchSampler:  # torch's own, given explicitly
        size, drop_last = loader.batch_sampler.batch_size, loader.batch_sampler.drop_last
    if not isinstance(size, int) or size < 1:
        return None
    try:
        drawn = len(loader.sampler) if isinstance(loader.sampler, Sampler) else None
    except TypeError:  # a sampler without a length: an iterable dataset's
        drawn = None
    return LoaderPlan(size, bool(drop_last), drawn)


def _plain(value) -> bool:
    return isinstance(value, (str, bytes, int, float, bool)) or value is None


def structure_sizes(batch, dim: int = 0) -> list[int]:
    """The distinct sizes along `dim` of every tensor in the batch (mappings of any kind, lists
    and tuples, nested), and the length of each list of plain values (a collated text field)."""
    found: list[int] = []

    def walk(value) -> None:
        if isinstance(value, torch.Tensor) or hasattr(value, "__array_interface__"):
            shape = tuple(value.shape)
            if len(shape) > dim:
                found.append(int(shape[dim]))
        elif isinstance(value, Mapping):
            for item in value.values():
                walk(item)
        elif isinstance(value, (list, tuple)):
            if value and all(_plain(item) for item in value):
                found.append(len(value))
            else:
                for item in value:
                    walk(item)

    walk(batch)
    return sorted(set(found))


def samples_of(batch, position: int, plan: LoaderPlan | None, dim: int = 0,
               stated: int | None = None) -> tuple[int | None, str | None]:
    """(samples in this batch, None) or (None, why it cannot be told), the why one line that
    ends with the fix. position: the batch's place in its epoch on this rank; stated: what the
    module's samples_in_batch(batch) returned, if it has one."""
    if stated is not None:
        if isinstance(stated, bool) or not isinstance(stated, int) or stated < 0:
            return None, (f"the module's samples_in_batch() returned {stated!r}, not a count of samples; "
                          "return a non-negative int")
        sizes, said = [stated], f"the module's samples_in_batch() says {stated}"
    else:
        sizes = structure_sizes(batch, dim)
        said = (f"its tensors have {' or '.join(map(str, sizes))} along dimension {dim}" if sizes
                else "it holds no tensor with a dimension " + str(dim))
    if plan is not None:
        expected, exact = plan.expected(position)
        if exact:
            if stated is None and not sizes or expected in sizes:
                return expected, None
            return None, (f"the train loader gives batch {position} of this rank {expected} samples "
                          f"(batch_size {plan.batch_size}, {plan.drawn} drawn) but {said}; {DECLARE}")
        fitting = [s for s in sizes if 0 < s <= expected]
        if len(sizes) == 1 and fitting:
            return sizes[0], None
        if stated is None and len(fitting) > 1:
            return None, (f"the train loader has no length and {said}, which could each be the batch's "
                          f"samples (at most {expected}); {DECLARE}")
        return None, (f"the train loader's batches hold at most {expected} samples but {said}; {DECLARE}")
    if len(sizes) == 1:
        return sizes[0], None
    return None, (f"the train loader keeps no count of its batches (a batch sampler of its own, or "
                  f"several loaders) and {said}; {DECLARE}")


def stated_by(module, batch) -> int | None:
    """What the module's own samples_in_batch(batch) says, where it has one (samples_of checks it)."""
    hook = getattr(module, "samples_in_batch", None)
    return hook(batch) if callable(hook) else None


class BatchCounter:
    """This rank's count of the training batches of an epoch (samples_of), for every figure per
    sample: the epoch's samples, the throughput windows, the FLOPs per sample. The first batch
    that cannot be counted is remembered (`problem`), said once, and every later figure per
    sample is n/a; its count is then the loader's (or the structure's) best figure."""

    def __init__(self, dim: int = 0):
        self.dim = dim
        self.plan: LoaderPlan | None = None
        self.position = 0
        self.last = 0  # the latest batch's samples, for callbacks that come after the counting one
        self.problem: str | None = None

    def start_epoch(self, loader) -> None:
        self.plan, self.position = loader_plan(loader), 0

    def count(self, batch, module=None) -> int:
        n, why = samples_of(batch, self.position, self.plan, self.dim, stated_by(module, batch))
        if n is None:
            if self.problem is None:
                self.problem = why
                print(f"ddpscale: samples not counted: {why}; throughput, FLOPs per sample and MFU will be n/a",
                      flush=True)
            sizes = structure_sizes(batch, self.dim)
            n = self.plan.expected(self.position)[0] if self.plan else (sizes[0] if sizes else 0)
        self.position += 1
        self.last = n
        return n
