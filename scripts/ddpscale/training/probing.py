"""The probe inside a run: every rank, on the group Lightning formed, before the first epoch.

It hands ddpscale.measurement a copy of the run's module attached to a view of its trainer
(probecopy), with the copy's own optimizers and batches of the run's train dataloader, and
never fails the run. A step that fails (user code the probe cannot run, a batch it cannot
draw) ends the probe with a one-line reason, and training goes on. Failures must not leave
a rank waiting in a collective for one that gave up, so the probe runs in phases and the
ranks agree after each (one gather) before any collective of the next:

1. on each rank alone, no collective: copy the module, build its optimizers, draw the
   batches, run one block of steps without DDP (every batch index the timing uses);
2. the timed steps under the probe's own DDP wrapper;
3. the all-reduce benchmark.

A failure on any rank becomes every rank's: the lowest failing rank's reason, agreed.
"""

from __future__ import annotations

import gc
import socket
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ddpscale.cluster import ranks
from ddpscale.measurement import batchsizes, commbench, stepprobe
from ddpscale.measurement import probe as probe_record
from ddpscale.training import probecopy
from ddpscale.training.runargs import per_device_batch


@dataclass(frozen=True)
class Failure:
    """Why the probe could not measure: the error and what the probe was doing."""
    kind: str
    message: str
    doing: str
    rank: int

    @property
    def reason(self) -> str:
        where = self.doing if self.rank == 0 else f"{self.doing}, rank {self.rank}"
        return f"{self.kind}: {self.message} (in {where})"


def failure_of(err: BaseException, doing: str, rank: int) -> Failure:
    lines = str(err).strip().splitlines()
    return Failure(type(err).__name__, lines[0] if lines else "", doing, rank)


@dataclass
class Outcome:
    record: dict | None  # rank 0: the record, measured or n/a; other ranks: None
    failure: Failure | None  # every rank: the agreed reason the probe could not measure


class _Probe:
    """One probe's objects (the copy, its view, optimizers, batches) and what it is doing now."""

    def __init__(self, trainer, module, args, sizes: dict):
        self.trainer, self.module, self.args, self.sizes = trainer, module, args, sizes
        self.device = trainer.strategy.root_device
        self.doing = "starting"
        self.runner = self.view = self.batches = self.waits = None
        self.step = self.gradient = self.allreduce = None  # what it measured
        self.accumulate = trainer.accumulate_grad_batches

    def attempt(self, phase) -> Failure | None:
        try:
            phase()
        except Exception as err:  # noqa: BLE001 - any error of the probe, reported, never fatal
            return failure_of(err, self.doing, self.trainer.global_rank)
        return None

    def alone(self) -> None:
        """Phase 1: nothing here waits for another rank."""
        self.doing = "copying the module"
        copied, self.view = probecopy.attach(self.trainer, self.module, self.args.compile)
        self.doing = "building the optimizers"
        optimizers = probecopy.build_optimizers(self.view)
        plugin = self.trainer.precision_plugin
        self.runner = stepprobe.Runner(copied, optimizers, self.device, context=plugin.train_step_context,
                                       scaler=probecopy.scales_loss(plugin),
                                       ddp_kwargs=getattr(self.trainer.strategy, "_ddp_kwargs", None))
        self.view.strategy.runner = self.runner
        self.doing = "drawing batches from the train dataloader"
        self.batches, self.waits = stepprobe.draw_batches(probecopy.batch_source(self.view),
                                                          self.sizes["steps"], self.device)
        self.doing = "running training steps on this rank alone"
        self.runner.try_alone(self.batches, self.sizes["steps"], self.accumulate)

    def time_steps(self) -> None:
        self.doing = "timing training steps under DDP"
        self.step = stepprobe.measure(
            self.runner, self.batches, self.waits, self.trainer.world_size, steps=self.sizes["steps"],
            rounds=self.sizes["rounds"], warmup=self.sizes["warmup"], batch_per_device=per_device_batch(self.args),
            accumulate=self.accumulate)
        sizes = getattr(self.args, "probe_batch_sizes", None)  # scripts/probe.py: its own batch only
        if self.trainer.world_size == 1 and sizes:
            # the baseline's compute at every topology's per-device batch, for the prediction
            self.doing = "timing compute at the topologies' per-device batches"
            self.step["compute_by_batch"] = batchsizes.compute_by_batch(
                self.runner, self.batches, sizes, per_device_batch(self.args), self.step["compute_s"],
                steps=self.sizes["steps"], rounds=self.sizes["rounds"], warmup=self.sizes["warmup"],
                accumulate=self.accumulate)

    def benchmark(self) -> None:
        self.doing = "benchmarking all-reduce"
        self.gradient = stepprobe.gradient_numel(self.runner.module)
        self.allreduce = commbench.allreduce_benchmark(commbench.message_sizes(self.gradient[1]), self.device,
                                                       warmup=self.sizes["warmup"], iters=self.sizes["iters"])

    def free(self) -> None:
        """The copy, its optimizers, DDP wrapper and batches, gone whatever happened."""
        self.runner = self.view = self.batches = self.waits = None
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def _agree(mine: Failure | None, **facts) -> tuple[Failure | None, list[dict]]:
    """Every rank's failure (and facts), gathered: the lowest failing rank's, on every rank."""
    gathered = ranks.gather({"failure": mine, **facts})
    failures = [g["failure"] for g in gathered if g["failure"] is not None]
    return (failures[0] if failures else None), gathered


def probe(trainer, module, args, *, steps: int, rounds: int, warmup: int, iters: int) -> Outcome:
    """Collective: every rank calls it. The run's train dataloader must be built already
    (trainer.fit_loop.setup_data())."""
    started = time.perf_counter()
    run = _Probe(trainer, module, args, {"steps": steps, "rounds": rounds, "warmup": warmup, "iters": iters})
    try:
        failure, places = _agree(run.attempt(run.alone), host=socket.gethostname(), node_rank=trainer.node_rank)
        for phase in (run.time_steps, run.benchmark):
            if failure is None:
                failure, _ = _agree(run.attempt(phase))
    finally:
        run.free()
    if trainer.global_rank != 0:
        return Outcome(None, failure)
    if failure is not None:
        return Outcome(probe_record.na_record(args.topology, trainer.world_size, failure.reason), failure)
    backend = dist.get_backend() if trainer.world_size > 1 else "none"
    return Outcome(probe_record.record(
        topology=args.topology, num_nodes=args.nodes, devices_per_node=args.devices, places=places,
        backend=backend, device=run.device, precision=args.precision, gradient=run.gradient,
        allreduce=run.allreduce, step=run.step, started=started), None)
