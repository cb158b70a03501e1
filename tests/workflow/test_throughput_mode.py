"""Throughput mode in real runs (ddpscale.job.measure.windows): every rank stops at one step,
at the cap that was hit, and full mode times the same windows without stopping.

The data: 840 training samples, batch 32 per device, so 2 ranks take 14 steps an epoch (13
full batches and a short one). Windows of 5 steps run on across an epoch's end (their clock
paused for validation), so the 5th window, the rule's first look (min_windows 5), closes at
global step 25, in the second epoch; a cold first window can make the rule wait for its next
looks (7 and 9 windows).
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from helpers.configs import rule
from helpers.training import measured, throughput, train_command
from helpers.workflow import ROOT

from ddpscale.core import steadystate
from ddpscale.job.measure import windows

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


@pytest.mark.parametrize("nodes,devices", [(1, 2), (2, 1)])
def test_every_rank_stops_at_the_step_the_rule_decided(tmp_path, data_file, nodes, devices):
    # a precision any settled windows reach: the rule stops at one of its looks (window 5, 7, 9,
    # 12, ...), at the end of the window it decided on, on every rank, long before epoch 50
    log = []
    m = measured(tmp_path, data_file, nodes, devices, "--measure", "throughput",
                 "--max-epochs", "50", "--accuracy-metric", "test_acc", log=log, precision=0.9)
    assert m["stop_reason"] == "precision reached"
    windows_used = m["windows_steady"] + m["windows_warmup"]
    assert rule(min_windows=5).looks_at(windows_used) and m["steps_measured"] == 5 * windows_used
    # the rule it ran under, config throughput: whole and by its names
    assert steadystate.Rule.of(m["throughput"]) == rule(precision=0.9, window_steps=5, min_windows=5)
    # every window is in the record, so the interval can be recomputed
    assert len(m["window_seconds"]) == len(m["window_samples"]) == windows_used and m["windows_settled"]
    # and what the run held its devices for outside training, for the projected held hours
    from ddpscale.report.figures import projection

    assert m["probe_s"] == 0.0 and 0 < projection.outside_training_s(m) < m["held_s"]
    assert m["held_devices"] == 2  # its ranks: no site_exclusive here
    assert m["stop_steps_by_rank"] == [5 * windows_used] * 2, "the ranks stopped at different steps, or not where decided"
    # the whole epochs before the stop and the one it cut short, validated
    assert m["epochs_completed"] == 1 + 5 * windows_used // 14
    assert m["measure"] == "throughput" and m["time_per_epoch_s"] is None and m["throughput_from"] == "windows"
    # the figure is the windows' samples over their seconds, with its interval
    assert m["throughput_samples_s"] == m["window_throughput_samples_s"] > 0
    assert 0 < m["throughput_half_width"] <= 0.9 * m["throughput_samples_s"]
    assert m["samples_per_epoch"] == 840 and m["configured_epochs"] == 50
    assert m["checkpoint_saves"] == m["epochs_timed"] == m["epochs_completed"] and m["epoch_overhead_s"] > 0
    # two validations and two saves timed, the fit's and those after the stop (every rank took part)
    assert len(m["validation_s"]) + len(m["after_stop_validation_s"]) == max(2, m["epochs_completed"])
    assert len(m["after_stop_checkpoint_s"]) == max(0, 2 - m["checkpoint_saves"])
    # no test pass: throughput mode compares no accuracy (validation ran, at the stop), and its
    # log does not warn that the accuracy metric was not logged (the first H100 run did, twice)
    assert m["test_acc"] is None and m["val_acc"] is not None
    assert "accuracy.metric" not in log[0], log[0][-2000:]


def test_the_time_cap_stops_the_run_with_the_interval_it_reached(tmp_path, data_file):
    m = measured(tmp_path, data_file, 1, 2, "--measure", "throughput", "--max-epochs", "50",
                 precision=0.001, max_minutes=0.000001)
    assert m["stop_reason"] == "time cap reached"
    assert m["stop_steps_by_rank"] == [5, 5]  # the first window is past a cap of 60 us
    assert m["throughput_samples_s"] > 0 and m["throughput_half_width"] is None  # one window: no interval


def test_the_step_cap_and_the_configured_epochs_end_a_run_that_never_reaches_its_precision(tmp_path, data_file):
    capped = measured(tmp_path / "capped", data_file, 1, 1, "--measure", "throughput", "--max-epochs", "50",
                      precision=0.000001, max_steps=30)
    assert capped["stop_reason"] == "step cap reached" and capped["steps_measured"] == 30
    assert capped["stop_steps_by_rank"] == [30]  # 27 steps an epoch: the 6th window ends in the second
    ended = measured(tmp_path / "ended", data_file, 1, 1, "--measure", "throughput", "--max-epochs", "2",
                     precision=0.000001)
    assert ended["stop_reason"] == "configured epochs ended" and ended["epochs_completed"] == 2


def test_full_mode_times_the_windows_and_never_stops_early(tmp_path, data_file):
    m = measured(tmp_path, data_file, 1, 2, "--max-epochs", "3")
    assert m["measure"] == "full" and m["stop_reason"] == "full training"
    assert m["stop_steps_by_rank"] == [42, 42] and m["epochs_completed"] == 3
    assert m["steps_measured"] == 40  # 8 windows; the last 2 steps are a partial window, dropped
    # one whole epoch's samples, as the run counted them epoch by epoch
    assert m["samples_per_epoch"] == m["samples_trained"] / 3 == 840
    assert m["throughput_samples_s"] != m["window_throughput_samples_s"]  # the epochs' figure stays
    assert m["time_per_epoch_s"] > 0 and m["checkpoint_saves"] == 3 and m["checkpoint_s"] > 0


def test_the_windows_figure_is_the_headline_only_in_throughput_mode():
    full = windows.headline("full", 4, (10.0, 3.0), 12.0)
    assert full["throughput_samples_s"] == 10.0 and full["time_per_epoch_s"] == 3.0
    assert full["throughput_from"] == "steady epochs"
    fast = windows.headline("throughput", 4, (10.0, 3.0), 12.0)
    assert fast["throughput_samples_s"] == 12.0 and fast["time_per_epoch_s"] is None
    assert fast["configured_epochs"] == 4 and fast["measure"] == "throughput" and fast["throughput_from"] == "windows"
    # no steady window (the configured training ended first): the epochs' figure stands
    assert windows.headline("throughput", 4, (10.0, 3.0), None)["throughput_samples_s"] == 10.0


def test_a_training_shorter_than_a_window_keeps_its_epochs_figure(tmp_path, data_file):
    # 14 steps an epoch x 2 epochs on 2 ranks, windows of 50: the configured training ended first
    command = train_command(tmp_path, data_file, 1, 2, "--measure", "throughput", *throughput(window_steps=50))
    result = subprocess.run(command, capture_output=True, text=True, timeout=150, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    m = json.loads((tmp_path / "metrics.json").read_text())
    assert m["stop_reason"] == "configured epochs ended" and m["windows_steady"] == 0
    assert m["throughput_from"] == "steady epochs" and m["throughput_samples_s"] > 0 and m["time_per_epoch_s"] > 0


def test_the_projection_of_a_full_run_lands_near_its_measured_time(tmp_path, data_file):
    """The projection's parts against a real full run on CPU. Timings on this shared host vary
    by tens of percent, so the bound is loose; what it catches is a wrong part: samples per epoch
    of one rank instead of all (2x), epochs counted wrong (6x), windows' time taken as the
    epochs' (their validation and saves left out)."""
    from ddpscale.report.figures import projection

    m = measured(tmp_path, data_file, 1, 2, "--max-epochs", "6")
    projected, why = projection.project_run(m)
    assert why is None and m["samples_per_epoch"] == 840 and m["configured_epochs"] == 6
    measured_s = projection.measured_run(m)
    assert abs(projected / measured_s - 1) < 0.35, (projected, measured_s)


def test_each_window_keeps_when_it_began_and_the_steady_ones_say_since_when():
    """GPU utilisation in throughput mode is read from the first steady window on (GpuFacts):
    each window's start, on the sampler's clock, one per window and in order."""
    import time
    from types import SimpleNamespace

    import torch

    trainer = SimpleNamespace(strategy=SimpleNamespace(all_gather=lambda t: t), should_stop=False,
                              sanity_checking=False)
    module = SimpleNamespace(device=torch.device("cpu"))
    timed = windows.WindowedThroughput(rule(window_steps=2, min_windows=2, precision=0.5),
                                       stop=False, batch_per_device=4)
    batch = (torch.zeros(4, 2), torch.zeros(4))
    before = time.monotonic()
    for step in range(7):  # three windows close, a fourth is open; validation pauses the second
        timed.on_train_batch_start(trainer, module, batch, step)
        timed.on_train_batch_end(trainer, module, None, batch, step)
        if step == 2:
            timed.on_validation_start(trainer, module)
    assert len(timed.seconds) == 3 and len(timed.starts) == 4
    assert before <= timed.starts[0] <= timed.starts[1] <= timed.starts[2] <= timed.starts[3] <= time.monotonic()
    decision = timed.final()
    assert timed.steady_since() == timed.starts[decision.warmup_windows]
    assert windows.WindowedThroughput(rule(), stop=True, batch_per_device=4).steady_since() is None


def test_windows_do_not_count_the_padding_repeat_of_a_shard():
    """Issue 29 item 8: 5 samples on 2 ranks; DistributedSampler pads rank 1's shard with a
    repeat of sample 0, which samples_per_epoch leaves out, and so must the windows."""
    from types import SimpleNamespace

    import torch
    from torch.utils.data import DistributedSampler

    sampler = DistributedSampler(list(range(5)), num_replicas=2, rank=1, shuffle=False)
    trainer = SimpleNamespace(strategy=SimpleNamespace(all_gather=lambda t: t), should_stop=False,
                              sanity_checking=False, train_dataloader=SimpleNamespace(sampler=sampler),
                              fit_loop=SimpleNamespace(_combined_loader=None))  # as before fit combines them
    module = SimpleNamespace(device=torch.device("cpu"))
    timed = windows.WindowedThroughput(rule(window_steps=3, min_windows=2, precision=0.5),
                                       stop=False, batch_per_device=1)
    batch = (torch.zeros(1, 2), torch.zeros(1))
    for epoch in range(2):
        timed.on_train_epoch_start(trainer, module)
        for step in range(3):  # rank 1 draws samples 1, 3 and the repeat of 0
            timed.on_train_batch_start(trainer, module, batch, step)
            timed.on_train_batch_end(trainer, module, None, batch, step)
        timed.on_train_epoch_end(trainer, module)
    assert timed.samples == [2, 2]


def streamed(tmp_path: Path, devices: int, iterable: bool, **changes) -> dict:
    """train.py on 1x`devices` with the user's StreamData (tests/fixtures/usermods/streamed.py) in
    throughput mode, windows of one step: every epoch's short last batch is a window of its own."""
    import os
    import sys

    from helpers.training import launched

    train = [sys.executable, str(ROOT / "scripts/train.py"), "--topology", f"1x{devices}", "--num-nodes", "1",
             "--devices-per-node", str(devices), "--accelerator", "cpu", "--scaling", "weak", "--batch-size", "32",
             "--model-class", "usermods.streamed.StreamNet", "--data-class", "usermods.streamed.StreamData",
             "--data-args", json.dumps({"iterable": iterable}), "--ckpt-dir", str(tmp_path / "ckpt"),
             "--metrics", str(tmp_path / "metrics.json"), "--measure", "throughput", "--max-epochs", "50",
             *throughput(**{"window_steps": 1, "min_windows": 30, **changes})]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests/fixtures"), str(ROOT / "scripts")])}
    result = subprocess.run(launched(train, 1, devices), check=False, capture_output=True, text=True, timeout=150,
                            cwd=ROOT, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads((tmp_path / "metrics.json").read_text())


def stream_data(**kwargs):
    """The user's StreamData, set up here as the run sets it up, for the truth the test asserts."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("streamed", ROOT / "tests/fixtures/usermods/streamed.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    data = module.StreamData(batch_size=32, **kwargs)
    data.setup()
    return data


def test_one_step_windows_with_a_short_last_batch_give_the_windows_samples_over_seconds(tmp_path):
    """Issue 45 item 2: 580 records in batches of 32 make epochs of 18 full batches and one of 4,
    so one window in 19 holds 4 samples. The run's throughput is its steady windows' samples over
    their seconds; the mean of each window's seconds per sample, the figure before, counted the
    short window's fixed cost per step against 4 samples as if it were a full window's."""
    data = stream_data(iterable=False)
    per_step = [len(b[1]) for b in data.train_dataloader()]  # the truth, from the data module itself
    assert per_step[-1] == 4 and len(per_step) == 19
    m = streamed(tmp_path, 1, False, precision=0.000001, max_steps=95)
    assert m["stop_reason"] == "step cap reached" and m["throughput"]["window_steps"] == 1
    assert m["window_samples"] == per_step * 5  # every step a window: five epochs of them
    steady = slice(m["windows_warmup"], None)
    assert m["windows_steady"] >= steadystate.MIN_STEADY and 4 in m["window_samples"][steady]
    figure = sum(m["window_samples"][steady]) / sum(m["window_seconds"][steady])
    assert m["throughput_samples_s"] == m["window_throughput_samples_s"] == pytest.approx(figure, rel=1e-9)
    assert m["samples_per_epoch"] == 580 and m["samples_per_epoch_from"] == windows.LOADER_LENGTH


@pytest.mark.parametrize("devices", [1, 2])
def test_an_iterable_datasets_projection_comes_from_the_whole_epochs_counted(tmp_path, devices):
    """Issue 45 item 8: a stream with no length has no samples per epoch from its loader; the
    epochs the run trained whole, counted over every rank, give them (580 records, read once
    each an epoch across the ranks), and the full training is projected. The run stops at 40
    steps: two whole epochs on one rank (19 steps each), four on two (10 each); the epoch the
    stop cut short is not counted."""
    from ddpscale.report.figures import projection

    truth = sum(1 for _ in stream_data().train_dataloader().dataset)  # the records one pass reads
    m = streamed(tmp_path, devices, True, precision=0.000001, max_steps=40)
    assert m["stop_reason"] == "step cap reached" and sum(m["window_samples"]) > truth
    whole = 40 // (19 if devices == 1 else 10)
    assert m["samples_per_epoch"] == truth
    assert m["samples_per_epoch_from"] == f"counted in {whole} whole epoch{'s' if whole > 1 else ''}"
    projected, why = projection.project_run(m)
    assert why is None and projected > 50 * truth / m["window_throughput_samples_s"]


def test_the_epochs_size_comes_from_the_loader_else_from_the_whole_epochs_counted():
    assert windows.epoch_size(840, [830]) == {"samples_per_epoch": 840, "samples_per_epoch_from": windows.LOADER_LENGTH}
    assert windows.epoch_size(None, []) == {"samples_per_epoch": None, "samples_per_epoch_from": None}
    assert windows.epoch_size(None, [580]) == {"samples_per_epoch": 580,
                                               "samples_per_epoch_from": "counted in 1 whole epoch"}
    varied = windows.epoch_size(None, [578, 580, 583])
    assert varied == {"samples_per_epoch": 580,
                      "samples_per_epoch_from": "the mean counted in 3 whole epochs, 578 to 583"}
    # samples that could not be counted give no size of an epoch either, where it was counted
    timed = windows.WindowedThroughput(rule(window_steps=5), stop=True, batch_per_device=8)
    timed.loaders_record.pop("samples_per_epoch")  # as training's start does (on_train_start)
    timed.whole_epochs = [580]
    assert timed.section()["samples_per_epoch"] == 580
    entries = timed.section(uncounted="why")
    assert entries["samples_per_epoch"] is None and entries["samples_per_epoch_from"] is None
    assert entries["window_throughput_samples_s"] is None and entries["throughput_half_width"] is None
    timed.samples_per_epoch = 840
    assert timed.section(uncounted="why")["samples_per_epoch"] == 840


def test_only_epochs_whole_on_every_rank_give_the_size_of_an_epoch():
    """An epoch counts where it began in this process and its loader ran out (Lightning's fetcher
    saw no batch after its last): not a resumed attempt's first epoch, which began in an earlier
    process, nor one a stop cut short."""
    from types import SimpleNamespace

    import torch

    progress = SimpleNamespace(is_last_batch=False, current=SimpleNamespace(ready=0))
    trainer = SimpleNamespace(strategy=SimpleNamespace(all_gather=lambda t: t), should_stop=False,
                              sanity_checking=False, train_dataloader=None, num_training_batches=float("inf"),
                              fit_loop=SimpleNamespace(epoch_loop=SimpleNamespace(batch_progress=progress)))
    module = SimpleNamespace(device=torch.device("cpu"))
    timed = windows.WindowedThroughput(rule(window_steps=2, min_windows=2, precision=0.5),
                                       stop=False, batch_per_device=4)
    timed._counts_epochs = True  # as on_train_start sets it where the loader has no length
    batch = (torch.zeros(4, 2), torch.zeros(4))

    def epoch(steps: int, ends: bool, begins: bool = True) -> None:
        if begins:
            timed.on_train_epoch_start(trainer, module)
        for step in range(steps):
            timed.on_train_batch_start(trainer, module, batch, step)
            timed.on_train_batch_end(trainer, module, None, batch, step)
            progress.current.ready = step + 1
        progress.is_last_batch = ends
        timed.on_train_epoch_end(trainer, module)

    epoch(3, ends=True, begins=False)  # resumed mid-epoch: Lightning calls no on_train_epoch_start
    epoch(5, ends=True)
    epoch(2, ends=False)  # stopped mid-epoch
    assert timed.whole_epochs == [20]
    assert windows.epoch_size(None, timed.whole_epochs)["samples_per_epoch"] == 20
