"""Probe one topology without training: all-reduce bandwidth and where a step's time goes.

The workflow runs this probe inside the first repeat's training job (train.py --probe); this
script runs it alone, on a process group of its own, for a quick look at a topology or a new
cluster. Every rank runs it, started by a launcher with train.py's run flags; rank 0 writes
the JSON (atomically).
"""

import argparse
import os
import sys
from datetime import timedelta

import pytorch_lightning as pl
import torch
import torch.distributed as dist

from ddpscale.io import write_json_atomic
from ddpscale.measurement import probe as measurement_probe
from ddpscale.measurement import stepprobe
from ddpscale.measurement.timing import WorldSizeError, check_world_size
from ddpscale.training import plugins
from ddpscale.training.runargs import add_run_args, set_threads, topology


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_run_args(p)
    p.add_argument("--out", required=True, help="probe.json to write")
    p.add_argument("--steps", type=int, default=measurement_probe.DEFAULTS["steps"], help="micro-batches per timed block (whole optimizer steps: rounded up to accumulate_grad_batches)")
    p.add_argument("--rounds", type=int, default=measurement_probe.DEFAULTS["rounds"], help="rounds of (no_sync block, synced block)")
    p.add_argument("--warmup", type=int, default=measurement_probe.DEFAULTS["warmup"], help="untimed steps / all-reduce calls first")
    p.add_argument("--iters", type=int, default=measurement_probe.DEFAULTS["iters"], help="timed all-reduce calls per message size")
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


def start_group(info: dict, device: torch.device, timeout_s: float) -> None:
    """This script's own process group (train.py uses the one Lightning forms); none for one rank."""
    if info["world_size"] == 1:
        return
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=f"tcp://{info['addr']}:{info['port']}",
                            rank=info["rank"], world_size=info["world_size"], timeout=timedelta(seconds=timeout_s))


def probe(args) -> dict | None:
    topo = topology(args)
    info = rank_info(args.cluster_env)
    set_threads(args, torch)
    pl.seed_everything(args.seed, workers=True, verbose=False)
    device = stepprobe.resolve_device(args.accelerator, info["local_rank"])
    start_group(info, device, args.collective_timeout_s)
    check_world_size(dist.get_world_size() if dist.is_initialized() else 1, topo.world_size)
    return measurement_probe.measure(args, device, info["rank"], info["local_rank"], info["node_rank"],
                                     steps=args.steps, rounds=args.rounds, warmup=args.warmup, iters=args.iters)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        record = probe(args)
        if record is not None:
            write_json_atomic(args.out, record)
            print(measurement_probe.summary(record), flush=True)
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
