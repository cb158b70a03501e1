"""Every callback of a training run, built in one place; each one that measures gives its
section of metrics.json (ddpscale.job.record assembles them).

train.py wires these into the Trainer; the measuring happens here and
in the modules each callback names (ddpscale.job), inside Lightning's own hooks.
Order matters where hooks share a moment: the world size is checked (EpochTiming) before
the probe spends time on the group. GPU utilisation is sampled in steady training only
(GpuFacts), so neither the probe nor the warm-up is in it.
"""

from __future__ import annotations

import os
import random
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import pytorch_lightning as pl
import torch
from pytorch_lightning.trainer.states import TrainerFn

from ddpscale.job.device import flops, gpu
from ddpscale.job.launch import ranks
from ddpscale.job.launch.ranks import PlacementCheck
from ddpscale.job.measure import samplecount
from ddpscale.job.measure.accuracy import ValHistory
from ddpscale.job.measure.timing import EpochTiming
from ddpscale.job.measure.windows import WindowedThroughput
from ddpscale.job.probe import inrun
from ddpscale.job.probe import record as probe_record
from ddpscale.job.resume.checkpoint import LAST, epoch_checkpoint
from ddpscale.job.resume.signals import GracefulStop
from ddpscale.run.runspec import RunSpec


class GpuFacts(pl.Callback):
    """Peak memory, and NVML utilisation over steady training only, gathered from every rank
    (CUDA only). The window opens at a training batch and closes for validation, checkpoint
    saves and the epoch's end; it reopens at the next training batch, so a checkpoint written
    at validation end (Lightning runs ModelCheckpoint after every other callback) stays
    outside. Steady as the run's figure is: in full mode the epochs after each process's first
    warmup_epochs (as EpochTiming); in throughput mode (windows given) the steady windows,
    whose warm-up is found at the end, so readings are kept from the first steady window on
    (a throughput run usually stops inside its first epoch, which full mode's rule leaves out)."""

    def __init__(self, placement: PlacementCheck, warmup_epochs: int, windows: WindowedThroughput | None = None):
        self.placement = placement
        self.warmup_epochs = warmup_epochs
        self.windows = windows
        self.sampler: gpu.UtilizationSampler | None = None
        self.epochs_here = 0  # epochs this process trained in (a resumed one counts)
        self._epoch: int | None = None
        self._steady = False
        self.record = dict(gpu.CPU_RECORD)

    def on_fit_start(self, trainer, pl_module) -> None:
        if trainer.strategy.root_device.type != "cuda":
            return
        uuid = (self.placement.own or {}).get("gpu_uuid")
        read, reason = gpu.open_utilization(uuid)
        self.sampler = gpu.UtilizationSampler(read, reason).start()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.sampler is None:
            return
        # counted here, not in on_train_epoch_start, which a run resumed mid-epoch never gets
        if trainer.current_epoch != self._epoch:
            self._epoch = trainer.current_epoch
            self.epochs_here += 1
            self._steady = self.windows is not None or self.epochs_here > self.warmup_epochs
        if self._steady:
            self.sampler.open()

    def _close(self, *_args) -> None:
        if self.sampler is not None:
            self.sampler.close()

    on_validation_start = on_train_epoch_end = on_save_checkpoint = _close

    def on_fit_end(self, trainer, pl_module) -> None:
        if self.sampler is None:
            return
        reason = self.sampler.reason
        since = None if self.windows is None else self.windows.steady_since()
        utilization = self.sampler.stop(since)
        if self.windows is not None:
            utilization = utilization if since is not None else []  # no steady window: no steady reading
            reason = reason or gpu.NO_STEADY_WINDOW_READING
        # every rank has a sampler on CUDA, so every rank joins the gather
        mine = {"peak_memory_mb": gpu.peak_memory_mb(trainer.strategy.root_device),
                "utilization": utilization, "reason": reason}
        self.record = gpu.summarize(ranks.gather(mine))


class CompileGrace(pl.Callback):
    """While torch.compile compiles, collectives wait compile_timeout_s, not collective_timeout_s.

    Every rank compiles its own graphs, and with max-autotune one can finish many minutes after
    another: the waiting ranks' collective timed out and killed a healthy run. Compilation
    happens in the probe, the first training steps and the first validation (eval graphs), and
    again in the test pass and a validation after throughput mode's stop. The wait is collective_timeout_s again once every rank has trained
    two steps (the first step's graphs and the optimizer's, run once more: a rank that got
    here has compiled them) and validated once, or begun a second epoch where none validates."""

    TRAINED_STEPS = 2

    def __init__(self, mode: str, timeout_s: float, grace_s: float):
        self.active = mode != "none"
        self.timeout_s, self.grace_s = timeout_s, grace_s
        self.steps, self.validated, self.epoch = 0, False, None
        self.compiling = False

    @staticmethod
    def _set(seconds: float) -> None:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            from datetime import timedelta

            from torch.distributed.distributed_c10d import _set_pg_timeout

            _set_pg_timeout(timedelta(seconds=seconds))

    def _grace(self) -> None:
        if self.active and not self.compiling:
            self._set(self.grace_s)
            self.compiling = True

    def _restore(self) -> None:
        if self.compiling:
            self._set(self.timeout_s)
            self.compiling = False

    def _settled(self) -> None:
        if self.steps >= self.TRAINED_STEPS and self.validated:
            self._restore()

    def on_fit_start(self, trainer, pl_module) -> None:
        self._grace()

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        if self.epoch is not None and trainer.current_epoch != self.epoch:
            self.validated = True  # an epoch ended without validating: there is nothing to compile for it
        self.epoch = trainer.current_epoch
        self._settled()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.steps += 1
        self._settled()

    def on_validation_start(self, trainer, pl_module) -> None:
        if trainer.state.fn != TrainerFn.FITTING:  # throughput mode's validation after its stop
            self._grace()

    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.state.fn != TrainerFn.FITTING:
            self._restore()
        elif not trainer.sanity_checking:
            self.validated = True
            self._settled()

    def on_test_start(self, trainer, pl_module) -> None:
        self._grace()

    def on_test_end(self, trainer, pl_module) -> None:
        self._restore()


class FlopsCount(pl.Callback):
    """Training FLOPs per sample, counted on rank 0 inside the fit over the first `steps`
    training batches of each attempt (ddpscale.job.device.flops.StepCounter): the real module on its
    device, in its precision, its trainer attached, on the batches the loaders yield, with each
    batch's samples as the run counts them (the BatchCounter that EpochTiming, earlier in the
    callbacks, has just counted it with). Those steps are kept to the attempt's first epoch
    and first throughput window, both warm-up, so the counter's overhead is in no timed figure
    (full mode with warmup_epochs 0 has no warm-up: it is said). Also the module's own analytic
    figure where it states one (`flops_per_sample()`), which must agree, and the float32
    arithmetic in effect while it trained (TF32 or not: which peak MFU uses)."""

    FLOAT32_KEYS = ("float32_matmul_precision", "cuda_matmul_allow_tf32", "cudnn_allow_tf32")
    MAX_STEPS = 16  # counting slows a step: a few batches' shapes, not the whole warm-up

    def __init__(self, counter: samplecount.BatchCounter, window_steps: int, warmup_epochs: int = 1,
                 measure: str = "full"):
        self.counter = counter
        self.steps = max(1, min(window_steps, self.MAX_STEPS))
        self.timed = measure == "full" and warmup_epochs == 0  # no warm-up epoch to count in
        self.step = flops.StepCounter()
        self.counted: list[flops.Counted] = []
        self._first_epoch: int | None = None
        self.record = {**flops.summarise([]), "flops_per_sample_analytic": None, "flops_reason": None,
                       **dict.fromkeys(self.FLOAT32_KEYS)}

    def on_train_start(self, trainer, pl_module) -> None:
        self._first_epoch = trainer.current_epoch  # this attempt's (a resumed one counts afresh)
        if self.timed and trainer.global_rank == 0:
            print(f"ddpscale: FLOPs are counted on the first {self.steps} training steps, which warmup_epochs: 0 "
                  "puts in the timed epochs: the counter's overhead slows those steps", flush=True)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if (trainer.global_rank == 0 and len(self.counted) < self.steps and self.step.error is None
                and trainer.current_epoch == self._first_epoch and not self.step.counting):
            self.step.start()

    def on_before_backward(self, trainer, pl_module, loss) -> None:
        self.step.in_backward = self.step.counting

    def on_after_backward(self, trainer, pl_module) -> None:
        self.step.in_backward = False

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.step.counting:
            self.counted.append(self.step.stop(self.counter.last))

    def _abandon(self, *_args) -> None:
        self.step.abandon()

    on_train_end = on_exception = _abandon

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self.step.abandon()  # a module whose on_train_batch_start returned -1 ends its epoch without a batch end
        # after an epoch: whatever the module or a callback set in setup or its hooks has
        # been in effect for a whole epoch of training
        if trainer.global_rank == 0:
            self.record.update(flops.float32_record())

    def float32(self) -> dict:
        return {key: self.record[key] for key in self.FLOAT32_KEYS}

    def section(self, world_size: int, throughput: float | None, device_name: str, precision: str) -> dict:
        """The record's flops section (ddpscale.core.record.SECTIONS; rank 0, after fit): the count,
        and what it makes of the run's headline throughput on these devices."""
        counted = self.record
        return {**counted, **flops.utilisation(
            counted["flops_per_sample"], throughput, world_size, device_name, precision, float32=self.float32(),
            conv_share=counted["flops_conv_share"], recomputed_per_sample=counted["flops_recomputed_per_sample"])}

    def on_fit_end(self, trainer, pl_module) -> None:
        if trainer.global_rank != 0:
            return
        if self.record["float32_matmul_precision"] is None:  # no epoch ended in this attempt
            self.record.update(flops.float32_record())
        summary, reason = flops.summarise(self.counted), None
        if self.counter.problem is not None:  # the same count the throughput uses: never a per-sample guess
            reason = f"samples not counted: {self.counter.problem}"
        elif self.step.error is not None:
            reason = f"the FLOP counter failed on an op of the training step ({self.step.error})"
        elif summary["flops_per_sample"] is None:
            reason = "no training batch was counted in this attempt"
        if reason:
            summary = flops.summarise([])
            print(f"ddpscale: FLOPs per sample not counted: {reason}; TFLOP/s and MFU will be n/a", flush=True)
        stated = getattr(pl_module, "flops_per_sample", None)
        analytic = stated() if callable(stated) else None
        warning = flops.check_analytic(summary["flops_per_sample"], analytic)
        if warning:
            print(warning, flush=True)
        self.record.update({**summary, "flops_per_sample_analytic": analytic, "flops_reason": reason})


@contextmanager
def rng_untouched(device: torch.device):
    """Run code that draws random numbers (the probe builds a model and shuffles a loader)
    without moving the generators training draws from: a probed repeat trains as an unprobed
    one would."""
    py_state, np_state = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        yield
    random.setstate(py_state)
    np.random.set_state(np_state)


class ProbeBeforeTraining(pl.Callback):
    """The topology's probe (ddpscale.job.probe.inrun), in this job, on the group Lightning
    formed, before the first epoch: one allocation serves probe and training, and the
    prediction uses the nodes that trained. It never fails the run: a probe that cannot
    measure is recorded n/a with its reason. Kept in the checkpoint, so a resumed run does not
    probe again. alone: probe with the sizes given, unsized, then stop before the first epoch
    (tests of the probe itself use it, so they need not train)."""

    def __init__(self, spec: RunSpec, sizes: dict | None = None, alone: bool = False):
        self.spec = spec
        self.sizes = dict(sizes or probe_record.DEFAULTS)
        self.alone = alone
        self.probed = False  # on every rank, so all of them skip a resumed run's probe together
        self.record: dict | None = None  # rank 0's, for metrics.json: measured, or n/a with the reason
        self.failure: inrun.Failure | None = None  # every rank's, when the probe could not measure
        self.seconds = 0.0  # this attempt's time in the probe, not part of fit_wall_s

    def state_dict(self) -> dict:
        return {"probed": self.probed, "record": self.record}

    def load_state_dict(self, state: dict) -> None:
        self.probed, self.record = bool(state.get("probed")), state.get("record")

    def on_fit_start(self, trainer, pl_module) -> None:
        if self.probed:  # every rank loaded the same checkpoint
            return
        # The run's train dataloader, built as fit builds it (fit then uses it, it does not
        # build it again). Outside the probe's guard and its random state: a data module that
        # fails here would fail the run anyway, and training draws what it would have drawn.
        trainer.fit_loop.setup_data()
        started = time.perf_counter()
        with rng_untouched(trainer.strategy.root_device):
            outcome = inrun.probe(trainer, pl_module, self.spec, **self.sizes,
                                    planned_steps=None if self.alone else planned_batches(trainer, self.spec),
                                    sized=not self.alone)
        self.seconds = time.perf_counter() - started
        self.failure = outcome.failure
        if trainer.global_rank == 0:
            self.record = outcome.record
            if not self.alone:
                print(probe_record.summary(self.record), flush=True)
        self.probed = True
        if self.alone:
            trainer.should_stop = True  # the fit loop ends before its first epoch


def probe_section(probe: ProbeBeforeTraining | None) -> dict:
    """The record's probe section (ddpscale.core.record.SECTIONS): this attempt's seconds in the
    probe (not part of fit_wall_s), and rank 0's probe record where the run probes."""
    return {"probe_s": probe.seconds, "probe": probe.record} if probe is not None else {"probe_s": 0.0}


def planned_batches(trainer, spec: RunSpec) -> float | None:
    """The training batches (micro-batches) this run plans on each rank, what the probe's cost
    is bounded by: every epoch's in full mode; in throughput mode, which stops once steady, the
    windows its rule looks at first (min_windows of window_steps). None where an epoch has no
    length (an iterable dataset)."""
    per_epoch = trainer.num_training_batches
    if per_epoch == float("inf"):
        return None
    planned = per_epoch * trainer.max_epochs
    if spec.measure == "throughput":
        planned = min(planned, spec.throughput.min_windows * spec.throughput.window_steps)
    return float(planned)


@dataclass
class RunCallbacks:
    timing: EpochTiming
    stop: GracefulStop
    placement: PlacementCheck
    gpu: GpuFacts
    flops: FlopsCount
    probe: ProbeBeforeTraining | None
    checkpoint: pl.callbacks.ModelCheckpoint
    windows: WindowedThroughput
    history: ValHistory = field(default_factory=lambda: ValHistory(None))
    grace: CompileGrace | None = None

    def all(self) -> list[pl.Callback]:
        # windows after timing: a stop decided at a batch's end is seen by the loop after every hook;
        # history before checkpoint: the epoch's checkpoint, saved at validation end, holds its value
        # grace before the probe: the probe's first steps compile too
        ordered = [self.placement, self.timing, self.grace, self.windows, self.probe, self.stop, self.gpu,
                   self.flops, self.history, self.checkpoint]
        return [c for c in ordered if c is not None]


def build(spec: RunSpec) -> RunCallbacks:
    per_device = spec.batch_per_device
    timing = EpochTiming(warmup_epochs=spec.warmup_epochs, expected_world_size=spec.topo.world_size,
                            batch_dim=spec.batch_dim, batch_per_device=per_device)
    # each rank's GPU: too few visible stops here, two ranks on one GPU at fit start
    placement = PlacementCheck(spec.accelerator, spec.devices_per_node)
    windows = WindowedThroughput(spec.throughput, stop=spec.measure == "throughput", batch_per_device=per_device,
                                 counter=timing.counter)
    return RunCallbacks(
        timing=timing,
        # a signal stops every rank at one step, with a checkpoint where the epoch checkpoint lives
        stop=GracefulStop(os.path.join(spec.ckpt_dir, LAST), before_save=timing.pause),
        placement=placement,
        gpu=GpuFacts(placement, spec.warmup_epochs, windows if spec.measure == "throughput" else None),
        flops=FlopsCount(timing.counter, spec.throughput.window_steps, spec.warmup_epochs, spec.measure),
        probe=ProbeBeforeTraining(spec) if spec.probe else None,
        checkpoint=epoch_checkpoint(spec.ckpt_dir),
        windows=windows,
        history=ValHistory(spec.epoch_metric),
        grace=CompileGrace(spec.compile, spec.collective_timeout_s, spec.compile_timeout_s),
    )

