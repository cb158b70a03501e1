"""Throughput in windows of steps, inside an epoch, and throughput mode's stop.

A real epoch can take an hour, so the measurement does not wait for epochs: every
`window_steps` training batches the window's seconds (device synchronised) and samples are
gathered from every rank in one collective, the slowest rank's seconds counted (the group
steps together), and ddpscale.core.steadystate decides on those numbers. Every rank
holds the same numbers, so every rank makes the same decision and stops after the same batch;
Lightning then runs the epoch's validation and checkpoint as at an epoch's end, which the
projection of the full training uses.

A window's clock runs while training runs: contiguous from step to step (the data fetch
between steps included), paused from the last step before validation or an epoch's end to
the next step, so a window may span epochs (a small dataset's epoch can be shorter than a
window) but never holds their validation, loader start or checkpoint, which are timed per
epoch instead (epoch_overhead_s). A partial window when training ends is dropped. In full mode the same windows are timed but never stop the run: they are the check
of a throughput-mode figure against the full training. A resumed attempt measures afresh (a
new process has its own warm-up); the steps of earlier attempts are not reused.
"""

from __future__ import annotations

import math
import os
import time

import pytorch_lightning as pl
import torch
from pytorch_lightning.trainer.states import TrainerFn

from ddpscale.core import steadystate
from ddpscale.job.device.gpu import sync_device
from ddpscale.job.measure import samplecount
from ddpscale.job.resume import checksum


class WindowedThroughput(pl.Callback):
    def __init__(self, rule: steadystate.Rule, stop: bool, batch_per_device: int,
                 counter: samplecount.BatchCounter | None = None):
        self.rule = rule
        # the run's one count of each batch's samples: EpochTiming' counter, which counts
        # before this callback reads it (callbacks.RunCallbacks.all); its own where it has none
        self.counter = counter or samplecount.BatchCounter()
        self._counts = counter is None
        self.stop = stop  # throughput mode: stop once decided; full mode: measure only
        self.batch_per_device = batch_per_device
        self.seconds: list[float] = []  # per window, the slowest rank's
        self.samples: list[int] = []  # per window, over all ranks
        # per window, when it began on this rank (time.monotonic, the GPU sampler's clock): the
        # steady windows' span is where throughput mode's GPU utilisation is read
        self.starts: list[float] = []
        self.decision: steadystate.Decision | None = None
        self.samples_per_epoch: int | None = None  # from the loaders' lengths; None: one has none
        self.loaders_record = samplecount.epoch_record(None, 0)  # none yet: before training starts
        # where it has none (an iterable dataset): each whole epoch's samples over all ranks, as
        # counted, an epoch whole where it began in this process and ran to the loader's end
        self.whole_epochs: list[int] = []
        self._counts_epochs = False
        self._epoch_begun = False
        self._epoch_seen = 0  # the rank's real samples so far this epoch (padding not counted)
        self._measuring_since: float | None = None
        self.stop_steps: list[int] | None = None  # each rank's global step when training ended
        # per epoch (this rank): the seconds from its start to the next epoch's start (or the
        # end of training) that no training step took: loader start, validation, checkpoint
        # save, hooks. What the projection adds per epoch to the steps the throughput gives.
        self.epoch_overheads: list[float] = []
        # each validation's seconds (this rank, device synchronised), with the epoch it ran in:
        # the projection counts validations by the trainer's check_val_every_n_epoch, not one an
        # epoch. after_stop: throughput mode's own validations after its stop (warm_overheads)
        self.validations: list[list] = []
        self.after_stop_validations: list[float] = []
        self.after_stop_saves: list[float] = []
        self._val_t0: float | None = None
        self.check_val_every_n_epoch: int | None = None
        self.validates: bool | None = None
        self._epoch_t0: float | None = None
        self._steps_s = 0.0
        self._drop()

    def _drop(self) -> None:
        self._t = None  # the clock of the open window, while training runs
        self._held = 0.0  # its seconds before the last pause
        self._steps = self._count = 0

    def on_train_start(self, trainer, pl_module) -> None:
        # every training loader's samples and padding repeats in an epoch (ddpscale.job.measure.samplecount)
        self.loaders_record = samplecount.epoch_record(trainer, self.batch_per_device)
        self.samples_per_epoch = self.loaders_record.pop("samples_per_epoch")
        self._counts_epochs = self.samples_per_epoch is None  # the same on every rank: gathered
        # how often the configured training validates, and so saves (ddpscale.report.figures.projection.events)
        self.check_val_every_n_epoch = trainer.check_val_every_n_epoch
        self.validates = bool(trainer.enable_validation)

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self._end_epoch(pl_module)
        self._epoch_t0 = time.perf_counter()
        self._epoch_seen = 0
        self._epoch_begun = True
        if self._counts:
            self.counter.start_epoch(trainer)

    def _end_epoch(self, pl_module) -> None:
        if self._epoch_t0 is not None:
            sync_device(pl_module.device)
            self.epoch_overheads.append(max(0.0, time.perf_counter() - self._epoch_t0 - self._steps_s))
        self._epoch_t0, self._steps_s = None, 0.0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self._t is None:  # the first step of the run, or after a pause (validation, an epoch's end)
            sync_device(pl_module.device)
            self._t = time.perf_counter()
            if self._steps == 0 and self._held == 0.0:
                self.starts.append(time.monotonic())
            if self._measuring_since is None:
                self._measuring_since = self._t

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._steps += 1
        # every loader's real samples: a padded shard's repeats are not counted, as
        # samples_per_epoch does not count them (ddpscale.job.measure.samplecount)
        samples = self.counter.count(batch, pl_module) if self._counts else self.counter.last
        self._epoch_seen += samples
        self._count += samples
        if self._steps >= self.rule.window_steps:
            self._close(trainer, pl_module)

    def _close(self, trainer, pl_module) -> None:
        sync_device(pl_module.device)
        now = time.perf_counter()
        mine = torch.tensor([self._held + now - self._t, now - self._measuring_since, float(self._count)],
                            dtype=torch.float64, device=pl_module.device)
        self._steps_s += now - self._t
        every = trainer.strategy.all_gather(mine).reshape(-1, 3)  # one collective per window
        self.seconds.append(float(every[:, 0].max()))
        self.samples.append(int(every[:, 2].sum()))
        if self.stop:  # full mode decides once, at the end (record)
            self.decision = steadystate.decide(self.seconds, self.samples, self.rule,
                                               elapsed_s=float(every[:, 1].max()))
            if self.decision.stop:
                trainer.should_stop = True  # every rank, after this batch: the epoch ends, validation runs
        self._drop()
        self._t = time.perf_counter()  # the gather is not part of training
        self.starts.append(time.monotonic())

    def _pause(self, trainer, pl_module) -> None:
        if self._t is not None:  # the window goes on at the next step; the pause is not in it
            sync_device(pl_module.device)
            elapsed = time.perf_counter() - self._t
            self._steps_s += elapsed
            self._held += elapsed
            self._t = None

    def on_validation_start(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking:
            self._pause(trainer, pl_module)
            sync_device(pl_module.device)
            self._val_t0 = time.perf_counter()

    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking or self._val_t0 is None:
            return
        sync_device(pl_module.device)
        seconds = time.perf_counter() - self._val_t0
        self._val_t0 = None
        if trainer.state.fn == TrainerFn.FITTING:
            self.validations.append([int(trainer.current_epoch), seconds])
        else:
            self.after_stop_validations.append(seconds)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self._pause(trainer, pl_module)
        if self._counts_epochs:
            self._count_epoch(trainer, pl_module)
        self._epoch_begun = False

    def _count_epoch(self, trainer, pl_module) -> None:
        """Keep the epoch's samples over all ranks where it was whole on every rank: it began in
        this process (a resumed attempt's first epoch did not) and ended where the loader did (its
        fetcher saw no batch after the last one, or the trainer's batch limit), not at a stop
        mid-epoch. One collective an epoch, on every rank alike: only where the loader has no length."""
        progress = trainer.fit_loop.epoch_loop.batch_progress
        ended = bool(progress.is_last_batch) or progress.current.ready == trainer.num_training_batches
        mine = torch.tensor([self._epoch_seen, int(self._epoch_begun and ended)],
                            dtype=torch.int64, device=pl_module.device)
        every = trainer.strategy.all_gather(mine).reshape(-1, 2)
        if bool((every[:, 1] == 1).all()):
            self.whole_epochs.append(int(every[:, 0].sum()))

    def on_train_end(self, trainer, pl_module) -> None:
        self._end_epoch(pl_module)
        # every rank's last step, read from the group: the evidence that all of them stopped together
        step = torch.tensor([trainer.global_step], dtype=torch.int64, device=pl_module.device)
        self.stop_steps = [int(s) for s in trainer.strategy.all_gather(step).reshape(-1)]

    def final(self) -> steadystate.Decision:
        """The decision the run's figure rests on (the same on every rank)."""
        d = self.decision
        if d is None or not d.stop:  # the configured epochs ended first: these windows are all there is
            d = steadystate.decide(self.seconds, self.samples, self.rule, ended=True)
        return d

    def steady_since(self) -> float | None:
        """When the first steady window began on this rank (time.monotonic), or None when no
        window is steady: the warm-up the rule found in the windows comes before it."""
        d = self.final()
        return self.starts[d.warmup_windows] if d.steady_windows and d.warmup_windows < len(self.starts) else None

    def section(self, uncounted: str | None = None) -> dict:
        """The record's windows section (ddpscale.core.record.SECTIONS; the same on every rank).
        uncounted: why some batch's samples could not be counted (EpochTiming.uncounted): no
        figure per sample then, nor samples per epoch where they were counted rather than read
        from the loader's length."""
        d = self.final()
        reason = ((steadystate.EPOCHS_ENDED if d.reason == steadystate.ENDED else d.reason) if self.stop
                  else steadystate.FULL_TRAINING)
        out = {
            "window_throughput_samples_s": d.throughput if d.steady_windows else None,
            # None where the windows are too few for an honest interval (too short to tell)
            "throughput_half_width": d.half_width if math.isfinite(d.half_width) else None,
            "windows_warmup": d.warmup_windows,
            "windows_steady": d.steady_windows,
            # False: no warm-up cut left the windows without a trend; the figure is the later half's
            "windows_settled": d.settled,
            # every window, the slowest rank's seconds and all ranks' samples, in order (the
            # first windows_warmup are the warm-up): the interval can be recomputed from them
            "window_seconds": list(self.seconds),
            "window_samples": list(self.samples),
            "steps_measured": len(self.seconds) * self.rule.window_steps,
            "stop_reason": reason,
            # the stopping rule it ran under, config throughput: whole and by its names (no caps in full mode)
            "throughput": self.rule.settings(),
            "warmup_excess_s": steadystate.warmup_excess_s(self.seconds, self.samples, d),
            **epoch_size(self.samples_per_epoch, self.whole_epochs),
            **self.loaders_record,
            "stop_steps_by_rank": self.stop_steps,
            "epoch_overhead_s": (sum(self.epoch_overheads) / len(self.epoch_overheads)
                                 if self.epoch_overheads else None),
            "epochs_timed": len(self.epoch_overheads),
            # each epoch's own (the first holds one-off costs: ddpscale.report.figures.projection)
            "epoch_overheads_s": list(self.epoch_overheads),
            # [epoch, seconds] of each validation in training; what validates and how often
            "validation_s": [list(v) for v in self.validations],
            "check_val_every_n_epoch": self.check_val_every_n_epoch,
            "validates": self.validates,
            # throughput mode's validations and saves after its stop (warm_overheads)
            "after_stop_validation_s": list(self.after_stop_validations),
            "after_stop_checkpoint_s": list(self.after_stop_saves),
        }
        if uncounted:
            out.update(window_throughput_samples_s=None, throughput_half_width=None)
            if out["samples_per_epoch_from"] not in (None, LOADER_LENGTH):  # counted: not what was trained
                out.update(samples_per_epoch=None, samples_per_epoch_from=None)
        return out


def warm_overheads(trainer, model, datamodule, windows: WindowedThroughput, saves_timed: int, scratch: str) -> None:
    """Throughput mode, after its stop: validate and save until two of each were timed, the
    fit's own included. The first of each in a process is cold (eval graphs compiling, the
    loader's first start, the first write): the projection adds that one once and needs a
    later one for the rest of the configured training's validations and saves. Every rank
    takes part (a validation and a save are collective); the save goes to `scratch`, removed."""
    if windows.validates:
        for _ in range(max(0, 2 - len(windows.validations))):
            trainer.validate(model, datamodule=datamodule, verbose=False)
    for _ in range(max(0, 2 - saves_timed)):
        sync_device(trainer.strategy.root_device)
        started = time.perf_counter()
        trainer.save_checkpoint(scratch)
        if trainer.is_global_zero:
            checksum.digest(scratch)  # as an epoch's save signs its file (EpochCheckpoint): its cost
        windows.after_stop_saves.append(time.perf_counter() - started)
    trainer.strategy.barrier("ddpscale-warm-overheads")
    if trainer.is_global_zero and os.path.exists(scratch):
        os.remove(scratch)


LOADER_LENGTH = "the loader's length"


def epoch_size(length: int | None, whole_epochs: list[int]) -> dict:
    """samples_per_epoch and where it comes from (samples_per_epoch_from): the loader's length
    where it has one, else the samples counted in the whole epochs the run trained (their mean
    where they differ: an iterable dataset may yield a few more or fewer each epoch, and the
    range is said); None where neither is known."""
    if length is not None:
        return {"samples_per_epoch": length, "samples_per_epoch_from": LOADER_LENGTH}
    if not whole_epochs:
        return {"samples_per_epoch": None, "samples_per_epoch_from": None}
    low, high, n = min(whole_epochs), max(whole_epochs), len(whole_epochs)
    said = f"counted in {n} whole epoch{'s' if n > 1 else ''}"
    if low != high:
        said = f"the mean {said}, {low} to {high}"
    return {"samples_per_epoch": round(sum(whole_epochs) / n), "samples_per_epoch_from": said}


def headline(measure: str, configured_epochs: int, steady_epochs: tuple[float | None, float | None],
             window_throughput: float | None) -> dict:
    """The record's throughput section: the run's headline figure, the one place it is chosen.
    steady_epochs: the steady epochs' (samples/s, s per epoch) (EpochTiming.steady_figure);
    window_throughput: the steady windows' samples/s (the windows section's). In throughput mode
    the windows' figure is the run's throughput and no whole epoch was timed, so there is no
    time per epoch; where the configured training ended before a window did (a tiny run), the
    run was a full one and its steady epochs' figure stands (throughput_from says which)."""
    throughput, per_epoch = steady_epochs
    source = "steady epochs"
    if measure == "throughput" and window_throughput is not None:
        throughput, per_epoch, source = window_throughput, None, "windows"
    return {"measure": measure, "configured_epochs": configured_epochs, "throughput_samples_s": throughput,
            "time_per_epoch_s": per_epoch, "throughput_from": source}
