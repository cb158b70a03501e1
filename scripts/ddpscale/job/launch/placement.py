"""Where the ranks of a run landed: each rank's GPU, checked before any step, and the port
rank 0 listens on.

Pure functions over plain records (one dict per rank, as ddpscale.job.launch.ranks gathers
them), so the checks are unit-tested without GPUs or a scheduler. No torch import: the batch
step of a SLURM job imports this to pick the port before the ranks start.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Callable

# Ports below Linux's ephemeral range (32768-60999), so no port the kernel hands out for an
# outgoing connection lands on ours; 20000 stays clear of the well-known services below it.
PORT_LOW, PORT_HIGH = 20000, 32767

# What a user does when ranks share or miss GPUs: the usual cause is a site default that binds
# GPUs per task, while Lightning gives local rank k device cuda:k of all the node's GPUs.
FIX = ("every rank must see all the node's GPUs, one per rank; if the site binds GPUs per task "
       "(--gpu-bind, --gpus-per-task defaults), add site_env: \"SLURM_GPU_BIND=none\" to the "
       "profile's set-resources train")


class PlacementError(ValueError):
    """Ranks share a GPU or miss the GPUs they need: their timings would mean nothing."""


def master_port(job_id: str | int, is_free: Callable[[int], bool]) -> int:
    """A port for rank 0 that no other job on the first node uses.

    Starts from the full job id, so jobs running at once start from different ports (two ids
    that collide differ by a multiple of the range, 12768 jobs), then takes the first port
    is_free says is free there, so a collision needs both an unlucky id and the other job
    holding exactly that port.
    """
    span = PORT_HIGH - PORT_LOW + 1
    start = int(job_id) % span
    for step in range(span):
        port = PORT_LOW + (start + step) % span
        if is_free(port):
            return port
    raise PlacementError(f"no free port between {PORT_LOW} and {PORT_HIGH} on this node for rank 0")


def describe(record: dict) -> str:
    return (f"rank {record['rank']} (node {record['node_rank']} {record['host']}, local rank "
            f"{record['local_rank']}, CUDA_VISIBLE_DEVICES={record['cuda_visible_devices']})")


def visible_problem(record: dict, devices_per_node: int) -> str | None:
    """Why one GPU rank cannot use its device, or None. Lightning asks every rank for all N of
    the node's GPUs (devices=N) and gives local rank k the k-th one it sees."""
    if record["device"] == "cpu":
        return None
    need = max(devices_per_node, record["local_rank"] + 1)
    if record["gpus_visible"] < need:
        return (f"{describe(record)} sees {record['gpus_visible']} GPU(s) but needs {need} "
                f"(it trains on the GPU at index {record['local_rank']} of {devices_per_node} per node)")
    return None


def check(records: list[dict], devices_per_node: int) -> None:
    """Stop the run, naming the ranks, if any rank misses its GPU or two ranks share one.

    Every rank calls this on the same gathered records, so every rank raises or none does:
    none is left waiting in a collective.
    """
    problems = [p for p in (visible_problem(r, devices_per_node) for r in records) if p]
    by_gpu = defaultdict(list)
    for record in records:
        if record["device"] != "cpu":
            by_gpu[(record["host"], record["gpu_uuid"])].append(record)
    for (host, uuid), sharing in sorted(by_gpu.items(), key=lambda item: item[1][0]["rank"]):
        if len(sharing) > 1:
            problems.append(f"{' and '.join(describe(r) for r in sharing)} share GPU {uuid} on {host}")
    if problems:
        raise PlacementError("; ".join(problems) + f". {FIX}")


def summary(records: list[dict]) -> dict:
    """What metrics.json keeps: each rank's place, in rank order, and whether GPUs were used."""
    ranks = sorted(records, key=lambda r: r["rank"])
    return {"placement": ranks, "gpu_per_rank": all(r["device"] != "cpu" for r in ranks)}
