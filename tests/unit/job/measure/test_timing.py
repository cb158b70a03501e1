"""Which epochs count as steady state (ddpscale.job.measure.timing): warm-up is per process, not per run."""
import time
from datetime import datetime

import pytest

from ddpscale.job.measure import timing
from ddpscale.job.measure.timing import EpochTiming, steady_epochs


def test_an_uninterrupted_run_leaves_out_its_first_epochs():
    assert steady_epochs([1, 1, 1, 1], warmup_epochs=1) == [1, 2, 3]
    assert steady_epochs([1, 1, 1, 1], warmup_epochs=0) == [0, 1, 2, 3]


def test_a_resumed_run_leaves_out_the_cold_epoch_of_each_process():
    # killed after epoch 0, resumed: epoch 1 is the new process's start-up (compilation, CUDA)
    assert steady_epochs([1, 2, 2, 2], warmup_epochs=1) == [2, 3]
    assert steady_epochs([1, 1, 2, 3, 3], warmup_epochs=1) == [1, 4]


def test_no_steady_epoch_left_means_no_throughput():
    metrics = EpochTiming(warmup_epochs=1)
    # two attempts of one epoch each: both cold
    metrics.epoch_times, metrics.train_times, metrics.samples = [2.0, 2.0], [1.5, 1.5], [100, 100]
    metrics.epoch_attempts = [1, 2]
    summary = metrics.section()
    assert summary["steady_epochs"] == []
    assert metrics.steady_figure() == (None, None)
    assert summary["fit_time_s"] == pytest.approx(4.0)


def test_throughput_of_a_resumed_run_counts_only_warm_epochs():
    metrics = EpochTiming(warmup_epochs=1)
    # the resumed process's first epoch was slow (8 s): it must not drag the figure down
    metrics.epoch_times, metrics.train_times = [5.0, 9.0, 2.0, 2.0], [4.0, 8.0, 1.0, 1.0]
    metrics.samples, metrics.epoch_attempts = [100, 100, 100, 100], [1, 2, 2, 2]
    assert metrics.steady_figure()[0] == pytest.approx(200 / 2.0)


def test_old_checkpoints_without_attempts_per_epoch_still_load():
    metrics = EpochTiming()
    metrics.load_state_dict({"epoch_times": [1.0, 1.0], "train_times": [0.5, 0.5], "samples": [10, 10],
                             "attempts": 1})
    assert metrics.epoch_attempts == [1, 1]


def test_a_manual_optimisation_step_that_returns_nothing_is_counted():
    """Lightning hands on_train_batch_end {} for a manual-optimisation training_step that
    returns nothing (the usual way to write one): its samples count, there is no loss to sum."""
    import torch

    metrics = EpochTiming()
    metrics.on_train_batch_end(None, None, {}, (torch.zeros(8, 2), torch.zeros(8)), 0)
    metrics.on_train_batch_end(None, None, {"loss": torch.tensor(0.5)}, (torch.zeros(4, 2), torch.zeros(4)), 1)
    assert metrics._count == 12 and float(metrics._loss_sum) == 0.5


def test_a_loss_in_a_buffer_the_next_step_overwrites_is_summed_as_it_was():
    """Under CUDA graphs (compile: reduce-overhead) a step's output is a static buffer that the
    next replay overwrites; Lightning's manual loop hands it on uncloned. A float32 loss's
    .detach().float() is that same storage, so keeping it as the sum aliased the buffer."""
    import torch

    metrics, buffer, batch = EpochTiming(), torch.zeros(()), (torch.zeros(4, 2), torch.zeros(4))
    for step, loss in enumerate((1.0, 2.0, 4.0)):
        buffer.fill_(loss)  # the replay writes this step's loss into the same buffer
        metrics.on_train_batch_end(None, None, {"loss": buffer}, batch, step)
    buffer.fill_(100.0)
    assert float(metrics._loss_sum) == 7.0


def test_samples_trained_counts_every_epoch_warm_up_included():
    metrics = EpochTiming(warmup_epochs=1)
    metrics.epoch_times, metrics.train_times, metrics.samples = [2.0, 1.0, 1.0], [1.5, 0.8, 0.8], [64, 64, 32]
    metrics.epoch_attempts = [1, 1, 1]
    summary = metrics.section()
    assert summary["samples_trained"] == 160 and summary["steady_samples"] == 96


def test_held_time_adds_the_earlier_attempts_to_this_ones():
    assert timing.held_s(earlier_s=120.0, since=1000.0, now=1030.0) == pytest.approx(150.0)
    assert timing.held_s(earlier_s=0.0, since=1000.0, now=990.0) == 0.0  # a clock step back adds nothing


def test_a_resumed_run_carries_what_its_earlier_attempt_held_in_the_checkpoint():
    first = EpochTiming()
    first.held_since = time.time() - 100.0  # this attempt started 100 s ago
    saved = first.state_dict()  # what its checkpoint keeps
    assert saved["held_s"] >= 100.0
    resumed = EpochTiming()
    resumed.held_since = time.time() - 5.0
    resumed.load_state_dict(saved)
    assert resumed.section()["held_s"] >= saved["held_s"] + 5.0
    # a checkpoint from before held time was kept: nothing earlier is known
    old = EpochTiming()
    old.load_state_dict({"epoch_times": [], "train_times": [], "samples": [], "attempts": 1})
    assert old.held_before_s == 0.0


def test_held_time_starts_at_the_slurm_job_on_slurm_only():
    env = {timing.JOB_START: "1000"}
    assert timing.started(env, 1060.0, on_slurm=True) == (1000.0, timing.FROM_JOB)
    # the local launcher inside an allocation: the job's start is other runs' time
    assert timing.started(env, 1060.0, on_slurm=False) == (1060.0, timing.FROM_PROCESS)
    # Slurm before 23.02 sets none: the controller is asked (scontrol), and without an answer
    # the process's start stands; a job "started" after its process is a clock apart
    asked = []
    env = {"SLURM_JOB_ID": "42"}
    assert timing.started(env, 1060.0, on_slurm=True, ask=lambda j: asked.append(j) or 1010.0) == (1010.0, timing.FROM_JOB)
    assert asked == ["42"]
    assert timing.started(env, 1060.0, on_slurm=True, ask=lambda j: None) == (1060.0, timing.FROM_PROCESS)
    assert timing.started({}, 1060.0, on_slurm=True) == (1060.0, timing.FROM_PROCESS)
    assert timing.started({timing.JOB_START: "1100"}, 1060.0, on_slurm=True) == (1060.0, timing.FROM_PROCESS)
    assert timing.started({timing.JOB_START: "soon"}, 1060.0, on_slurm=True) == (1060.0, timing.FROM_PROCESS)


def test_held_time_starts_at_the_process_start_not_when_the_callback_is_built():
    before = timing.process_start()
    assert EpochTiming().held_since == before <= time.time()


def test_the_job_start_is_read_from_scontrol_as_slurm_writes_it():
    # one line of `scontrol show job -o` from the test cluster (Slurm 22.05)
    line = ("JobId=57 JobName=ddpscale UserId=root(0) JobState=RUNNING Reason=None SubmitTime=2026-11-25T01:02:00 "
            "EligibleTime=2026-11-25T01:02:00 StartTime=2026-11-25T01:02:03 EndTime=2026-11-25T03:02:03")
    assert timing.start_time(line) == datetime(2026, 11, 25, 1, 2, 3).timestamp()
    assert timing.start_time("JobId=57 StartTime=Unknown") is None
    assert timing.start_time("slurm_load_jobs error: Invalid job id specified") is None
    assert timing.scontrol_start(None) is None
