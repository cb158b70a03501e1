"""The workflow asks the baseline's probe for the compute at every topology's per-device batch
(ddpscale.job.probe.step; the timing itself and Lightning's per-batch sync:
tests/unit/job/probe/test_batchsizes.py)."""
from __future__ import annotations

import pytest


@pytest.mark.timeout(180)
def test_the_workflow_gives_the_baseline_every_topologys_per_device_batch(workspace):
    from helpers.workflow import tiny_config
    from helpers.devices import dry_run

    config = tiny_config(topologies=["1x1", "1x2", "2x2"], batch={"scaling": "strong", "size": 64}, repeats=2)
    rc, output = dry_run(workspace, config, cuda_visible_devices="")
    assert rc == 0, output
    commands = [line for line in output.splitlines() if line.startswith("Shell command: ")]
    sized = [c for c in commands if "'--probe-batch-sizes=[" in c and "'--probe-batch-sizes=[]'" not in c]
    # the baseline's first repeat, the one that probes
    assert len(sized) == 1 and "--topology=1x1 " in sized[0] and "--repeat=0 " in sized[0], sized
    assert " --probe '--probe-batch-sizes=[16, 32, 64]' " in sized[0]
