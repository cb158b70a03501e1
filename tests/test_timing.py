"""Which epochs count as steady state (ddpscale.measurement.timing): warm-up is per process, not per run."""
import pytest

from ddpscale.measurement.timing import ScalingMetrics, steady_epochs


def test_an_uninterrupted_run_leaves_out_its_first_epochs():
    assert steady_epochs([1, 1, 1, 1], warmup_epochs=1) == [1, 2, 3]
    assert steady_epochs([1, 1, 1, 1], warmup_epochs=0) == [0, 1, 2, 3]


def test_a_resumed_run_leaves_out_the_cold_epoch_of_each_process():
    # killed after epoch 0, resumed: epoch 1 is the new process's start-up (compilation, CUDA)
    assert steady_epochs([1, 2, 2, 2], warmup_epochs=1) == [2, 3]
    assert steady_epochs([1, 1, 2, 3, 3], warmup_epochs=1) == [1, 4]


def test_no_steady_epoch_left_means_no_throughput():
    metrics = ScalingMetrics(warmup_epochs=1)
    # two attempts of one epoch each: both cold
    metrics.epoch_times, metrics.train_times, metrics.samples = [2.0, 2.0], [1.5, 1.5], [100, 100]
    metrics.epoch_attempts = [1, 2]
    summary = metrics.summary()
    assert summary["steady_epochs"] == []
    assert summary["throughput_samples_s"] is None and summary["time_per_epoch_s"] is None
    assert summary["fit_time_s"] == pytest.approx(4.0)


def test_throughput_of_a_resumed_run_counts_only_warm_epochs():
    metrics = ScalingMetrics(warmup_epochs=1)
    # the resumed process's first epoch was slow (8 s): it must not drag the figure down
    metrics.epoch_times, metrics.train_times = [5.0, 9.0, 2.0, 2.0], [4.0, 8.0, 1.0, 1.0]
    metrics.samples, metrics.epoch_attempts = [100, 100, 100, 100], [1, 2, 2, 2]
    assert metrics.summary()["throughput_samples_s"] == pytest.approx(200 / 2.0)


def test_old_checkpoints_without_attempts_per_epoch_still_load():
    metrics = ScalingMetrics()
    metrics.load_state_dict({"epoch_times": [1.0, 1.0], "train_times": [0.5, 0.5], "samples": [10, 10],
                             "attempts": 1})
    assert metrics.epoch_attempts == [1, 1]


def test_a_manual_optimisation_step_that_returns_nothing_is_counted():
    """Lightning hands on_train_batch_end {} for a manual-optimisation training_step that
    returns nothing (the usual way to write one): its samples count, there is no loss to sum."""
    import torch

    metrics = ScalingMetrics()
    metrics.on_train_batch_end(None, None, {}, (torch.zeros(8, 2), torch.zeros(8)), 0)
    metrics.on_train_batch_end(None, None, {"loss": torch.tensor(0.5)}, (torch.zeros(4, 2), torch.zeros(4)), 1)
    assert metrics._count == 12 and float(metrics._loss_sum) == 0.5
