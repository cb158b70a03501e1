"""The probe of one topology: where a training step's time goes, and all-reduce bandwidth.

It runs in the first repeat's training job, on the process group Lightning formed, before
the first epoch (ddpscale.job.probe.inrun, from the callback ProbeBeforeTraining), on a copy
of the run's module. This module is its record: what was measured (step, allreduce) and,
when the probe could not measure, an n/a record with the reason, which never fails the run.
"""

from __future__ import annotations

import time

import torch

# Probe sizes: micro-batches per timed block, rounds of (no_sync, synced) blocks, untimed
# warm-up steps and all-reduce calls, timed all-reduce calls per message size.
DEFAULTS = {"steps": 20, "rounds": 5, "warmup": 3, "iters": 10}
# Smaller sizes, in the order tried, for a run whose training is short next to its steps' cost:
# the probe takes at most SHARE of the run's planned training, or FLOOR_S where that is more (a
# probe of a few seconds is never worth skipping), else it is skipped with the reason.
LADDER = (DEFAULTS, {"steps": 10, "rounds": 4, "warmup": 2, "iters": 6},
          {"steps": 6, "rounds": 3, "warmup": 1, "iters": 4}, {"steps": 4, "rounds": 2, "warmup": 1, "iters": 3})
SHARE, FLOOR_S = 0.2, 10.0
# The all-reduce benchmark, in training steps per call: a sweep of message sizes up to the
# gradient (about two gradients' worth per call), then the gradient in DDP's buckets; a step
# that all-reduces its gradient costs at least that much
ALLREDUCE_STEPS = 3
NA = "n/a"


def record(*, topology: str, num_nodes: int, devices_per_node: int, places: list[dict], backend: str,
           device: torch.device, precision: str, gradient: tuple[int, int], allreduce: list[dict], step: dict,
           started: float) -> dict:
    """Rank 0's record of a probe that measured; places: every rank's host and node rank."""
    numel, nbytes = gradient
    return {
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


def cost_steps(sizes: dict, world_size: int, accumulate: int = 1, other_batches: float = 0.0) -> float:
    """The probe's cost in training micro-batches: the block run alone, then per kind of timed
    block (compute alone; on several ranks also synced, and synced with Lightning's per-batch
    broadcast) its warm-up and rounds; the baseline's compute at the other topologies' batches
    (other_batches: the sum of their sizes over the run's own); the all-reduce benchmark."""
    opt_steps = -(-sizes["steps"] // accumulate)
    block = (sizes["warmup"] + sizes["rounds"] * opt_steps) * accumulate
    kinds = 3 if world_size > 1 else 1
    comm = ALLREDUCE_STEPS * (sizes["warmup"] + sizes["iters"]) if world_size > 1 else 0
    return opt_steps * accumulate + (kinds + other_batches) * block + comm


def sized(step_s: float, planned_steps: float | None, world_size: int, accumulate: int = 1,
          other_batches: float = 0.0) -> tuple[dict | None, str, dict]:
    """The largest probe sizes (LADDER) that cost at most SHARE of the run's planned training
    (planned_steps micro-batches of step_s seconds), or FLOOR_S where that is more, what was
    decided as text, and the bound: {"bound_s", "estimated_s"} (None where the run's length is
    unknown); (None, why, bound) where even the smallest would cost more. The sizes depend on
    step_s, a step timed on the host as it is: a busy host cuts the probe shorter."""
    if planned_steps is None:
        return (dict(DEFAULTS), "default size (the run's length is unknown: a train loader without a length)",
                {"bound_s": None, "estimated_s": None})
    allowed = max(SHARE * step_s * planned_steps, FLOOR_S)
    for sizes in LADDER:
        cost = step_s * cost_steps(sizes, world_size, accumulate, other_batches)
        bound = {"bound_s": allowed, "estimated_s": cost}
        if cost <= allowed:
            cut = "" if sizes == DEFAULTS else f" (cut from {DEFAULTS['steps']} x {DEFAULTS['rounds']} by the bound)"
            return dict(sizes), (f"{sizes['steps']} steps x {sizes['rounds']} rounds{cut}, about {cost:.1f} s, within "
                                 f"{SHARE:.0%} of the run's planned training ({planned_steps:.0f} batches of "
                                 f"{step_s * 1e3:.1f} ms) or {FLOOR_S:.0f} s"), bound
    return None, (f"skipped: even its smallest size would take about {cost:.1f} s, more than {SHARE:.0%} of this "
                  f"run's planned training ({planned_steps:.0f} batches of {step_s * 1e3:.1f} ms) and more than "
                  f"{FLOOR_S:.0f} s; the breakdown and prediction of this topology are n/a (train more batches "
                  "per run, max_epochs or throughput.min_windows, to have it probed)"), bound


def size_record(requested: dict, sizes: dict, step: dict, bound: dict) -> dict:
    """The record's `size`: the sizes asked for and timed with, how many micro-batches each kind
    of timed block ran in all (rounds x micro-batches per block; the step's medians are over
    these), whether the cost bound cut the sizes, and the bound with the cost it estimated."""
    return {"requested_steps": requested["steps"], "requested_rounds": requested["rounds"],
            "steps": sizes["steps"], "rounds": sizes["rounds"],
            "timed_batches": step["rounds"] * step["micro_batches_per_block"],
            "cut_by_bound": (sizes["steps"], sizes["rounds"]) != (requested["steps"], requested["rounds"]),
            "bound_s": bound.get("bound_s"), "estimated_s": bound.get("estimated_s")}


def na_record(topology: str, world_size: int, reason: str) -> dict:
    """The record of a probe that could not measure: the run trains on, the report shows the
    topology's terms as unknown with this reason."""
    return {"status": NA, "reason": reason, "topology": topology, "world_size": world_size}


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
            f"{ms(last['time_s'])}, busbw {busbw}; probe {record['probe_wall_s']:.2f} s"
            + (f" ({record['sized']})" if record.get("sized") else ""))
