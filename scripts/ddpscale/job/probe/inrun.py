"""The probe inside a run, on its own copy of the run's module: every rank, on the group Lightning
formed, before the first epoch.

It hands the step probe and the all-reduce benchmark a copy of the run's module attached to a
view of its trainer (attach, below), with the copy's own optimizers and batches of the run's
train dataloader, and never fails the run. A step that fails (user code the probe cannot run, a batch it cannot
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

The probe's copy of the run's LightningModule, attached to the run's trainer through a view.

The probe times the user's training_step on the module as Lightning hands it to the user's
code: set up (setup, configure_model, on its device, in its dtype) and attached to a trainer
whose estimated_stepping_batches, world_size, global_rank and datamodule are the run's, so a
configure_optimizers or a data module written from `self.trainer` works as it does in
training. It runs on a copy (LightningModule.__getstate__ leaves the trainer out), and the
view forwards every attribute to the run's trainer except the training state, which is the
probe's own:

- optimizers, lr_scheduler_configs and the LightningOptimizer wrappers, from the copy's own
  configure_optimizers(): self.optimizers(), self.lr_schedulers(), toggle_optimizer and
  clip_gradients act on them (never on copied optimizers: torch's LRScheduler wraps
  optimizer.step around a weak reference to the optimizer it was built with, so a copy of
  an optimizer would step the run's);
- strategy.backward and strategy.optimizer_step, where manual_backward and a
  LightningOptimizer's step land: the probe's backward and step (its DDP wrapper, its loss
  scaler; ddpscale.job.probe.step.Runner);
- lightning_module and model are the copy, and batches reach the device through the copy's
  transfer hooks;
- what the copy sets on its trainer stays on the view (self.trainer.should_stop = True in a
  probed step does not stop the run).

The copy's log and log_dict do nothing: a probed step logged into the run's results would
count in its metrics (and LightningModule.log raises outside a hook it knows). Its learning
rate schedules do not advance: the probe runs more steps than a schedule may be sized for
(OneCycleLR raises past total_steps), and a schedule's step costs nothing measurable.
"""

from __future__ import annotations

import copy
import gc
import socket
import time
import warnings
from dataclasses import dataclass

import pytorch_lightning as pl
import torch
import torch.distributed as dist
from lightning_utilities.core.apply_func import apply_to_collection
from pytorch_lightning.core.optimizer import LightningOptimizer, _init_optimizers_and_lr_schedulers, _MockOptimizer
from pytorch_lightning.utilities import CombinedLoader
from torch.utils.data import DataLoader

from ddpscale.job.device import compiling
from ddpscale.job.launch import ranks
from ddpscale.job.probe import allreduce, step as step_probe
from ddpscale.job.probe import record as probe_record
from ddpscale.run import ddpsettings
from ddpscale.run.usermodule import PluginError
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
        copied, self.view = attach(self.trainer, self.module, self.spec.compile)
        self.doing = "building the optimizers"
        optimizers = build_optimizers(self.view)
        plugin = self.trainer.precision_plugin
        self.runner = step_probe.Runner(copied, optimizers, self.device, context=plugin.train_step_context,
                                       scaler=scales_loss(plugin),
                                       ddp_kwargs=getattr(self.trainer.strategy, "_ddp_kwargs", None),
                                       comm_hook=getattr(self.trainer.strategy, "_ddp_comm_hook", None))
        self.view.strategy.runner = self.runner
        self.doing = "drawing batches from the train dataloader"
        self.batches, self.waits = step_probe.draw_batches(batch_source(self.view),
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
            self.step["compute_by_batch"] = step_probe.compute_by_batch(
                self.runner, self.batches, sizes, self.spec.batch_per_device, self.step["compute_s"],
                steps=self.sizes["steps"], rounds=self.sizes["rounds"], warmup=self.sizes["warmup"],
                accumulate=self.accumulate)

    def measure_steps(self) -> dict:
        return step_probe.measure(
            self.runner, self.batches, self.waits, self.trainer.world_size, steps=self.sizes["steps"],
            rounds=self.sizes["rounds"], warmup=self.sizes["warmup"], batch_per_device=self.spec.batch_per_device,
            accumulate=self.accumulate)

    def benchmark(self) -> None:
        self.doing = "benchmarking all-reduce"
        self.gradient = step_probe.gradient_numel(self.runner.module)
        self.allreduce = allreduce.allreduce_benchmark(allreduce.message_sizes(self.gradient[1]), self.device,
                                                       warmup=self.sizes["warmup"], iters=self.sizes["iters"])
        # the comm term: the gradient in the buckets the run's DDP sends (bucket_cap_mb if set),
        # at the width its comm hook sends them (half with fp16_compress or bf16_compress)
        width = comm_bytes_per_element(self.spec)
        buckets = allreduce.ddp_buckets(self.gradient[1], bucket_cap_mb(self.trainer.strategy))
        sent, dtype = allreduce.on_the_wire(buckets, width)
        self.allreduce_ddp = allreduce.allreduce_as_ddp(sent, self.device, dtype=dtype,
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
    counters.clear()  # compile_graphs and graph breaks (ddpscale.job.device.compiling.stats)
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
        topology=spec.topology, num_nodes=spec.num_nodes, devices_per_node=spec.devices_per_node, places=places,
        backend=backend, device=run.device, precision=spec.precision, gradient=run.gradient,
        allreduce=run.allreduce, step=run.step, started=started)
    record["allreduce_ddp"] = run.allreduce_ddp  # report.figures.breakdown.allreduce_s reads it
    record["sized"] = run.sized  # how big the probe was, and why: its cost is bounded by the run's
    record["size"] = probe_record.size_record(run.requested, run.sizes, run.step, run.bound)
    return Outcome(record, None)


# What pytorch_lightning.utilities.compile.from_compiled sets on the module it compiles:
# compiled methods as instance attributes bound to that module, and the original ones.
COMPILED_METHODS = ("forward", "training_step", "validation_step", "test_step", "predict_step")


def _ignore(*args, **kwargs) -> None:
    return None


class _Forwarding:
    """Every attribute not set on this object is the wrapped object's; what is set stays here."""

    def __init__(self, wrapped):
        self._wrapped = wrapped

    def __getattr__(self, name):
        return getattr(self.__dict__["_wrapped"], name)


class StrategyView(_Forwarding):
    """The run's strategy as the copy sees it (see the module's docstring)."""

    def __init__(self, strategy, module):
        super().__init__(strategy)
        self.lightning_module = self.model = module
        self.optimizers, self.lr_scheduler_configs, self._lightning_optimizers = [], [], []
        self.runner = None  # the probe's steps (ddpscale.job.probe.step.Runner), set once built

    def backward(self, closure_loss, optimizer, *args, **kwargs):
        return self.runner.backward(closure_loss, *args, **kwargs)

    def optimizer_step(self, optimizer, closure, model=None, **kwargs):
        return self.runner.optimizer_step(optimizer, closure, **kwargs)

    def batch_to_device(self, batch, device=None, dataloader_idx: int = 0):
        # the strategy's own code, run with this view as self: its lightning_module is the copy
        return type(self._wrapped).batch_to_device(self, batch, device, dataloader_idx)


class TrainerView(_Forwarding):
    """The run's trainer as the copy sees it (see the module's docstring)."""

    def __init__(self, trainer, module):
        super().__init__(trainer)
        self.strategy = StrategyView(trainer.strategy, module)
        self.lightning_module = self.model = module

    @property
    def optimizers(self) -> list:
        return self.strategy.optimizers

    @property
    def lr_scheduler_configs(self) -> list:
        return self.strategy.lr_scheduler_configs


def eager_copy(module: pl.LightningModule) -> pl.LightningModule:
    """A deep copy of the module running its own methods. A module compiled with from_compiled
    holds compiled methods bound to itself as instance attributes, which a copy would keep
    calling; the copy drops them (and their compile context) and gets the class's methods."""
    context = getattr(module, "_compiler_ctx", None)
    copied = copy.deepcopy(module, {} if context is None else {id(context): None})
    if context is not None:
        for name in COMPILED_METHODS:
            copied.__dict__.pop(name, None)
        copied._compiler_ctx = None
    return copied


def attach(trainer, module: pl.LightningModule, compile_mode: str = "none"):
    """(copy, view): a training copy of the run's module, compiled again if the run's is,
    attached to a view of the run's trainer, its logging silenced."""
    copied = eager_copy(module)
    if getattr(module, "_compiler_ctx", None) is not None:
        copied = compiling.wrap(copied, compile_mode)
    for part in copied.modules():
        if isinstance(part, pl.LightningModule):
            part.log = part.log_dict = _ignore
    view = TrainerView(trainer, copied)
    copied.trainer = view
    # each submodule keeps its train or eval mode: Lightning 2.6 trains modules in the modes
    # the user left them in (it only warns about eval ones), so the probe does too
    return copied, view


def build_optimizers(view: TrainerView) -> list:
    """The copy's optimizers from its own configure_optimizers(), parsed as Lightning parses
    them for training, set on the view; its schedules held still."""
    module = view.lightning_module
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's "this fit will run with no optimizer": said below
        optimizers, configs = _init_optimizers_and_lr_schedulers(module)
    if all(isinstance(o, _MockOptimizer) for o in optimizers):
        raise PluginError(f"{type(module).__name__}.configure_optimizers() returned no optimizer: Lightning "
                          "trains without one, but the probe times an optimizer step")
    for config in configs:
        config.scheduler.step = _ignore
    strategy = view.strategy
    strategy.optimizers, strategy.lr_scheduler_configs = optimizers, configs
    strategy._lightning_optimizers = [LightningOptimizer._to_lightning_optimizer(o, strategy) for o in optimizers]
    return optimizers


def _own_iterator(loader: DataLoader) -> DataLoader:
    """The loader itself, or, with persistent workers, a shallow copy: such a loader keeps one
    iterator, the one training's first epoch will read, which the probe must not advance."""
    if loader.persistent_workers and loader.num_workers > 0:
        loader = copy.copy(loader)
        loader._iterator = None
    return loader


def batch_source(view: TrainerView):
    """next_batch(): a batch of the run's own train dataloader, as the training loop draws and
    moves it (Lightning's sampler in place, precision conversion, the copy's transfer hooks,
    the strategy's device); several loaders are combined as training combines them. The
    dataloader must be built already (trainer.fit_loop.setup_data())."""
    loaders = view.train_dataloader
    if loaders is None:
        raise ValueError("the run has no train dataloader (no training_step, or limit_train_batches 0)")
    combined = CombinedLoader(apply_to_collection(loaders, DataLoader, _own_iterator), "max_size_cycle")
    state = {"iterator": iter(combined), "fresh": True}
    module = view.lightning_module

    def next_batch():
        try:
            batch, _, _ = next(state["iterator"])
        except StopIteration:
            if state["fresh"]:
                raise ValueError("the train dataloader yields no batches") from None
            state["iterator"] = iter(combined)  # an epoch is shorter than the probe: start the next one
            batch, _, _ = next(state["iterator"])
        state["fresh"] = False
        batch = view.precision_plugin.convert_input(batch)
        batch = module._on_before_batch_transfer(batch, dataloader_idx=0)
        return view.strategy.batch_to_device(batch, dataloader_idx=0)

    return next_batch


def scales_loss(precision_plugin) -> bool:
    """Whether the run's precision scales the loss (16-mixed): the probe then needs a scaler of
    its own (stepping the run's would move its scale)."""
    return getattr(precision_plugin, "scaler", None) is not None
