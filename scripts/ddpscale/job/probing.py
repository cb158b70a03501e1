"""The probe inside a run: every rank, on the group Lightning formed, before the first epoch.

It hands the step probe and the all-reduce benchmark a copy of the run's module attached to a
view of its trainer (probecopy), with the copy's own optimizers and batches of the run's train dataloader, and
never fails the run. A step that fails (user code the probe cannot run, a batch it cannot
draw) ends the probe with a one-line reason, and training goes on. Failures must not leave
a rank waiting in a collective for one that gave up, so the probe runs in phases and the
ranks agree after each (one gather) before any collective of the next:

1. on each rank alone, no collective: copy the module, build its optimizers, draw the
   batches, run one block of steps without DDP (every batch index the timing uses);
2. the timed steps under the probe's own DDP wrapper;
3. the all-reduce benchmark.

A failure on any rank becomes every rank's: the lowest failing rank's reason, agreed.

Data wait: the probe draws its batches from the run's own train dataloader, moved to the run's
device as training moves them (resident batches are sliced where they live), each draw timed
to a device sync: data_drawn_s, what a batch costs when nothing runs beside it. The breakdown's
data_s is the part the training loop is exposed to (exposed_data_wait): Lightning draws the
next batch in the training process between steps, so a loader without worker processes
(num_workers 0, resident or Markov batches) is waited for whole; DataLoader workers prepare
batches while the step runs, so only what a step does not cover is waited for:
max(0, drawn - synced step). Moving a batch to the device happens between steps either way;
with workers it counts as hidden, an approximation that errs towards less data wait.

Afterwards training must run as in a repeat that never probed (release()): the copy, its
optimizers, DDP wrapper and batches are freed, CUDA's peak-memory statistics start again
(else repeat 0's peak_memory_mb carries the probe's second model and optimizer state), and
dynamo's in-process caches and counters are cleared, so training compiles its own graphs
(else repeat 0's warm-up epoch carries no compile time and compile_graphs counts the probe's).
Inductor's on-disk cache stays, as it stays for every later repeat.
"""

from __future__ import annotations

import gc
import socket
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from lightning_utilities.core.apply_func import apply_to_collection
from torch.utils.data import DataLoader

from ddpscale.job import batchsizes, commbench, probecopy, ranks, stepprobe
from ddpscale.job import proberecord as probe_record
from ddpscale.run import ddpsettings
from ddpscale.run.runspec import RunSpec


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


def failure_of(err: BaseException, doing: str, rank: int, ddp: dict | None = None, accumulate: int = 1) -> Failure:
    """The failure in one line; an error of DDP that the run's settings cause (ddp: the
    strategy's DDP kwargs) names the setting and its fix instead of torch's text."""
    setting = ddpsettings.step_error_line(err, ddp or {}, accumulate)
    lines = [setting] if setting else str(err).strip().splitlines()
    return Failure(type(err).__name__, lines[0] if lines else "", doing, rank)


@dataclass
class Outcome:
    record: dict | None  # rank 0: the record, measured or n/a; other ranks: None
    failure: Failure | None  # every rank: the agreed reason the probe could not measure


class _Probe:
    """One probe's objects (the copy, its view, optimizers, batches) and what it is doing now."""

    def __init__(self, trainer, module, spec: RunSpec, sizes: dict):
        self.trainer, self.module, self.spec, self.sizes = trainer, module, spec, sizes
        self.device = trainer.strategy.root_device
        self.doing = "starting"
        self.runner = self.view = self.batches = self.waits = None
        self.step = self.gradient = self.allreduce = self.allreduce_ddp = None  # what it measured
        self.step_s = None  # a warm step alone (seconds per micro-batch): what the probe is sized by
        self.sized = "default size"  # how it was sized (probe_record.sized), for the record
        self.requested = dict(sizes)  # the sizes asked for, before the cost bound
        self.bound = {"bound_s": None, "estimated_s": None}  # the cost bound, where it was sized
        self.accumulate = trainer.accumulate_grad_batches

    def attempt(self, phase) -> Failure | None:
        try:
            phase()
        except Exception as err:  # noqa: BLE001 - any error of the probe, reported, never fatal
            return failure_of(err, self.doing, self.trainer.global_rank,
                              getattr(self.trainer.strategy, "_ddp_kwargs", None), self.accumulate)
        return None

    def alone(self) -> None:
        """Phase 1: nothing here waits for another rank."""
        self.doing = "copying the module"
        copied, self.view = probecopy.attach(self.trainer, self.module, self.spec.compile)
        self.doing = "building the optimizers"
        optimizers = probecopy.build_optimizers(self.view)
        plugin = self.trainer.precision_plugin
        self.runner = stepprobe.Runner(copied, optimizers, self.device, context=plugin.train_step_context,
                                       scaler=probecopy.scales_loss(plugin),
                                       ddp_kwargs=getattr(self.trainer.strategy, "_ddp_kwargs", None),
                                       comm_hook=getattr(self.trainer.strategy, "_ddp_comm_hook", None))
        self.view.strategy.runner = self.runner
        self.doing = "drawing batches from the train dataloader"
        self.batches, self.waits = stepprobe.draw_batches(probecopy.batch_source(self.view),
                                                          self.sizes["steps"], self.device)
        self.doing = "timing a training step on this rank alone"
        self.step_s = self.runner.time_alone(self.batches, self.accumulate)

    def rest_alone(self) -> None:
        """Phase 1, once sized: every batch index the timed blocks use, still alone."""
        self.doing = "running training steps on this rank alone"
        self.batches, self.waits = self.batches[:self.sizes["steps"]], self.waits[:self.sizes["steps"]]
        self.runner.try_alone(self.batches, self.sizes["steps"], self.accumulate)

    def size(self, step_s: float, planned_steps: float | None) -> str | None:
        """Fit the probe to the run (probe_record.sized): the sizes it will time with, and
        what was decided; the reason where it is skipped instead."""
        own = self.spec.batch_per_device
        others = self.spec.probe_batch_sizes if self.trainer.world_size == 1 else None
        other_batches = sum(b / own for b in set(others or []) if b != own)
        sizes, self.sized, self.bound = probe_record.sized(step_s, planned_steps, self.trainer.world_size,
                                                           self.accumulate, other_batches)
        self.requested = dict(probe_record.DEFAULTS)  # the ladder's first rung, what the bound cuts
        if sizes is None:
            return self.sized
        self.sizes.update(sizes)
        return None

    def time_steps(self) -> None:
        self.doing = "timing training steps under DDP"
        self.step = exposed_data_wait(self.measure_steps(), loads_beside_steps(self.view.train_dataloader))
        sizes = self.spec.probe_batch_sizes
        if self.trainer.world_size == 1 and sizes:
            # the baseline's compute at every topology's per-device batch, for the prediction
            self.doing = "timing compute at the topologies' per-device batches"
            self.step["compute_by_batch"] = batchsizes.compute_by_batch(
                self.runner, self.batches, sizes, self.spec.batch_per_device, self.step["compute_s"],
                steps=self.sizes["steps"], rounds=self.sizes["rounds"], warmup=self.sizes["warmup"],
                accumulate=self.accumulate)

    def measure_steps(self) -> dict:
        return stepprobe.measure(
            self.runner, self.batches, self.waits, self.trainer.world_size, steps=self.sizes["steps"],
            rounds=self.sizes["rounds"], warmup=self.sizes["warmup"], batch_per_device=self.spec.batch_per_device,
            accumulate=self.accumulate)

    def benchmark(self) -> None:
        self.doing = "benchmarking all-reduce"
        self.gradient = stepprobe.gradient_numel(self.runner.module)
        self.allreduce = commbench.allreduce_benchmark(commbench.message_sizes(self.gradient[1]), self.device,
                                                       warmup=self.sizes["warmup"], iters=self.sizes["iters"])
        # the comm term: the gradient in the buckets the run's DDP sends (bucket_cap_mb if set),
        # at the width its comm hook sends them (half with fp16_compress or bf16_compress)
        width = comm_bytes_per_element(self.spec)
        buckets = commbench.ddp_buckets(self.gradient[1], bucket_cap_mb(self.trainer.strategy))
        sent, dtype = commbench.on_the_wire(buckets, width)
        self.allreduce_ddp = commbench.allreduce_as_ddp(sent, self.device, dtype=dtype,
                                                        warmup=self.sizes["warmup"], iters=self.sizes["iters"])
        self.allreduce_ddp["comm_bytes_per_element"] = width  # None: the gradient's own width

    def free(self) -> None:
        """The copy, its optimizers, DDP wrapper (with its comm hook's state), gradients and
        batches, gone whatever happened; then training's own statistics start (release)."""
        self.runner = self.view = self.batches = self.waits = None
        release(self.device)


def release(device: torch.device) -> None:
    """What the probe left in this process, cleared before training (see the module's docstring)."""
    import torch._dynamo
    from torch._dynamo.utils import clear_compilation_metrics, counters

    torch._dynamo.reset()  # compiled code of the copy: training's methods share its code objects
    counters.clear()  # compile_graphs and graph breaks (ddpscale.job.compiling.stats)
    clear_compilation_metrics()  # compile_recompiles
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def loads_beside_steps(loaders) -> bool:
    """Whether the run's train loaders prepare batches while a step runs (DataLoader workers)."""
    found = []
    apply_to_collection(loaders, DataLoader, lambda loader: found.append(loader.num_workers > 0))
    return any(found)


def exposed_data_wait(step: dict, beside_steps: bool) -> dict:
    """The step record with data_s the data wait training is exposed to (see the module's
    docstring); data_drawn_s the probe's own draws."""
    drawn = step["data_s"]
    exposed = max(0.0, drawn - step["sync_step_s"]) if beside_steps else drawn
    how = ("DataLoader workers prepare batches during the step: drawn minus the synchronised step, at least 0"
           if beside_steps else "drawn in the training process between steps: all of it")
    return {**step, "data_drawn_s": drawn, "data_s": exposed, "data_loads_beside_steps": beside_steps,
            "data_method": f"exposed data wait per batch; {how}"}


def bucket_cap_mb(strategy) -> float | None:
    """The bucket size the run's DDP was given (strategy DDPStrategy(bucket_cap_mb=...)), or
    None for DDP's default; the probe's own DDP wrapper gets the same kwargs."""
    return (getattr(strategy, "_ddp_kwargs", None) or {}).get("bucket_cap_mb")


def comm_bytes_per_element(spec: RunSpec) -> int | None:
    """The width the run's comm hook sends each gradient element at (config ddp.comm_hook), or
    None where it sends the gradient as it is."""
    return ddpsettings.HOOK_BYTES[spec.ddp["comm_hook"]]


def _agree(mine: Failure | None, **facts) -> tuple[Failure | None, list[dict]]:
    """Every rank's failure (and facts), gathered: the lowest failing rank's, on every rank."""
    gathered = ranks.gather({"failure": mine, **facts})
    failures = [g["failure"] for g in gathered if g["failure"] is not None]
    return (failures[0] if failures else None), gathered


def probe(trainer, module, spec: RunSpec, *, steps: int, rounds: int, warmup: int, iters: int,
          planned_steps: float | None = None, sized: bool = False) -> Outcome:
    """Collective: every rank calls it. The run's train dataloader must be built already
    (trainer.fit_loop.setup_data()). sized: fit the probe to the run's planned training
    (planned_steps micro-batches; None where unknown), or skip it with the reason
    (probe_record.sized); else it times with the sizes given."""
    started = time.perf_counter()
    run = _Probe(trainer, module, spec, {"steps": steps, "rounds": rounds, "warmup": warmup, "iters": iters})
    skipped = None
    try:
        failure, places = _agree(run.attempt(run.alone), host=socket.gethostname(), node_rank=trainer.node_rank,
                                 step_s=run.step_s)
        if failure is None and sized:
            # the slowest rank's step: every rank takes the same decision
            skipped = run.size(max(p["step_s"] for p in places), planned_steps)
        for phase in (run.rest_alone, run.time_steps, run.benchmark):
            if failure is None and skipped is None:
                failure, _ = _agree(run.attempt(phase))
    finally:
        run.free()
    if trainer.global_rank != 0:
        return Outcome(None, failure)
    if failure is not None:
        return Outcome(probe_record.na_record(spec.topology, trainer.world_size, failure.reason), failure)
    if skipped is not None:
        return Outcome(probe_record.na_record(spec.topology, trainer.world_size, skipped), None)
    backend = dist.get_backend() if trainer.world_size > 1 else "none"
    record = probe_record.record(
        topology=spec.topology, num_nodes=spec.nodes, devices_per_node=spec.devices, places=places,
        backend=backend, device=run.device, precision=spec.precision, gradient=run.gradient,
        allreduce=run.allreduce, step=run.step, started=started)
    record["allreduce_ddp"] = run.allreduce_ddp  # report.figures.breakdown.allreduce_s reads it
    record["sized"] = run.sized  # how big the probe was, and why: its cost is bounded by the run's
    record["size"] = probe_record.size_record(run.requested, run.sizes, run.step, run.bound)
    return Outcome(record, None)
