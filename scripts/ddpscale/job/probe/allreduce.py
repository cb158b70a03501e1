"""All-reduce bandwidth on the ranks of one topology, timed and reported as nccl-tests does.

algbw = bytes / time; busbw = algbw * 2(n-1)/n, the rate each link must carry in a ring
all-reduce, comparable across world sizes and with the hardware's link speed.

What `time_s` is, and why: nccl-tests (NVIDIA/nccl-tests, src/common.cu) warms up (TimeTest:
`warmup_iters` calls, default 5, at the smallest and largest size), lines the ranks up
(BenchTime: one untimed collective, completeColl, Barrier), starts one clock, launches
`iters` collectives (default 20) back to back without waiting, waits for the stream once
(completeColl) and divides the elapsed time by `iters`; that per-rank figure is averaged
over the ranks (`Allreduce(args, &deltaSec, average)` with the default `-a 1`: summed,
divided by processes x threads, the number of ranks at one GPU each) and printed as the time
its algbw and busbw come from. So here, per message size: `warmup` untimed all-reduces
(every size, not only the ends), an all-reduce of a scalar and a device sync to line the
ranks up (align), then `iters` all-reduces and one device sync inside one clock, divided by
`iters` on each rank; time_s is the mean of that over the ranks (an all-reduce of the
per-rank seconds, divided by the world size). A sync after every call would add a round trip
between CPU and device to every message, and the slowest rank's figure is not what
nccl-tests prints: either understates small messages' bus bandwidth against nccl-tests on
the same link. torch's all_reduce works in place, so time_s compares with nccl-tests'
in-place column. On CUDA, NCCL's all_reduce returns once queued, so the loop pipelines as
nccl-tests' does; gloo on CPU returns when the data has arrived.

The size sweep gives the bandwidth; the comm term of the prediction comes from the gradient
all-reduced as DDP issues it (ddp_buckets, allreduce_as_ddp): in buckets of bucket_cap_mb
(25 MiB unless the run's DDP kwargs set it; with the default, a first bucket of 1 MiB),
launched one after another without waiting, the last one the remainder. It is timed the same
way, one whole gradient synchronisation (every bucket launched, then every one waited for) as
the loop's unit. One message of the whole gradient is faster than its buckets (each
all-reduce has its own latency).
"""

from __future__ import annotations

import math
import time

from ddpscale.job.device.gpu import sync_device

GB = 1e9
MIB = 1024 * 1024
# torch.nn.parallel.DistributedDataParallel's defaults (torch 2.13: _DEFAULT_BUCKET_CAP_MB,
# dist._DEFAULT_FIRST_BUCKET_BYTES): a 1 MiB first bucket only when bucket_cap_mb is not set
DEFAULT_BUCKET_CAP_MB = 25
DEFAULT_FIRST_BUCKET_BYTES = 1 * MIB


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


def ddp_buckets(grad_bytes: int, bucket_cap_mb: float | None = None) -> list[int]:
    """Bytes of each all-reduce DDP issues per synchronisation of grad_bytes of gradient, as it
    sizes its buckets after the first step (Reducer's rebuilt buckets): a first bucket of 1 MiB
    with the default cap, then buckets of the cap, the last one the remainder. DDP closes a
    bucket at a parameter's boundary, so real buckets exceed the cap by up to one parameter;
    the count and total are what matter for the time."""
    if grad_bytes <= 0:
        raise ValueError(f"the model has no trainable gradient to all-reduce ({grad_bytes} bytes)")
    cap = int((DEFAULT_BUCKET_CAP_MB if bucket_cap_mb is None else bucket_cap_mb) * MIB)
    if cap <= 0:
        raise ValueError(f"bucket_cap_mb must be positive (got {bucket_cap_mb}) in the run's DDP settings")
    first = DEFAULT_FIRST_BUCKET_BYTES if bucket_cap_mb is None else cap
    sizes = [min(first, grad_bytes)]
    left = grad_bytes - sizes[0]
    while left > 0:
        sizes.append(min(cap, left))
        left -= sizes[-1]
    return sizes


def bandwidths(nbytes: int, seconds: float, world_size: int) -> tuple[float | None, float | None]:
    """(algbw, busbw) in GB/s (1e9 bytes); (None, None) when nothing was timed."""
    if seconds is None or seconds <= 0:
        return None, None
    algbw = nbytes / seconds / GB
    busbw = algbw * 2 * (world_size - 1) / world_size if world_size > 1 else 0.0
    return algbw, busbw


def _initialized() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def align(device) -> None:
    """Wait for every rank (an all-reduce on the device works for gloo and NCCL alike)."""
    import torch
    import torch.distributed as dist

    if _initialized():
        dist.all_reduce(torch.zeros(1, device=device))
    sync_device(device)


def slowest(value: float, device) -> float:
    """The largest value over all ranks (the slowest rank sets the collective's time)."""
    import torch
    import torch.distributed as dist

    if not _initialized():
        return value
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def mean_over_ranks(value: float, device) -> float:
    """The mean of value over all ranks (nccl-tests' default report of a collective's time)."""
    import torch
    import torch.distributed as dist

    if not _initialized():
        return value
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return float(t.item()) / dist.get_world_size()


def time_loop(launch, device, warmup: int, iters: int) -> float:
    """Seconds per launch() on this rank, as nccl-tests' BenchTime times a collective: warm-up
    launches, the ranks lined up, then iters launches back to back and one device sync inside
    one clock, divided by iters. Collective: every rank must call it with the same counts."""
    if iters < 1:
        raise ValueError(f"the all-reduce benchmark needs iters >= 1 (got {iters})")
    for _ in range(warmup):
        launch()
    align(device)
    start = time.perf_counter()
    for _ in range(iters):
        launch()
    sync_device(device)
    return (time.perf_counter() - start) / iters


def allreduce_benchmark(sizes: list[int], device, dtype=None, warmup: int = 5, iters: int = 20) -> list[dict]:
    """Time dist.all_reduce of a tensor of each size as nccl-tests does: time_s is the mean over
    ranks of each rank's loop of iters calls with one sync, divided by iters (module docstring).

    Collective: every rank must call it with the same arguments. With no process group
    (one rank) nothing is communicated: time 0, bandwidth None.
    """
    import torch
    import torch.distributed as dist

    dtype = getattr(torch, dtype) if isinstance(dtype, str) else (dtype or torch.float32)
    if not _initialized():
        return [{"bytes": n, "time_s": 0.0, "algbw_gbps": None, "busbw_gbps": None, "iters": 0} for n in sizes]
    world = dist.get_world_size()
    element = torch.empty((), dtype=dtype).element_size()
    results = []
    for nbytes in sizes:
        tensor = torch.ones(math.ceil(nbytes / element), dtype=dtype, device=device)
        per_rank = time_loop(lambda: dist.all_reduce(tensor), device, warmup, iters)
        seconds = mean_over_ranks(per_rank, device)
        algbw, busbw = bandwidths(nbytes, seconds, world)
        results.append({"bytes": nbytes, "time_s": seconds, "algbw_gbps": algbw, "busbw_gbps": busbw,
                        "iters": iters})
    return results


def on_the_wire(buckets: list[int], bytes_per_element: int | None) -> tuple[list[int], str | None]:
    """The buckets as a comm hook sends them, and the torch dtype's name to time them in: a
    16-bit hook (fp16_compress, bf16_compress) casts each fp32 bucket to half its bytes before
    the all-reduce; None (no hook) sends them as they are. The model assumes fp32 gradients,
    as DDP's buckets hold under 32-true and the mixed precisions (64-true's would send a
    quarter). bf16 is timed as float16: the same bytes, and gloo reduces float16 on CPU."""
    if bytes_per_element is None:
        return list(buckets), None
    names = {2: "float16"}
    if bytes_per_element not in names:
        raise ValueError(f"no comm model for a hook that sends {bytes_per_element} bytes per element")
    return [math.ceil(n / 4) * bytes_per_element for n in buckets], names[bytes_per_element]


def allreduce_as_ddp(buckets: list[int], device, dtype=None, warmup: int = 5, iters: int = 20) -> dict:
    """Seconds for one gradient synchronisation issued as DDP issues it: every bucket's
    all-reduce launched without waiting for the one before, then all waited for; timed as
    allreduce_benchmark times one all-reduce (iters synchronisations in a loop, one device sync,
    the mean over ranks). Collective, like allreduce_benchmark; 0 s with no process group."""
    import torch
    import torch.distributed as dist

    out = {"bucket_bytes": list(buckets), "buckets": len(buckets), "bytes": sum(buckets)}
    if not _initialized():
        return {**out, "time_s": 0.0, "iters": 0}
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else (dtype or torch.float32)
    element = torch.empty((), dtype=dtype).element_size()
    tensors = [torch.ones(math.ceil(n / element), dtype=dtype, device=device) for n in buckets]

    def sync_gradient() -> None:
        # wait() on NCCL makes the current stream wait, not the CPU: the next
        # synchronisation is queued behind this one, as DDP's next backward would be
        for work in [dist.all_reduce(t, async_op=True) for t in tensors]:
            work.wait()

    per_rank = time_loop(sync_gradient, device, warmup, iters)
    return {**out, "time_s": mean_over_ranks(per_rank, device), "iters": iters}
