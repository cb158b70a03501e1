"""What every rank of a run reports and where it landed, and the end of its process.

- gather: every rank's value, gathered on every rank.
- The placement check (PlacementCheck): each rank's GPU, gathered once the process group forms and checked by
  ddpscale.job.launch.placement before the first step.
- close_process_group: the process group is destroyed while the interpreter still runs. Lightning
  leaves the default process group in place after fit and test. Left to the interpreter's
  teardown, gloo's worker threads are destroyed while still joinable and the process aborts
  ("terminate called without an active exception", pytorch/pytorch#190489): a run that finished
  and wrote its metrics then fails its job (seen on a 1x2 SLURM job: rank 1 aborted, srun killed
  rank 0 and snakemake marked the run failed).
"""

from __future__ import annotations

import os
import socket

import pytorch_lightning as pl
import torch

from ddpscale.job.launch import placement


def gather(value) -> list:
    """Every rank's value, in rank order (collective: all ranks must call it), or this rank's
    alone when there is no process group (one rank)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return [value]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


def formed_world_size() -> int:
    """The ranks of the process group that actually formed, not of the request (1 without one)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_world_size()
    return 1


def close_process_group() -> None:
    """Destroy the default process group, if one formed (a 1x1 run has none). Local to this
    rank, no collective: a rank that finishes first does not wait for the others."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def launcher_rank() -> dict:
    """This rank's place as the launcher set it (srun, else launch_local), before any group."""
    get = os.environ.get
    return {
        "rank": int(get("SLURM_PROCID", get("RANK", "0"))),
        "node_rank": int(get("SLURM_NODEID", get("NODE_RANK", "0"))),
        "local_rank": int(get("SLURM_LOCALID", get("LOCAL_RANK", "0"))),
    }


def own_record(device: torch.device | None, place: dict) -> dict:
    """One rank's record: where it runs, what it sees, which GPU it trains on (None on CPU)."""
    cuda = device is not None and device.type == "cuda"
    return {
        **place,
        # slurmd names the node: nodes that share a machine (the test cluster) share its hostname
        "host": os.environ.get("SLURMD_NODENAME") or socket.gethostname(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "gpus_visible": torch.cuda.device_count() if torch.cuda.is_available() else 0,
        "device": str(device) if cuda else "cpu",
        "gpu_uuid": str(torch.cuda.get_device_properties(device).uuid) if cuda else None,
        "master_addr": os.environ.get("MASTER_ADDR"),
        "master_port": os.environ.get("MASTER_PORT"),
    }


class PlacementCheck(pl.Callback):
    """Built before the Trainer: a rank that sees too few GPUs stops here, named, because the
    Trainer would refuse it with a traceback naming neither the rank nor the cause. At fit
    start every rank's record is gathered and checked; `records` then goes to metrics.json."""

    def __init__(self, accelerator: str, devices_per_node: int):
        self.devices_per_node = devices_per_node
        self.records: list[dict] | None = None
        self.own: dict | None = None  # this rank's record: GpuFacts reads its GPU by this UUID
        uses_gpu = accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available())
        if uses_gpu:
            place = launcher_rank()
            mine = own_record(None, place) | {"device": "cuda"}
            problem = placement.visible_problem(mine, devices_per_node)
            if problem:
                raise placement.PlacementError(f"{problem}. {placement.FIX}")

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit" or self.records is not None:
            return
        place = {"rank": trainer.global_rank, "node_rank": trainer.node_rank, "local_rank": trainer.local_rank}
        mine = own_record(trainer.strategy.root_device, place)
        records = gather(mine)
        placement.check(records, self.devices_per_node)
        self.records, self.own = records, mine

    def section(self) -> dict:
        """The record's placement section (ddpscale.core.record.SECTIONS)."""
        return placement.summary(self.records or [])
