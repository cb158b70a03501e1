"""All-reduce bandwidth on the ranks of one topology, reported the way nccl-tests reports it.

algbw = bytes / time; busbw = algbw * 2(n-1)/n, the rate each link must carry in a ring
all-reduce, comparable across world sizes and with the hardware's link speed.
"""

from __future__ import annotations

import math
import statistics
import time

GB = 1e9


def message_sizes(grad_bytes: int, start: int = 1024) -> list[int]:
    """start, 2*start, 4*start, ... below grad_bytes, then grad_bytes itself (the size DDP syncs)."""
    if grad_bytes <= 0:
        raise ValueError(f"the model has no trainable gradient to all-reduce ({grad_bytes} bytes)")
    if grad_bytes <= start:
        return [grad_bytes]
    sizes, size = [], start
    while size < grad_bytes:
        sizes.append(size)
        size *= 2
    return sizes + [grad_bytes]


def bandwidths(nbytes: int, seconds: float, world_size: int) -> tuple[float | None, float | None]:
    """(algbw, busbw) in GB/s (1e9 bytes); (None, None) when nothing was timed."""
    if seconds is None or seconds <= 0:
        return None, None
    algbw = nbytes / seconds / GB
    busbw = algbw * 2 * (world_size - 1) / world_size if world_size > 1 else 0.0
    return algbw, busbw


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _initialized() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def align(device) -> None:
    """Wait for every rank (an all-reduce on the device works for gloo and NCCL alike)."""
    import torch
    import torch.distributed as dist

    if _initialized():
        dist.all_reduce(torch.zeros(1, device=device))
    _sync(device)


def slowest(value: float, device) -> float:
    """The largest value over all ranks (the slowest rank sets the collective's time)."""
    import torch
    import torch.distributed as dist

    if not _initialized():
        return value
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def allreduce_benchmark(sizes: list[int], device, dtype=None, warmup: int = 5, iters: int = 20) -> list[dict]:
    """Time dist.all_reduce of a tensor of each size: each rank's median per-call time, max over ranks.

    Collective: every rank must call it with the same arguments. With no process group
    (one rank) nothing is communicated: time 0, bandwidth None.
    """
    import torch
    import torch.distributed as dist

    dtype = dtype or torch.float32
    if not _initialized():
        return [{"bytes": n, "time_s": 0.0, "algbw_gbps": None, "busbw_gbps": None, "iters": 0} for n in sizes]
    world = dist.get_world_size()
    element = torch.empty((), dtype=dtype).element_size()
    results = []
    for nbytes in sizes:
        tensor = torch.ones(math.ceil(nbytes / element), dtype=dtype, device=device)
        for _ in range(warmup):
            dist.all_reduce(tensor)
        align(device)
        calls = []
        for _ in range(iters):
            start = time.perf_counter()
            dist.all_reduce(tensor)
            _sync(device)
            calls.append(time.perf_counter() - start)
        seconds = slowest(statistics.median(calls), device)
        algbw, busbw = bandwidths(nbytes, seconds, world)
        results.append({"bytes": nbytes, "time_s": seconds, "algbw_gbps": algbw, "busbw_gbps": busbw,
                        "iters": iters})
    return results
