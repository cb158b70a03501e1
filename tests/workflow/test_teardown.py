"""A rank that finished exits cleanly: the process group is destroyed before the interpreter's
teardown, which otherwise aborts gloo ranks at random ("terminate called without an active
exception"): on this machine 2 of 3 runs of the script below aborted without the call, and a
finished 1x2 SLURM job failed so in the suite."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from helpers.workflow import ROOT

pytestmark = pytest.mark.timeout(120)

RANK = """
import os, sys
sys.path.insert(0, {scripts!r})
import torch, torch.distributed as dist
from ddpscale.job.launch.ranks import close_process_group
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:{port}", rank=int(sys.argv[1]), world_size=2)
tensor = torch.ones(1000)
dist.all_reduce(tensor)
assert tensor[0].item() == 2
close_process_group()
assert not dist.is_initialized()
close_process_group()  # a second call, or a run with no group, is a no-op
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("attempt", range(5))
def test_two_gloo_ranks_that_close_their_group_exit_cleanly(attempt):
    code = RANK.format(scripts=str(ROOT / "scripts"), port=free_port())
    ranks = [subprocess.Popen([sys.executable, "-c", code, str(rank)], stderr=subprocess.PIPE, text=True)
             for rank in (0, 1)]
    for rank in ranks:
        _, err = rank.communicate(timeout=90)
        assert rank.returncode == 0, err[-2000:]
        assert "terminate called" not in err
