"""The probe of one topology: where a training step's time goes, and all-reduce bandwidth.

It runs in the first repeat's training job, on the process group Lightning formed, before
the first epoch (ddpscale.training.probing, from the callback ProbeBeforeTraining), on a copy
of the run's module; scripts/probe.py runs the same probe under the same Trainer and stops
before training. This module is its record: what was measured (stepprobe, commbench) and,
when the probe could not measure, an n/a record with the reason, which never fails the run.
"""

from __future__ import annotations

import time

import torch

SCHEMA_VERSION = 1
# Probe sizes: micro-batches per timed block, rounds of (no_sync, synced) blocks, untimed
# warm-up steps and all-reduce calls, timed all-reduce calls per message size.
DEFAULTS = {"steps": 20, "rounds": 5, "warmup": 3, "iters": 10}
NA = "n/a"


def record(*, topology: str, num_nodes: int, devices_per_node: int, places: list[dict], backend: str,
           device: torch.device, precision: str, gradient: tuple[int, int], allreduce: list[dict], step: dict,
           started: float) -> dict:
    """Rank 0's record of a probe that measured; places: every rank's host and node rank."""
    numel, nbytes = gradient
    return {
        "schema_version": SCHEMA_VERSION,
        "status": "ok",
        "topology": topology,
        "num_nodes": num_nodes,
        "devices_per_node": devices_per_node,
        "world_size": len(places),
        "node_ranks": [p["node_rank"] for p in places],
        "hosts": sorted({p["host"] for p in places}),
        "backend": backend,
        "device_kind": device.type,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else f"{device.type}, simulated",
        "simulated": device.type != "cuda",
        "precision": precision,
        "gradient_numel": numel,
        "gradient_bytes": nbytes,
        "allreduce": allreduce,
        "step": step,
        "probe_wall_s": time.perf_counter() - started,
    }


def na_record(topology: str, world_size: int, reason: str) -> dict:
    """The record of a probe that could not measure: the run trains on, the report shows the
    topology's terms as unknown with this reason."""
    return {"schema_version": SCHEMA_VERSION, "status": NA, "reason": reason, "topology": topology,
            "world_size": world_size}


def is_na(probe: dict) -> bool:
    return probe.get("status") == NA


def summary(record: dict) -> str:
    if is_na(record):
        return f"ddpscale probe: n/a for {record['topology']}: {record['reason']}; training goes on"
    step, last = record["step"], record["allreduce"][-1]
    ms = lambda s: f"{s * 1e3:.3f} ms"  # noqa: E731
    busbw = "n/a (one rank)" if last["busbw_gbps"] is None else f"{last['busbw_gbps']:.3f} GB/s"
    return (f"ddpscale probe: {record['topology']} world size {record['world_size']} ({record['backend']}, "
            f"{record['device_name']}): per batch data {ms(step['data_s'])}, compute {ms(step['compute_s'])}, "
            f"exposed comm {ms(step['exposed_comm_s'])}, Lightning's per-batch sync {ms(step.get('loop_sync_s', 0.0))}"
            f"; all-reduce of {last['bytes']} B gradient: "
            f"{ms(last['time_s'])}, busbw {busbw}; probe {record['probe_wall_s']:.2f} s")
