"""The all-reduce benchmark of the probe (ddpscale.job.commbench): message sizes,
nccl-tests' bandwidths and timing, in this process and on 2 gloo ranks."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import ROOT
from ddpscale.job.commbench import allreduce_benchmark, bandwidths, message_sizes


def test_message_sizes_double_from_1kb_and_end_at_the_gradient():
    assert message_sizes(11336) == [1024, 2048, 4096, 8192, 11336]
    assert message_sizes(8192) == [1024, 2048, 4096, 8192]  # no repeated last size
    assert message_sizes(1025) == [1024, 1025]
    assert message_sizes(1024) == [1024]
    assert message_sizes(300) == [300]
    assert message_sizes(5000, start=2000) == [2000, 4000, 5000]
    with pytest.raises(ValueError, match="no trainable gradient"):
        message_sizes(0)


def test_bandwidths_follow_nccl_tests():
    assert bandwidths(2_000_000_000, 2.0, 4) == pytest.approx((1.0, 1.5))  # busbw = algbw * 2*3/4
    assert bandwidths(1_000_000_000, 0.5, 2) == pytest.approx((2.0, 2.0))
    assert bandwidths(1_000_000_000, 1.0, 8) == pytest.approx((1.0, 1.75))
    assert bandwidths(1_000_000_000, 1.0, 1) == pytest.approx((1.0, 0.0))  # one rank moves nothing
    assert bandwidths(1024, 0.0, 4) == (None, None)  # nothing was timed


# -- all-reduce benchmark, in this process ---------------------------------------------

def test_allreduce_without_a_process_group_records_a_no_op():
    import torch

    rows = allreduce_benchmark([1024, 3000], torch.device("cpu"))
    assert rows == [{"bytes": 1024, "time_s": 0.0, "algbw_gbps": None, "busbw_gbps": None, "iters": 0},
                    {"bytes": 3000, "time_s": 0.0, "algbw_gbps": None, "busbw_gbps": None, "iters": 0}]


def test_allreduce_on_a_one_rank_gloo_group_is_timed(tmp_path):
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        rows = allreduce_benchmark([1024, 1026], torch.device("cpu"), warmup=1, iters=3)
    finally:
        dist.destroy_process_group()
    assert [r["bytes"] for r in rows] == [1024, 1026]
    for row in rows:
        assert row["time_s"] > 0 and row["iters"] == 3
        assert row["algbw_gbps"] == pytest.approx(row["bytes"] / row["time_s"] / 1e9)
        assert row["busbw_gbps"] == 0.0


# -- the gradient as DDP sends it -----------------------------------

MIB = 1024 * 1024


def test_ddp_buckets_follow_ddp_s_defaults_and_the_run_s_bucket_cap():
    from ddpscale.job.commbench import ddp_buckets

    # GPT-2 small's fp32 gradient, 124 M parameters: 1 MiB first, 25 MiB buckets, the rest last
    grad = 124_439_808 * 4
    buckets = ddp_buckets(grad)
    assert buckets[0] == MIB and set(buckets[1:-1]) == {25 * MIB} and 0 < buckets[-1] <= 25 * MIB
    assert sum(buckets) == grad and len(buckets) == 20
    # bucket_cap_mb set in the run's DDP kwargs: no small first bucket
    assert ddp_buckets(10 * MIB + 5, bucket_cap_mb=4) == [4 * MIB, 4 * MIB, 2 * MIB + 5]
    assert ddp_buckets(300) == [300]  # a small model: one bucket
    with pytest.raises(ValueError, match="bucket_cap_mb must be positive"):
        ddp_buckets(300, bucket_cap_mb=0)


def test_allreduce_as_ddp_times_every_bucket_of_one_sync(tmp_path):
    import torch
    import torch.distributed as dist

    from ddpscale.job.commbench import allreduce_as_ddp

    assert allreduce_as_ddp([1024, 512], torch.device("cpu"))["time_s"] == 0.0  # no group: nothing sent
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        row = allreduce_as_ddp([4096, 4096, 100], torch.device("cpu"), warmup=1, iters=3)
    finally:
        dist.destroy_process_group()
    assert row["time_s"] > 0 and row["iters"] == 3
    assert row["buckets"] == 3 and row["bytes"] == 8292 and row["bucket_bytes"] == [4096, 4096, 100]


# -- timed as nccl-tests times it, on 2 gloo ranks ------------------

# One rank: the sweep and the gradient as DDP sends it, once on the real clock with every
# clock read, device sync and all-reduce logged in order, once on a clock that advances a
# fixed tick per read, 1 ms on rank 0 and 3 ms on rank 1, so a timed loop lasts one tick.
RANK = """
import itertools, json, sys, types
sys.path.insert(0, {scripts!r})
import torch, torch.distributed as dist
from ddpscale.job import commbench

rank, store, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=2)
cpu, events = torch.device("cpu"), []
real_all_reduce, real_sync, real_clock = dist.all_reduce, commbench.sync_device, commbench.time.perf_counter

def logged(name, call):
    def wrapper(*args, **kwargs):
        events.append(name)
        return call(*args, **kwargs)
    return wrapper

dist.all_reduce = logged("all_reduce", real_all_reduce)
commbench.sync_device = logged("sync", real_sync)
commbench.time = types.SimpleNamespace(perf_counter=logged("clock", real_clock))
sweep = commbench.allreduce_benchmark({sizes!r}, cpu, warmup=2, iters={iters})
sweep_events, events[:] = list(events), []
as_ddp = commbench.allreduce_as_ddp({buckets!r}, cpu, warmup=2, iters={iters})
ddp_events = list(events)

reads, tick = itertools.count(), (0.001, 0.003)[rank]
commbench.time = types.SimpleNamespace(perf_counter=lambda: next(reads) * tick)
ticked = {{"sweep": commbench.allreduce_benchmark({sizes!r}, cpu, warmup=1, iters={iters}),
          "as_ddp": commbench.allreduce_as_ddp({buckets!r}, cpu, warmup=1, iters={iters})}}
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
