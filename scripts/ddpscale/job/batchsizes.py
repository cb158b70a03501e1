"""The baseline's compute at every per-device batch the configured topologies train with.

The prediction of a topology needs the baseline's compute at that topology's per-device
batch. Scaling it linearly with the batch is wrong where per-operation overhead sets the
step (a GPU at a small batch; a 16-core CPU run stayed at ~1.5 ms from 64 down to 16
samples), so the baseline's probe times it: blocks of steps on one rank, no DDP, as its own
compute is timed (stepprobe.time_block), on batches of each size built from the batches it
drew from the run's train dataloader.

A batch of another size is made of the drawn samples in order: the drawn batches joined
along their first dimension and cut into windows of the new size, wrapping around when a
window needs more samples than were drawn. That works for a tensor and for tuples, lists and
dicts of tensors with one first dimension; any other batch, or a size whose step fails (out
of memory, a model built for one shape), is recorded n/a with the reason.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping

import torch

from ddpscale.job import stepprobe


def _tensors(batch) -> list[torch.Tensor]:
    if torch.is_tensor(batch):
        return [batch]
    if isinstance(batch, Mapping):
        return [t for v in batch.values() for t in _tensors(v)]
    if isinstance(batch, (tuple, list)):
        return [t for v in batch for t in _tensors(v)]
    raise ValueError(f"a batch holding {type(batch).__name__} cannot be resized (only tensors, and tuples, "
                     "lists or dicts of tensors)")


def samples(batch) -> int:
    """The batch's first dimension, the same on every tensor it holds."""
    sizes = {t.shape[0] if t.dim() else None for t in _tensors(batch)}
    if len(sizes) != 1 or None in sizes:
        raise ValueError(f"a batch whose tensors have first dimensions {sorted(map(str, sizes))} cannot be resized "
                         "(they must share one)")
    return sizes.pop()


def _apply(fn, parts: list):
    """fn over the tensors at the same place in each of parts (batches of one structure)."""
    first = parts[0]
    if torch.is_tensor(first):
        return fn(parts)
    if isinstance(first, Mapping):
        return type(first)({k: _apply(fn, [p[k] for p in parts]) for k in first})
    items = [_apply(fn, [p[i] for p in parts]) for i in range(len(first))]
    return type(first)(*items) if hasattr(first, "_fields") else type(first)(items)


def resize(batches: list, size: int, count: int) -> list:
    """count batches of `size` samples: the drawn batches' samples in order, wrapping around."""
    if size < 1:
        raise ValueError(f"a batch needs at least one sample (got {size})")
    for b in batches:
        samples(b)  # each resizable, with one first dimension
    pool = _apply(lambda ts: torch.cat(ts, dim=0), batches)
    total = samples(pool)
    out = []
    for j in range(count):
        index = torch.arange(j * size, (j + 1) * size) % total
        out.append(_apply(lambda ts: ts[0].index_select(0, index.to(ts[0].device)), [pool]))
    return out


def compute_at(runner, batches: list, size: int, *, steps: int, rounds: int, warmup: int,
               accumulate: int = 1) -> dict:
    """Median per micro-batch compute at `size` samples per batch (one rank, no DDP); n/a with
    the reason when such batches cannot be built or their step fails."""
    opt_steps, micro = stepprobe.blocks(steps, accumulate)
    try:
        sized = resize(batches, size, micro)
        stepprobe.time_block(runner, sized, max(1, warmup), False, accumulate)
        times = [stepprobe.time_block(runner, sized, opt_steps, False, accumulate) for _ in range(rounds)]
    except Exception as err:  # noqa: BLE001 - one size the probe cannot time is n/a, the rest stand
        lines = str(err).strip().splitlines()
        if runner.device.type == "cuda":
            torch.cuda.empty_cache()
        return {"batch_per_device": size, "compute_s": None,
                "reason": f"{type(err).__name__}: {lines[0] if lines else ''}"}
    return {"batch_per_device": size, "compute_s": statistics.median(times)}


def compute_by_batch(runner, batches: list, sizes, own: int | None, own_compute_s: float, **timing) -> list[dict]:
    """The compute at each size, the run's own batch taken from its own timing."""
    return [{"batch_per_device": size, "compute_s": own_compute_s} if size == own
            else compute_at(runner, batches, size, **timing) for size in sorted(set(sizes))]
