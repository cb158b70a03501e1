"""The probe of one topology: where a training step's time goes, and all-reduce bandwidth.

It runs in the first repeat's training job, on the process group Lightning formed, before
the first epoch (ddpscale.training.callbacks.ProbeBeforeTraining), so its prediction uses the
nodes that trained; scripts/probe.py runs the same probe without training, on a group of its
own. Every rank calls `measure`; rank 0 gets the record.
"""

from __future__ import annotations

import socket
import time

import torch
import torch.distributed as dist

from ddpscale.cluster import ranks
from ddpscale.measurement import commbench, stepprobe
from ddpscale.training.runargs import per_device_batch

SCHEMA_VERSION = 1
# Probe sizes: micro-batches per timed block, rounds of (no_sync, synced) blocks, untimed
# warm-up steps and all-reduce calls, timed all-reduce calls per message size.
DEFAULTS = {"steps": 20, "rounds": 5, "warmup": 3, "iters": 10}


def measure(args, device: torch.device, rank: int, local_rank: int, node_rank: int, *,
            steps: int, rounds: int, warmup: int, iters: int) -> dict | None:
    """Time steps with and without gradient sync, then all-reduce up to the gradient's size."""
    started = time.perf_counter()
    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    backend = dist.get_backend() if world > 1 else "none"
    places = ranks.gather({"host": socket.gethostname(), "node_rank": node_rank})
    model, loader, plan = stepprobe.prepare(args, device)
    step = stepprobe.measure(model, loader, plan, device, world, local_rank, steps=steps, rounds=rounds,
                             warmup=warmup, batch_per_device=per_device_batch(args),
                             accumulate=args.accumulate_grad_batches)
    numel, nbytes = stepprobe.gradient_numel(model)
    allreduce = commbench.allreduce_benchmark(commbench.message_sizes(nbytes), device, warmup=warmup, iters=iters)
    if rank != 0:
        return None
    return {
        "schema_version": SCHEMA_VERSION,
        "topology": args.topology,
        "num_nodes": args.nodes,
        "devices_per_node": args.devices,
        "world_size": world,
        "node_ranks": [p["node_rank"] for p in places],
        "hosts": sorted({p["host"] for p in places}),
        "backend": backend,
        "device_kind": device.type,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else f"{device.type}, simulated",
        "simulated": device.type != "cuda",
        "precision": args.precision,
        "gradient_numel": numel,
        "gradient_bytes": nbytes,
        "allreduce": allreduce,
        "step": step,
        "probe_wall_s": time.perf_counter() - started,
    }


def summary(record: dict) -> str:
    step, last = record["step"], record["allreduce"][-1]
    ms = lambda s: f"{s * 1e3:.3f} ms"  # noqa: E731
    busbw = "n/a (one rank)" if last["busbw_gbps"] is None else f"{last['busbw_gbps']:.3f} GB/s"
    return (f"ddpscale probe: {record['topology']} world size {record['world_size']} ({record['backend']}, "
            f"{record['device_name']}): per batch data {ms(step['data_s'])}, compute {ms(step['compute_s'])}, "
            f"exposed comm {ms(step['exposed_comm_s'])}; all-reduce of {last['bytes']} B gradient: "
            f"{ms(last['time_s'])}, busbw {busbw}; probe {record['probe_wall_s']:.2f} s")
