"""The all-reduce benchmark of the probe (ddpscale.job.probe.allreduce) on 2 gloo ranks, timed as
nccl-tests times it (message sizes, bandwidths, DDP's buckets and timing in this process:
tests/unit/job/probe/test_commbench.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from helpers.workflow import ROOT

MIB = 1024 * 1024


# -- timed as nccl-tests times it, on 2 gloo ranks ------------------

# One rank: the sweep and the gradient as DDP sends it, once on the real clock with every
# clock read, device sync and all-reduce logged in order, once on a clock that advances a
# fixed tick per read, 1 ms on rank 0 and 3 ms on rank 1, so a timed loop lasts one tick.
RANK = """
import itertools, json, sys, types
sys.path.insert(0, {scripts!r})
import torch, torch.distributed as dist
from ddpscale.job.probe import allreduce

rank, store, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=2)
cpu, events = torch.device("cpu"), []
real_all_reduce, real_sync, real_clock = dist.all_reduce, allreduce.sync_device, allreduce.time.perf_counter

def logged(name, call):
    def wrapper(*args, **kwargs):
        events.append(name)
        return call(*args, **kwargs)
    return wrapper

dist.all_reduce = logged("all_reduce", real_all_reduce)
allreduce.sync_device = logged("sync", real_sync)
allreduce.time = types.SimpleNamespace(perf_counter=logged("clock", real_clock))
sweep = allreduce.allreduce_benchmark({sizes!r}, cpu, warmup=2, iters={iters})
sweep_events, events[:] = list(events), []
as_ddp = allreduce.allreduce_as_ddp({buckets!r}, cpu, warmup=2, iters={iters})
ddp_events = list(events)

reads, tick = itertools.count(), (0.001, 0.003)[rank]
allreduce.time = types.SimpleNamespace(perf_counter=lambda: next(reads) * tick)
ticked = {{"sweep": allreduce.allreduce_benchmark({sizes!r}, cpu, warmup=1, iters={iters}),
          "as_ddp": allreduce.allreduce_as_ddp({buckets!r}, cpu, warmup=1, iters={iters})}}
dist.destroy_process_group()  # else gloo may abort at exit (pytorch#190489)
with open(out, "w") as f:
    json.dump({{"sweep": sweep, "sweep_events": sweep_events, "as_ddp": as_ddp, "ddp_events": ddp_events,
               "ticked": ticked}}, f)
"""
SIZES, BUCKETS, ITERS = [1024, 65536, 1 << 20], [MIB, 2 * MIB, 4096], 4


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """Each rank's results, rank 0's first."""
    folder = tmp_path_factory.mktemp("commbench")
    code = RANK.format(scripts=str(ROOT / "scripts"), sizes=SIZES, buckets=BUCKETS, iters=ITERS)
    outs = [folder / f"rank{rank}.json" for rank in (0, 1)]
    ranks = [subprocess.Popen([sys.executable, "-c", code, str(rank), str(folder / "store"), str(out)],
                              stderr=subprocess.PIPE, text=True) for rank, out in enumerate(outs)]
    for rank in ranks:
        _, err = rank.communicate(timeout=90)
        assert rank.returncode == 0, err[-2000:]
    return [json.loads(out.read_text()) for out in outs]


def timed_spans(events: list[str]) -> list[list[str]]:
    """What ran between each start and stop of the clock."""
    reads = [i for i, event in enumerate(events) if event == "clock"]
    return [events[start + 1:stop] for start, stop in zip(reads[::2], reads[1::2])]


@pytest.mark.timeout(120)
def test_each_size_is_one_loop_of_all_reduces_closed_by_one_device_sync(two_ranks):
    for rank in two_ranks:
        # nccl-tests' BenchTime: iters launches back to back, one stream sync, one clock
        assert timed_spans(rank["sweep_events"]) == [["all_reduce"] * ITERS + ["sync"]] * len(SIZES)
        # a whole gradient synchronisation (every bucket) is the loop's unit
        assert timed_spans(rank["ddp_events"]) == [["all_reduce"] * len(BUCKETS) * ITERS + ["sync"]]
    # the figure is the ranks' common one, and nccl-tests' bandwidths follow from it
    assert two_ranks[0]["sweep"] == two_ranks[1]["sweep"] and two_ranks[0]["as_ddp"] == two_ranks[1]["as_ddp"]
    for row, size in zip(two_ranks[0]["sweep"], SIZES):
        assert row["bytes"] == size and row["iters"] == ITERS and row["time_s"] > 0
        assert row["algbw_gbps"] == pytest.approx(size / row["time_s"] / 1e9)
        assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"])  # 2(n-1)/n = 1 at 2 ranks
    as_ddp = two_ranks[0]["as_ddp"]
    assert as_ddp["time_s"] > 0 and as_ddp["iters"] == ITERS and as_ddp["bytes"] == sum(BUCKETS)


@pytest.mark.timeout(120)
def test_time_is_the_loop_over_iters_averaged_over_ranks_not_the_slowest(two_ranks):
    # each rank's loop lasts one tick: 1 ms on rank 0, 3 ms on rank 1. nccl-tests prints the
    # mean over ranks of loop / iters (2 ms / iters); the slowest rank's would be 3 ms / iters
    for rank in two_ranks:
        for row in rank["ticked"]["sweep"]:
            assert row["time_s"] == pytest.approx(0.002 / ITERS)
            assert row["busbw_gbps"] == pytest.approx(row["bytes"] / (0.002 / ITERS) / 1e9)
        assert rank["ticked"]["as_ddp"]["time_s"] == pytest.approx(0.002 / ITERS)
