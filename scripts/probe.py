"""Probe one topology: all-reduce bandwidth and where a training step's time goes (probe.json).

Every rank runs this script, started by the same launcher and with the same run flags as
train.py; rank 0 writes the JSON (atomically).
"""

import argparse
import os
import socket
import sys
import time
from datetime import timedelta

import pytorch_lightning as pl
import torch
import torch.distributed as dist

from ddpscale.io import write_json_atomic
from ddpscale.measurement import commbench, stepprobe
from ddpscale.measurement.timing import WorldSizeError
from ddpscale.training import plugins
from ddpscale.training.runargs import add_run_args, per_device_batch, set_threads, topology


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_run_args(p)
    p.add_argument("--out", required=True, help="probe.json to write")
    p.add_argument("--steps", type=int, default=20, help="micro-batches per timed block (whole optimizer steps: rounded up to accumulate_grad_batches)")
    p.add_argument("--rounds", type=int, default=5, help="rounds of (no_sync block, synced block)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps / all-reduce calls first")
    p.add_argument("--iters", type=int, default=10, help="timed all-reduce calls per message size")
    return p.parse_args(argv)


def rank_info(cluster_env: str) -> dict:
    """This rank's place, as the launcher set it: srun's variables or launch_local's (else 1 rank)."""
    if cluster_env == "slurm":
        from pytorch_lightning.plugins.environments import SLURMEnvironment

        env = SLURMEnvironment(auto_requeue=False)
        return {"rank": env.global_rank(), "world_size": env.world_size(), "local_rank": env.local_rank(),
                "node_rank": env.node_rank(), "addr": env.main_address, "port": env.main_port}
    get = os.environ.get
    return {"rank": int(get("RANK", 0)), "world_size": int(get("WORLD_SIZE", 1)),
            "local_rank": int(get("LOCAL_RANK", 0)), "node_rank": int(get("NODE_RANK", 0)),
            "addr": get("MASTER_ADDR", "127.0.0.1"), "port": int(get("MASTER_PORT", 0) or 0)}


def start_group(info: dict, device: torch.device, timeout_s: float) -> str:
    if info["world_size"] == 1:
        return "none"
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=f"tcp://{info['addr']}:{info['port']}",
                            rank=info["rank"], world_size=info["world_size"], timeout=timedelta(seconds=timeout_s))
    return backend


def gather(value) -> list:
    if not dist.is_initialized():
        return [value]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


def probe(args) -> dict | None:
    started = time.perf_counter()
    topo = topology(args)
    info = rank_info(args.cluster_env)
    set_threads(args, torch)
    pl.seed_everything(args.seed, workers=True, verbose=False)
    device = stepprobe.resolve_device(args.accelerator, info["local_rank"])
    backend = start_group(info, device, args.collective_timeout_s)
    world = dist.get_world_size() if dist.is_initialized() else 1
    if world != topo.world_size:
        raise WorldSizeError(f"the process group has {world} rank(s) but the topology asks for "
                             f"{topo.world_size}: the launcher did not start every rank")
    places = gather({"host": socket.gethostname(), "node_rank": info["node_rank"]})

    model, loader, plan = stepprobe.prepare(args, device)
    step = stepprobe.measure(model, loader, plan, device, world, info["local_rank"], steps=args.steps,
                             rounds=args.rounds, warmup=args.warmup, batch_per_device=per_device_batch(args),
                             accumulate=args.accumulate_grad_batches)
    numel, nbytes = stepprobe.gradient_numel(model)
    allreduce = commbench.allreduce_benchmark(commbench.message_sizes(nbytes), device,
                                              warmup=args.warmup, iters=args.iters)
    if info["rank"] != 0:
        return None
    return {
        "schema_version": 1,
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


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        record = probe(args)
        if record is not None:
            write_json_atomic(args.out, record)
            print(summary(record), flush=True)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (plugins.PluginError, WorldSizeError, FileNotFoundError, ValueError) as err:
        print(f"ddpscale probe: {err}", file=sys.stderr)
        sys.exit(3)
