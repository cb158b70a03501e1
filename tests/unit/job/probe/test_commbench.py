"""The all-reduce benchmark of the probe (ddpscale.job.probe.allreduce): message sizes, nccl-tests'
bandwidths, the gradient in DDP's buckets and timing, in this process (on 2 gloo ranks:
tests/workflow/test_commbench.py)."""

from __future__ import annotations

import pytest

from ddpscale.job.probe.allreduce import allreduce_benchmark, bandwidths, message_sizes


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
    from ddpscale.job.probe.allreduce import ddp_buckets

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

    from ddpscale.job.probe.allreduce import allreduce_as_ddp

    assert allreduce_as_ddp([1024, 512], torch.device("cpu"))["time_s"] == 0.0  # no group: nothing sent
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        row = allreduce_as_ddp([4096, 4096, 100], torch.device("cpu"), warmup=1, iters=3)
    finally:
        dist.destroy_process_group()
    assert row["time_s"] > 0 and row["iters"] == 3
    assert row["buckets"] == 3 and row["bytes"] == 8292 and row["bucket_bytes"] == [4096, 4096, 100]
