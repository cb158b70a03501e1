"""Every training sample counted once, when the data does not divide by the world size.

DistributedSampler (and ddpscale.workloads.resident, which follows it) pads each epoch to a multiple of
the world size by repeating the first indices, so every rank takes the same number of steps
(DDP's collectives need that in training). Index i of the padded order goes to rank
i % world at position i // world, so the repeats are the last position of the ranks from
n % world up: rank r holds len(range(r, n, world)) real samples, then at most one repeat.
Throughput counts the real ones only. The shard is read from the sampler the loader really
uses: Lightning's own, or a DistributedSampler the data module built itself (from
torch.distributed or from its trainer), with that sampler's num_replicas, rank and drop_last.
The distributed sampler is found wherever it sits: the loader's sampler, or the sampler of its
batch sampler (a length-bucketing BatchSampler of the user's own wrapping a DistributedSampler,
which Lightning rebuilds around its own), through Lightning's wrappers. Where a batch sampler
reorders the rank's indices, which batch held the repeat is not known: the epoch's count caps
at the rank's real samples, so the epoch is exact and a window may hold the one repeat.
Evaluation is sharded without padding (evaluation_sampler, below).

A sample is one sample a training step processes. With several training loaders (a dict or list
of them, which Lightning combines in "max_size_cycle" mode, or a CombinedLoader of the data
module's own mode; fit refuses "sequential"), a step's batch holds a batch of each loader, and
every one of them counts: throughput is the samples all loaders feed
per second. Under "max_size_cycle" a shorter loader starts again when it runs out, and what it
yields again is trained again, so it counts again (a sample seen twice in an epoch is two
samples processed); a DistributedSampler's padding repeats are the one exception, as above,
counted apart as padding (TrainLoaders, epoch_counts). A batch sampler of the user's own keeps
no count of its batches' sizes: a copy of it is walked at each epoch's start (indices only,
random streams untouched), and the batches training gets must fit what that pass yielded.

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

Each validation and test sample is evaluated once (evaluation_sampler). Evaluation needs no
equal step counts, so the built-in data modules shard validation and test without padding
(Lightning 2.6 pads them too, and warns; it uses an unpadded sampler only for predict):
Lightning's mean of a logged metric is weighted by batch size across ranks (the sums and batch
counts are all-reduced), so the accuracy is then over each sample exactly once.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler


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


def distributed_sampler(loader) -> DistributedSampler | None:
    """The DistributedSampler a loader draws its indices from, wherever it sits: its sampler, or
    inside its batch sampler (the sampler of a BatchSampler, torch's or the user's own, and the
    one Lightning's _IndexBatchSamplerWrapper holds); None where there is none."""
    seen: set[int] = set()
    todo = [getattr(loader, "sampler", None), getattr(loader, "batch_sampler", None)]
    while todo:
        item = todo.pop(0)
        if item is None or id(item) in seen or len(seen) > 16:
            continue
        seen.add(id(item))
        if isinstance(item, DistributedSampler):
            return item
        todo += [getattr(item, name, None) for name in ("sampler", "batch_sampler", "_batch_sampler")]
    return None


def shard_of(loader) -> tuple[int, int, int] | None:
    """(n, rank, world) of a loader sharded with padding, or None when nothing is repeated
    (one rank, drop_last sharding, an unpadded or unknown sampler): then every sample counts."""
    if is_resident(loader):
        return (len(loader.tensors[0]), loader.rank, loader.world) if loader.pad and loader.world > 1 else None
    sampler = distributed_sampler(loader)
    if sampler is not None and not sampler.drop_last and sampler.num_replicas > 1:
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
    a collection of loaders (each is planned alone: train_loaders, BatchCounter)."""
    if is_resident(loader):
        return LoaderPlan(loader.batch_size, loader.drop_last, loader.samples_per_rank())
    if not isinstance(loader, DataLoader):
        return None
    size, drop_last = loader.batch_size, loader.drop_last
    if size is None and type(loader.batch_sampler) is BatchSampler:  # torch's own, given explicitly
        size, drop_last = loader.batch_sampler.batch_size, loader.batch_sampler.drop_last
    if not isinstance(size, int) or size < 1:
        return None
    # the indices come from the batch sampler's sampler: the loader's own `sampler` is a
    # SequentialSampler of the whole dataset where a batch sampler was given explicitly
    sampler = loader.batch_sampler.sampler if type(loader.batch_sampler) is BatchSampler else loader.sampler
    try:
        drawn = len(sampler)
    except (TypeError, NotImplementedError):  # a sampler without a length: an iterable dataset's
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
    return None, (f"the train loader keeps no count of its batches (a batch sampler of its own, or an "
                  f"iterable without batch_size) and {said}; {DECLARE}")


def stated_by(module, batch) -> int | None:
    """What the module's own samples_in_batch(batch) says, where it has one (samples_of checks it)."""
    hook = getattr(module, "samples_in_batch", None)
    return hook(batch) if callable(hook) else None


# Lightning's CombinedLoader modes; fit combines a dict or list of loaders in this one
FIT_MODE = "max_size_cycle"


@dataclass(frozen=True)
class TrainLoaders:
    """The training loaders a fit iterates, as Lightning combines them: its mode, each loader's
    name (its key or index in the collection; "train" for one loader), and the structure a
    combined batch has (spec, a torch pytree spec whose leaves are the loaders' batches)."""
    mode: str
    names: tuple[str, ...]
    loaders: tuple
    spec: object


def _names(spec, prefix: str = "") -> list[str]:
    if spec.is_leaf():
        return [prefix or "train"]
    keys = spec.context if spec.type is not None and issubclass(spec.type, Mapping) else range(spec.num_children)
    return [name for key, child in zip(keys, spec.children())
            for name in _names(child, f"{prefix}/{key}" if prefix else str(key))]


def train_loaders(source) -> TrainLoaders:
    """source: a Trainer inside fit (the loaders it really iterates, with the samplers Lightning
    put in, and the mode of a CombinedLoader the data module returned), a CombinedLoader, one
    loader, or a dict or list of them (combined as fit combines them)."""
    from pytorch_lightning.utilities import CombinedLoader

    # the mode and the processed loaders are the fit loop's: trainer.train_dataloader gives
    # only the collection, and a CombinedLoader's mode is lost there
    combined = getattr(getattr(source, "fit_loop", None), "_combined_loader", None)
    if combined is None:
        if hasattr(source, "fit_loop"):
            source = source.train_dataloader
        combined = source if isinstance(source, CombinedLoader) else CombinedLoader(source, FIT_MODE)
    return TrainLoaders(combined._mode, tuple(_names(combined._spec)), tuple(combined.flattened), combined._spec)


@contextmanager
def _untouched(objects):
    """Iterate a copy of a batch sampler without moving any random stream training draws from:
    the global generators, and any torch.Generator the samplers hold."""
    import random

    import numpy as np

    generators = [g for item in objects for g in vars(item).values() if isinstance(g, torch.Generator)]
    states = [g.get_state() for g in generators]
    py_state, np_state = random.getstate(), np.random.get_state()
    try:
        with torch.random.fork_rng(devices=[]):
            yield
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)
        for generator, state in zip(generators, states):
            generator.set_state(state)


def _batch_sampler_sizes(loader) -> tuple[int, ...] | None:
    """The samples of each batch a pass of a batch sampler of the user's own yields, read by
    iterating a copy of it (indices only, no data): its batches may be of any size, and its
    length is only their number. None where it cannot be iterated so."""
    batch_sampler = getattr(loader, "batch_sampler", None)
    if not isinstance(loader, DataLoader) or batch_sampler is None or type(batch_sampler) is BatchSampler:
        return None
    holders = [item for item in (batch_sampler, getattr(batch_sampler, "sampler", None)) if hasattr(item, "__dict__")]
    try:
        with _untouched(holders):
            return tuple(len(batch) for batch in iter(copy.copy(batch_sampler)))
    except Exception:  # noqa: BLE001 - a sampler that cannot be walked twice: counted by its batches alone
        return None


@dataclass(frozen=True)
class LoaderPass:
    """One pass of a training loader on this rank (its epoch, or a cycle under max_size_cycle):
    its plan (torch's batching), or for a batch sampler of the user's own the samples of each
    batch a copy of it yielded (sizes; maybe in another order than training's), its length
    (batches; None: unsized) and its padded sharding (shard_of)."""
    name: str
    plan: LoaderPlan | None
    sizes: tuple[int, ...] | None
    batches: int | None
    shard: tuple[int, int, int] | None

    @property
    def length(self) -> int | None:
        """Batches in a pass, where known: after as many, max_size_cycle starts it again."""
        return len(self.sizes) if self.sizes is not None else self.batches

    def drawn_by(self, batches: int) -> int | None:
        """Samples its first `batches` batches of a pass draw, where known."""
        plan = self.plan
        if plan is not None and plan.drawn is not None:
            return batches * plan.batch_size if plan.drop_last else min(batches * plan.batch_size, plan.drawn)
        return sum(self.sizes[:batches]) if self.sizes is not None else None

    def counts(self, batches: int, batch_size: int) -> tuple[int, int]:
        """(real samples, padding repeats) of its first `batches` batches, starting again after
        each pass as max_size_cycle does; batch_size where its batches have no known size."""
        length = self.length
        if not length or self.drawn_by(length) is None:
            seen = 0 if length == 0 else batches * (self.plan.batch_size if self.plan else batch_size)
            return counted(seen, self.shard), seen - counted(seen, self.shard)
        passes, rest = divmod(batches, length)
        whole, part = self.drawn_by(length), self.drawn_by(rest)
        real = passes * counted(whole, self.shard) + counted(part, self.shard)
        return real, passes * whole + part - real


def loader_pass(name: str, loader) -> LoaderPass:
    plan = loader_plan(loader)
    return LoaderPass(name, plan, None if plan else _batch_sampler_sizes(loader), _length(loader), shard_of(loader))


def _length(loader) -> int | None:
    try:
        return len(loader)
    except (TypeError, NotImplementedError):
        return None


def batches_each(loaders: TrainLoaders, steps: int, lengths: list[int | None]) -> list[int]:
    """The batches each loader yields in `steps` steps of the combined loader, by its mode (fit
    refuses "sequential", one loader after the other)."""
    if loaders.mode == "max_size":  # an exhausted loader yields None, not a batch
        return [steps if length is None else min(steps, length) for length in lengths]
    return [steps] * len(lengths)  # max_size_cycle (a shorter loader starts again) and min_size


def epoch_counts(loaders: TrainLoaders, steps: int, batch_size: int) -> dict[str, tuple[int, int]]:
    """Each loader's (real samples, padding repeats) in an epoch of `steps` combined batches
    (Lightning's num_training_batches) on this rank. batch_size: the batch where a loader's
    has no known size (an iterable dataset)."""
    passes = [loader_pass(name, loader) for name, loader in zip(loaders.names, loaders.loaders)]
    each = batches_each(loaders, steps, [p.length for p in passes])
    return {p.name: p.counts(n, batch_size) for p, n in zip(passes, each)}


def split(batch, loaders: TrainLoaders) -> list[tuple[int, object]] | None:
    """[(loader index, its batch)] of a combined batch (a batch of each loader); None where
    the batch does not have the structure of the loaders' collection."""
    if len(loaders.loaders) == 1:
        return [(0, batch)]
    try:
        parts = loaders.spec.flatten_up_to(batch)
    except (TypeError, ValueError, KeyError, IndexError, RuntimeError):
        return None
    return [(index, part) for index, part in enumerate(parts) if part is not None]  # max_size: None once out


def first_batch(source):
    """The first training batch as fit would combine it (source: what train_loaders takes)."""
    from pytorch_lightning.utilities import CombinedLoader

    loaders = train_loaders(source)
    combined = CombinedLoader(loaders.spec.unflatten(list(loaders.loaders)), loaders.mode)
    try:
        batch, _, _ = next(iter(combined))
    finally:
        combined.reset()
    return batch


def batch_samples(batch, source, dim: int = 0, stated: int | None = None) -> tuple[int | None, str | None]:
    """(samples in one combined batch, the first of an epoch, every loader's part counted,
    padding repeats included, None) or (None, why): the figure per sample of one batch (FLOPs).
    source: what train_loaders takes (a data module's train_dataloader() will do)."""
    counter = BatchCounter(dim, quiet=True)
    counter.start_epoch(source)
    real = counter.count(batch, stated=stated)
    return (None, counter.problem) if counter.problem else (real + counter.padding, None)


class BatchCounter:
    """This rank's count of the training batches of an epoch (samples_of), every loader's part,
    for every figure per sample: the epoch's samples, the throughput windows, the FLOPs per
    sample. count() returns the batch's real samples: a padding repeat is left out, and kept in
    `padding`. The first batch that cannot be counted is remembered (`problem`), said once,
    and every later figure per sample is n/a; its count is then the loader's (or the
    structure's) best figure."""

    def __init__(self, dim: int = 0, quiet: bool = False):
        self.dim = dim
        self.quiet = quiet
        self.loaders: TrainLoaders | None = None
        # before start_epoch: one loader that keeps no count, its batches counted alone
        self.passes = [LoaderPass("train", None, None, None, None)]
        self.positions = [0]  # each loader's batch in its current pass
        self.seen = [0]  # each loader's samples drawn in its current pass
        self.cycles = [False]  # whether each loader starts again within an epoch
        self.last = 0  # the latest batch's real samples, for callbacks that come after the counting one
        self.padding = 0  # this epoch's padding repeats trained (not counted)
        self.problem: str | None = None

    def start_epoch(self, source) -> None:
        """source: what train_loaders takes (the trainer, inside fit)."""
        self.loaders = train_loaders(source)
        self.passes = [loader_pass(name, loader) for name, loader in zip(self.loaders.names, self.loaders.loaders)]
        self.padding = 0
        self.positions, self.seen = [0] * len(self.passes), [0] * len(self.passes)
        # max_size_cycle starts a loader again where it ends before the longest one
        longest = max((p.length or 0 for p in self.passes), default=0)
        self.cycles = [self.loaders.mode == FIT_MODE and p.length is not None and p.length < longest
                       for p in self.passes]

    def count(self, batch, module=None, stated: int | None = None) -> int:
        stated = stated_by(module, batch) if stated is None else stated
        parts = [(0, batch)] if self.loaders is None else split(batch, self.loaders)
        if parts is None:
            real, why = 0, (f"a training batch is a {type(batch).__name__}, not the collection of the train loaders "
                            f"{list(self.loaders.names)} that {self.loaders.mode} combines; {DECLARE}")
        elif len(parts) == 1:
            (index, part), = parts
            n, why = self._part(index, part, stated)
            real = self._take(index, self._guess(index, part) if n is None else n)
        else:
            real, why = self._combined(parts, stated)
        if why is not None and self.problem is None:
            self.problem = why
            if not self.quiet:
                print(f"ddpscale: samples not counted: {why}; throughput, FLOPs per sample and MFU will be n/a",
                      flush=True)
        self.last = real
        return real

    def _combined(self, parts: list, stated) -> tuple[int, str | None]:
        """A batch of every loader: each part counted alone; the module's samples_in_batch(),
        where it has one, states the whole, and must agree where the parts can be told."""
        counts = [self._part(index, part, None) for index, part in parts]
        why = next((w for _, w in counts if w), None)
        real = sum(self._take(index, self._guess(index, part) if n is None else n)
                   for (index, part), (n, _) in zip(parts, counts))
        if stated is None:
            return real, why
        if isinstance(stated, bool) or not isinstance(stated, int) or stated < 0:
            return real, (f"the module's samples_in_batch() returned {stated!r}, not a count of samples; "
                          "return a non-negative int")
        if why is None and sum(n for n, _ in counts) != stated:
            return real, (f"the module's samples_in_batch() says {stated} but the batches of the train loaders "
                          f"{list(self.loaders.names)} hold {sum(n for n, _ in counts)}; {DECLARE}")
        return (real, None) if why is None else (stated, None)  # its word where a part alone cannot be told

    def _part(self, index: int, part, stated: int | None) -> tuple[int | None, str | None]:
        p = self.passes[index]
        if self.cycles[index] and self.positions[index] >= p.length:  # max_size_cycle started it again
            self.positions[index] = self.seen[index] = 0
        position = self.positions[index]
        n, why = samples_of(part, position, p.plan, self.dim, stated)
        if why is None and p.sizes:  # a batch sampler of the user's own: what a pass of it yields
            whole = position + 1 == len(p.sizes)
            if n > max(p.sizes) or position >= len(p.sizes) or whole and self.seen[index] + n != sum(p.sizes):
                name = type(self.loaders.loaders[index].batch_sampler).__name__
                why = (f"the batch sampler {name} yields {sum(p.sizes)} samples a pass in {len(p.sizes)} batches "
                       f"of at most {max(p.sizes)}, but its batches held {n} (batch {self.positions[index]}), "
                       f"{self.seen[index] + n} so far; {DECLARE}")
        if why is not None and len(self.passes) > 1:
            why = f"train loader {p.name!r}: {why}"
        return n, why

    def _take(self, index: int, n: int) -> int:
        """The real samples of n drawn next from loader index (a padding repeat sits at its end)."""
        shard, before = self.passes[index].shard, self.seen[index]
        self.seen[index] += n
        self.positions[index] += 1
        real = counted(self.seen[index], shard) - counted(before, shard)
        self.padding += n - real
        return real

    def _guess(self, index: int, part) -> int:
        p, sizes = self.passes[index], structure_sizes(part, self.dim)
        return p.plan.expected(self.positions[index])[0] if p.plan else (sizes[0] if sizes else 0)


def epoch_record(trainer, batch_per_device: int) -> dict:
    """metrics.json's entries on one whole epoch over all ranks, from the loaders each rank
    trains on (a collective: every rank calls it): samples_per_epoch (real samples, None where
    the epoch has no length: an iterable dataset), padding_per_epoch (DistributedSampler's
    repeats, trained but not counted), and each training loader's share. trainer None: the
    entries before training starts."""
    if trainer is None:
        return {"samples_per_epoch": None, "padding_per_epoch": None, "train_loaders_mode": None, "train_loaders": []}
    loaders = train_loaders(trainer)
    steps = trainer.num_training_batches
    counts = None if steps == float("inf") else epoch_counts(loaders, int(steps), batch_per_device)
    here = [-1] * (2 * len(loaders.names)) if counts is None else [x for name in loaders.names for x in counts[name]]
    every = trainer.strategy.all_gather(torch.tensor(here, dtype=torch.int64, device=trainer.strategy.root_device))
    every = every.reshape(-1, len(here))
    known = not bool((every < 0).any())
    sums = [int(x) for x in every.sum(dim=0)] if known else [None] * len(here)
    record = {"samples_per_epoch": sum(sums[0::2]) if known else None,
              "padding_per_epoch": sum(sums[1::2]) if known else None, "train_loaders_mode": loaders.mode,
              "train_loaders": [{"name": name, "samples_per_epoch": sums[2 * i], "padding_per_epoch": sums[2 * i + 1]}
                                for i, name in enumerate(loaders.names)]}
    if trainer.global_rank == 0:
        said = describe(record)
        if said:
            print(said, flush=True)
    return record


def describe(record: dict) -> str | None:
    """The line a run prints on what its samples are, where that is more than one loader's
    batches: several loaders, a cycling one, padding repeats. None otherwise."""
    loaders, said = record["train_loaders"], []
    if len(loaders) > 1:
        shares = ", ".join(f"{each['name']} {each['samples_per_epoch']}" for each in loaders)
        said.append(f"every training loader's samples count ({record['train_loaders_mode']}: {shares} an epoch"
                    + ("; a shorter loader's samples count again each time it starts again"
                       if record["train_loaders_mode"] == FIT_MODE else "") + ")")
    if record["padding_per_epoch"]:
        said.append(f"DistributedSampler pads each epoch with {record['padding_per_epoch']} repeat(s) over all "
                    "ranks: trained, not counted as samples")
    return "ddpscale: samples: " + "; ".join(said) if said else None


def evaluation_sampler(dataset):
    """An unpadded, unshuffled shard of the dataset for validation or test under DDP (None on
    one rank). A DistributedSampler subclass, so Lightning keeps it instead of padding."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return None
    from pytorch_lightning.overrides.distributed import UnrepeatedDistributedSampler

    return UnrepeatedDistributedSampler(dataset, shuffle=False)
