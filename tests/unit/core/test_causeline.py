"""The line a failed run's row shows (make status, the report): the cause, not srun's aftermath.
The logs below are as srun and slurmstepd wrote them on the test cluster."""

from __future__ import annotations

import pytest

from ddpscale.core.io import cause_line

CUDA = ("ddpscale train: accelerator gpu, but torch 2.13.0+cpu sees no CUDA device on n1: a CPU-only build "
        "of torch, no NVIDIA driver found")


@pytest.mark.parametrize("log, expected", [
    # a rank stopped at the CUDA check: srun's two lines come after the reason
    (f"Seed set to 42\n{CUDA}\nsrun: error: n1: task 0: Exited with exit code 3\n"
     "srun: launch/slurm: _step_signal: Terminating StepId=296.0\n", CUDA),
    (f"{CUDA}\nsrun: error: r1: tasks 0,2: Exited with exit code 3\nsrun: error: r1: tasks 1,3: Terminated\n"
     "srun: error: r2: tasks 4-7: Terminated\nsrun: Force Terminated StepId=12.0\n", CUDA),
    # a cancelled job: slurmstepd's line is the cause and stays
    ("[rank0]: RuntimeError: Connection reset by peer\n"
     "slurmstepd-n1: error: *** STEP 308.0 ON n1 CANCELLED AT 2026-11-24T20:11:32 ***\n"
     "srun: error: n1: task 0: Terminated\nsrun: Force Terminated StepId=308.0\n",
     "slurmstepd-n1: error: *** STEP 308.0 ON n1 CANCELLED AT 2026-11-24T20:11:32 ***"),
    # nothing but srun's lines: the last one, rather than nothing
    ("srun: error: n2: task 1: Killed\n", "srun: error: n2: task 1: Killed"),
    # srun's own errors that are causes stay
    ("srun: error: Unable to create step for job 12: Requested node configuration is not available\n",
     "srun: error: Unable to create step for job 12: Requested node configuration is not available"),
    ("ValueError: bad\n\n  \n", "ValueError: bad"),
    ("", ""),
])
def test_cause_line(log, expected):
    assert cause_line(log) == expected
