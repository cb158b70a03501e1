"""The probe's comm term is the gradient all-reduced in DDP's buckets, as the run's DDP makes them."""

from __future__ import annotations

import pytest

from helpers.records import probe
from ddpscale.report.figures import breakdown


def test_the_comm_term_is_the_gradient_in_ddp_s_buckets():
    record = probe("1x2", 2, 0.0005, 0.003, 0.001, 0.002)
    # 20 buckets of GPT-2 small take longer than one message of the whole gradient
    record["allreduce_ddp"] = {"bucket_bytes": [1, 2], "buckets": 2, "bytes": 3, "time_s": 0.005, "iters": 3}
    assert breakdown.allreduce_s(record) == pytest.approx(0.005)
    assert breakdown.comm_per_batch_s({**record, "step": {**record["step"], "accumulate_grad_batches": 5}}) \
        == pytest.approx(0.001)


def test_the_probe_reads_the_bucket_cap_the_run_s_ddp_was_given():
    from pytorch_lightning.strategies import DDPStrategy

    from ddpscale.job.probe import inrun

    assert inrun.bucket_cap_mb(DDPStrategy(bucket_cap_mb=50)) == 50
    assert inrun.bucket_cap_mb(DDPStrategy()) is None
    assert inrun.bucket_cap_mb(object()) is None  # one device: no DDP strategy
