"""Where one training step's time goes (waiting for data, compute, exposed gradient sync), and the
baseline's compute at the other per-device batches.

The user's training_step runs on a copy of the run's module, with optimizers of its own and
batches drawn from the run's train dataloader (its caller, ddpscale.job.probe.inrun,
hands them over), on the ranks of the topology. Blocks of steps under DDP's no_sync() (forward,
backward, optimizer step, no gradient all-reduce) alternate with ordinary synced blocks, so
noise of the machine hits both; the difference is the communication that overlapping with
backward did not hide.

With gradient accumulation (accumulate_grad_batches = k) the steps run as Lightning runs
them: k micro-batches per optimizer step, the first k - 1 under no_sync() and only the last
synchronised, then one optimizer step. Every time is per micro-batch (one per-device batch,
what the training run's throughput measures), so the exposed communication is that of one
synchronisation spread over k batches.

With manual optimisation (automatic_optimization = False) training_step runs its own
backward (manual_backward) and optimizer step; under the probe's DDP wrapper they run as
Lightning runs them (strategies/ddp.py): the gradient sync is prepared in backward, and DDP's
post-forward does not prepare it again. A no_sync() block is again compute without the
all-reduce. Lightning refuses gradient accumulation with manual optimisation.

Gradients are cleared as Lightning clears them: the module's optimizer_zero_grad hook (by
default optimizer.zero_grad(), which sets them to None in torch 2), after training_step and
before backward, on the first micro-batch of an optimizer step. With parameters a step may
leave unused (ddp.find_unused_parameters), DDP notes under no_sync() which parameters got a
gradient and reduces them at the next synchronised backward, as gradients accumulated for it.
A compute block's steps cleared those gradients since, which training never does (its no_sync()
micro-batches accumulate into the synchronised one), so before a synchronised block the probe
ends the no_sync() stretch as DDP's contract asks (Runner.settle, untimed): one synchronised
backward in which the cleared gradients stand as zeros, then cleared again. The timed steps
keep the module's own gradients: unused parameters get none, as in training.

The baseline's compute at every per-device batch the configured topologies train with.

The prediction of a topology needs the baseline's compute at that topology's per-device
batch. Scaling it linearly with the batch is wrong where per-operation overhead sets the
step (a GPU at a small batch; a 16-core CPU run stayed at ~1.5 ms from 64 down to 16
samples), so the baseline's probe times it: blocks of steps on one rank, no DDP, as its own
compute is timed (time_block), on batches of each size built from the batches it
drew from the run's train dataloader.

A batch of another size is made of the drawn samples in order: the drawn batches joined
along their first dimension and cut into windows of the new size, wrapping around when a
window needs more samples than were drawn. That works for a tensor and for tuples, lists and
dicts of tensors with one first dimension; any other batch, or a size whose step fails (out
of memory, a model built for one shape), is recorded n/a with the reason.
"""

from __future__ import annotations

import contextlib
import functools
import math
import statistics
import time
from collections.abc import Mapping

import torch
import torch.distributed as dist
from pytorch_lightning.overrides.distributed import prepare_for_backward
from torch import nn

from ddpscale.job.device.flops import loss_of, training_step
from ddpscale.job.device.gpu import sync_device
from ddpscale.job.probe.allreduce import align, slowest


class _TrainingStep(nn.Module):
    """What DDP wraps: forward is the module's training_step, in the precision's context."""

    def __init__(self, module, context=contextlib.nullcontext, after_inner_forward=None):
        super().__init__()
        self.module = module
        self.context = context  # the run's precision_plugin.train_step_context: autocast, dtype
        self.after_inner_forward = after_inner_forward

    def forward(self, batch, batch_idx: int):
        with self.context():
            out = training_step(self.module, batch, batch_idx)
        if self.after_inner_forward is not None:
            self.after_inner_forward()
        return out


def blocks(steps: int, accumulate: int) -> tuple[int, int]:
    """(optimizer steps, micro-batches) per block: whole optimizer steps of `accumulate` batches."""
    if steps < 1 or accumulate < 1:
        raise ValueError("the step probe needs --steps >= 1 and --accumulate-grad-batches >= 1")
    opt_steps = math.ceil(steps / accumulate)
    return opt_steps, opt_steps * accumulate


def draw_batches(next_batch, count: int, device: torch.device) -> tuple[list, list[float]]:
    """count batches from next_batch() (drawn and moved to the device), and the wait for each."""
    batches, waits = [], []
    for _ in range(count):
        start = time.perf_counter()
        batch = next_batch()
        sync_device(device)
        waits.append(time.perf_counter() - start)
        batches.append(batch)
    return batches, waits


class _Calls:
    calls = 0
    hook = None  # the run's own comm hook (config ddp.comm_hook), else DDP's plain all-reduce


def counting_allreduce(state: _Calls, bucket) -> torch.futures.Future[torch.Tensor]:
    """The run's all-reduce of a gradient bucket (its comm hook's, else DDP's own
    default_hooks.allreduce_hook), counted: the record then shows how often a micro-batch
    really synchronised, not how often it should. DDP takes one hook only, so the count wraps
    the run's: the probe's steps compress their gradients as training's do."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    state.calls += 1
    return (state.hook or default_hooks.allreduce_hook)(None, bucket)


# DDP checks the annotation itself; `from __future__ import annotations` left it a string
counting_allreduce.__annotations__["return"] = torch.futures.Future[torch.Tensor]


class Runner:
    """The probe's training steps of a module copy: its optimizers, its loss scaler (16-mixed)
    and, on several ranks, its own DDP wrapper. The copy's manual_backward and optimizer
    steps reach backward() and optimizer_step() through its caller's view of the trainer."""

    def __init__(self, module, optimizers: list, device: torch.device, *, context=contextlib.nullcontext,
                 scaler: bool = False, ddp_kwargs: dict | None = None, comm_hook=None):
        self.module, self.optimizers, self.device = module, list(optimizers), device
        self.manual = not module.automatic_optimization
        self.scaler = torch.amp.GradScaler(device.type) if scaler else None
        self.step_module = _TrainingStep(module, context, self._after_inner_forward)
        self.ddp_kwargs = dict(ddp_kwargs or {})
        self.ddp = None
        self.unsettled = False  # a no_sync() backward ran since the last synchronised one
        self.counter = _Calls()
        self.counter.hook = comm_hook  # the run's DDPStrategy(ddp_comm_hook=...), the same in the probe

    def wrap(self) -> None:
        """The DDP wrapper (collective: every rank, once)."""
        self.ddp = nn.parallel.DistributedDataParallel(
            self.step_module, device_ids=[self.device.index] if self.device.type == "cuda" else None,
            **self.ddp_kwargs)
        self.ddp.register_comm_hook(self.counter, counting_allreduce)

    def _after_inner_forward(self) -> None:
        # manual optimisation: training_step prepared the sync in its backward already; DDP's
        # post-forward must not prepare it again (Lightning's _DDPForwardRedirection)
        if self.manual and self.ddp is not None:
            self.ddp.require_backward_grad_sync = False

    def forward(self, batch, batch_idx: int):
        if self.ddp is None:
            return self.step_module(batch, batch_idx)
        sync = self.ddp.require_backward_grad_sync
        try:
            return self.ddp(batch, batch_idx)
        finally:
            self.ddp.require_backward_grad_sync = sync

    def backward(self, loss: torch.Tensor, *args, **kwargs) -> None:
        """As Lightning's strategy runs it: DDP's sync prepared for a manual backward, the loss
        scaled (16-mixed), then the module's own backward hook."""
        if self.manual and self.ddp is not None:
            prepare_for_backward(self.ddp, loss)
        self.module.backward(loss if self.scaler is None else self.scaler.scale(loss), *args, **kwargs)

    def zero_grad(self, optimizer, batch_idx: int) -> None:
        """As Lightning's automatic optimisation clears gradients: the module's
        optimizer_zero_grad hook (a module may override it, say with set_to_none=False). Its
        epoch is 0: the probe runs before the first epoch."""
        if hasattr(self.module, "optimizer_zero_grad"):
            self.module.optimizer_zero_grad(0, batch_idx, optimizer)
        else:
            optimizer.zero_grad()

    def finds_unused(self) -> bool:
        """Whether the probe's DDP finds unused parameters in every step (the run's
        ddp.find_unused_parameters without ddp.static_graph): then it notes under no_sync() which
        parameters got a gradient."""
        return self.ddp is not None and self.ddp.find_unused_parameters and not self.ddp.static_graph

    def settle(self) -> None:
        """End a stretch of no_sync() steps as DDP expects it to end, before a synchronised block
        (see the module's docstring): one synchronised backward of a zero loss, every gradient the
        probe cleared standing as zeros, then cleared again. Untimed; it changes no parameter."""
        if not (self.unsettled and self.finds_unused()):
            self.unsettled = False
            return
        ignored = self.ddp.parameters_to_ignore
        params = [p for name, p in self.ddp.module.named_parameters()
                  if p.requires_grad and name.removeprefix("module.") not in ignored]
        cleared = [p for p in params if p.grad is None]
        for p in cleared:
            p.grad = torch.zeros_like(p)
        loss = params[0].reshape(-1)[:1].sum() * 0.0
        prepare_for_backward(self.ddp, loss)
        loss.backward()
        for p in cleared:
            p.grad = None
        self.unsettled = False

    def optimizer_step(self, optimizer, closure=None, **kwargs):
        if self.scaler is None:
            return optimizer.step(closure=closure, **kwargs)
        out = closure() if closure is not None else None
        self.scaler.step(optimizer, **kwargs)
        self.scaler.update()
        return out

    def step(self, batches: list, i: int, synced: bool, accumulate: int = 1, before_batch=None) -> None:
        """Optimizer step i as Lightning runs it: only the last micro-batch may synchronise.
        before_batch: called before each batch, as Lightning's loop does its own per-batch work."""
        if self.ddp is not None and not synced:
            self.unsettled = True
        if self.manual:  # training_step zeroes, backpropagates and steps itself
            if before_batch is not None:
                before_batch()
            with self.ddp.no_sync() if self.ddp is not None and not synced else contextlib.nullcontext():
                self.forward(batches[i % len(batches)], i)
            return
        optimizer = self.optimizers[0]  # Lightning allows one with automatic optimisation
        for j in range(accumulate):
            quiet = self.ddp is not None and not (synced and j == accumulate - 1)
            k = i * accumulate + j
            if before_batch is not None:
                before_batch()
            with self.ddp.no_sync() if quiet else contextlib.nullcontext():
                loss = loss_of(self.forward(batches[k % len(batches)], k), k)
                if j == 0:  # Lightning's closure: training_step, zero_grad, backward
                    self.zero_grad(optimizer, k)
                self.backward(loss)
        self.optimizer_step(optimizer)

    def time_alone(self, batches: list, accumulate: int = 1) -> float:
        """Seconds per micro-batch of one optimizer step on this rank alone, the second of two
        (the first is cold): what the probe's size is chosen by, before it times anything."""
        seconds = 0.0
        for i in range(2):
            sync_device(self.device)
            start = time.perf_counter()
            self.step(batches, i, synced=False, accumulate=accumulate)
            sync_device(self.device)
            seconds = (time.perf_counter() - start) / accumulate
        return seconds

    def try_alone(self, batches: list, steps: int, accumulate: int = 1) -> None:
        """One block on this rank alone, before any DDP: every batch index the timed blocks
        use, so a step that fails does so here, where no other rank waits for this one."""
        opt_steps, _ = blocks(steps, accumulate)
        for i in range(opt_steps):
            self.step(batches, i, synced=False, accumulate=accumulate)
        sync_device(self.device)


def time_block(runner: Runner, batches: list, count: int, synced: bool, accumulate: int = 1,
               before_batch=None) -> float:
    """Per micro-batch seconds of count optimizer steps, all ranks starting together."""
    if synced:
        runner.settle()  # untimed, before the ranks align
    align(runner.device)
    start = time.perf_counter()
    for i in range(count):
        runner.step(batches, i, synced, accumulate, before_batch)
    sync_device(runner.device)
    return (time.perf_counter() - start) / (count * accumulate)


# The kinds of timed block: compute alone (DDP's no_sync), a synchronised step, and a
# synchronised step with Lightning's per-batch SIGTERM broadcast (sigterm_broadcast) before each batch.
COMPUTE, SYNCED, LOOP_SYNC = "compute", "synced", "loop_sync"


def sigterm_broadcast(device: torch.device) -> None:
    """One batch's SIGTERM broadcast, done as Lightning does it: the flag is 0 here (no rank
    received SIGTERM).

    Lightning 2.6 (pytorch_lightning/loops/training_epoch_loop.py, advance ->
    _broadcast_sigterm_tensor) broadcasts a one-element SIGTERM flag from rank 0 and reads it
    back with .item() before every training batch when the world size is above one: a
    collective and a host sync per batch that a one-device run does not pay (upstream issue
    #21487; pull request #21640 proposes doing it every n steps). The probe times synchronised
    blocks with and without this call, so the breakdown names its cost instead of hiding it in
    framework overhead."""
    flag = torch.tensor([0], device=device)
    dist.broadcast(flag, src=0)
    flag.item()


def measure(runner: Runner, batches: list, waits: list[float], world_size: int, *,
            steps: int = 20, rounds: int = 5, warmup: int = 3, batch_per_device: int | None = None,
            accumulate: int = 1) -> dict:
    """Per micro-batch data wait, compute (no_sync), synced time, and on several ranks the
    cost of Lightning's own per-batch sync; collective over all ranks.

    A block is ceil(steps / accumulate) optimizer steps of `accumulate` micro-batches each.
    """
    if rounds < 1:
        raise ValueError("the step probe needs --rounds >= 1")
    opt_steps, micro = blocks(steps, accumulate)
    if world_size > 1 and runner.ddp is None:
        runner.wrap()
    device = runner.device
    broadcast = functools.partial(sigterm_broadcast, device)
    spec = {COMPUTE: (False, None), SYNCED: (True, None), LOOP_SYNC: (True, broadcast)}
    kinds = [COMPUTE, SYNCED, LOOP_SYNC] if world_size > 1 else [COMPUTE]
    def run(kind: str, count: int) -> float:
        synced, before_batch = spec[kind]
        return time_block(runner, batches, count, synced, accumulate, before_batch)

    # DDP builds its buckets in the first synced steps, and its static graph (ddp.static_graph)
    # records the graph in its first iteration, which must synchronise: torch cannot start one
    # under no_sync(), so a synced block warms up first; caches fill
    for kind in kinds[1:] + kinds[:1]:
        run(kind, max(1, warmup))
    times = {kind: [] for kind in kinds}
    calls = {kind: 0 for kind in kinds}
    for r in range(rounds):
        for kind in kinds[r % len(kinds):] + kinds[:r % len(kinds)]:  # no kind always goes first
            if spec[kind][0]:
                runner.settle()  # its all-reduce is not the block's
            before = runner.counter.calls
            times[kind].append(run(kind, opt_steps))
            calls[kind] += runner.counter.calls - before

    def median(kind: str) -> float:
        return slowest(statistics.median(times[kind]), device)

    data_s = slowest(statistics.median(waits), device)
    compute_s = median(COMPUTE)
    sync_s = median(SYNCED) if world_size > 1 else compute_s
    # the broadcast's cost: the median of each round's difference, not a difference of medians,
    # so a round slowed for both kinds alike (a busy host) cancels out
    loop_diff = (slowest(statistics.median(a - b for a, b in zip(times[LOOP_SYNC], times[SYNCED])), device)
                 if world_size > 1 else 0.0)
    how = ("DDP no_sync() (no gradient all-reduce) vs with gradient all-reduce vs with all-reduce and "
           "Lightning's per-batch SIGTERM broadcast + .item(), rotating"
           if world_size > 1 else "one rank, no DDP")
    accumulation = (f" of {accumulate} micro-batches each, only the last one synchronised"
                    if accumulate > 1 else "")
    manual = ", manual optimisation (the module's own backward and step)" if runner.manual else ""
    timed = rounds * micro  # micro-batches in each kind's timed blocks
    return {
        "method": (f"{opt_steps} training steps (forward, backward, optimizer step){accumulation} per "
                   f"block{manual}, {how}, {rounds} rounds; per micro-batch median over rounds, slowest "
                   f"rank; data wait: median over {len(waits)} batches drawn from the run's train "
                   "dataloader and moved to the device"),
        "optimization": "manual" if runner.manual else "automatic",
        "steps": opt_steps,
        "rounds": rounds,
        "accumulate_grad_batches": accumulate,
        "micro_batches_per_block": micro,
        # gradient-bucket all-reduces DDP made per micro-batch, counted by a comm hook
        "allreduce_calls_per_batch": calls[SYNCED] / timed if world_size > 1 else 0.0,
        "allreduce_calls_per_batch_no_sync": calls[COMPUTE] / timed if world_size > 1 else 0.0,
        "batch_per_device": batch_per_device,
        "data_s": data_s,
        "compute_s": compute_s,
        "sync_step_s": sync_s,
        "exposed_comm_s": max(0.0, sync_s - compute_s),
        "comm_diff_s": sync_s - compute_s,
        # Lightning 2.6 broadcasts a SIGTERM flag and calls .item() before every batch in DDP
        # (training_epoch_loop._broadcast_sigterm_tensor); one rank does not
        "sync_step_with_loop_sync_s": median(LOOP_SYNC) if world_size > 1 else sync_s,
        "loop_sync_s": max(0.0, loop_diff),
        "loop_sync_diff_s": loop_diff,
    }


def gradient_numel(model) -> tuple[int, int]:
    """(elements, bytes) of the trainable parameters' gradients: what DDP all-reduces per step."""
    params = [p for p in model.parameters() if p.requires_grad]
    return sum(p.numel() for p in params), sum(p.numel() * p.element_size() for p in params)


def _tensors(batch) -> list[torch.Tensor]:
    if torch.is_tensor(batch):
        return [batch]
    if isinstance(batch, Mapping):
        return [t for v in batch.values() for t in _tensors(v)]
    if isinstance(batch, (tuple, list)):
        return [t for v in batch for t in _tensors(v)]
    raise ValueError(f"a batch holding {type(batch).__name__} cannot be resized (only tensors, and tuples, "
                     "lists or dicts of tensors)")


def samples(batch) -> int:
    """The batch's first dimension, the same on every tensor it holds."""
    sizes = {t.shape[0] if t.dim() else None for t in _tensors(batch)}
    if len(sizes) != 1 or None in sizes:
        raise ValueError(f"a batch whose tensors have first dimensions {sorted(map(str, sizes))} cannot be resized "
                         "(they must share one)")
    return sizes.pop()


def _apply(fn, parts: list):
    """fn over the tensors at the same place in each of parts (batches of one structure)."""
    first = parts[0]
    if torch.is_tensor(first):
        return fn(parts)
    if isinstance(first, Mapping):
        return type(first)({k: _apply(fn, [p[k] for p in parts]) for k in first})
    items = [_apply(fn, [p[i] for p in parts]) for i in range(len(first))]
    return type(first)(*items) if hasattr(first, "_fields") else type(first)(items)


def resize(batches: list, size: int, count: int) -> list:
    """count batches of `size` samples: the drawn batches' samples in order, wrapping around."""
    if size < 1:
        raise ValueError(f"a batch needs at least one sample (got {size})")
    for b in batches:
        samples(b)  # each resizable, with one first dimension
    pool = _apply(lambda ts: torch.cat(ts, dim=0), batches)
    total = samples(pool)
    out = []
    for j in range(count):
        index = torch.arange(j * size, (j + 1) * size) % total
        out.append(_apply(lambda ts: ts[0].index_select(0, index.to(ts[0].device)), [pool]))
    return out


def compute_at(runner, batches: list, size: int, *, steps: int, rounds: int, warmup: int,
               accumulate: int = 1) -> dict:
    """Median per micro-batch compute at `size` samples per batch (one rank, no DDP); n/a with
    the reason when such batches cannot be built or their step fails."""
    opt_steps, micro = blocks(steps, accumulate)
    try:
        sized = resize(batches, size, micro)
        time_block(runner, sized, max(1, warmup), False, accumulate)
        times = [time_block(runner, sized, opt_steps, False, accumulate) for _ in range(rounds)]
    except Exception as err:  # noqa: BLE001 - one size the probe cannot time is n/a, the rest stand
        lines = str(err).strip().splitlines()
        if runner.device.type == "cuda":
            torch.cuda.empty_cache()
        return {"batch_per_device": size, "compute_s": None,
                "reason": f"{type(err).__name__}: {lines[0] if lines else ''}"}
    return {"batch_per_device": size, "compute_s": statistics.median(times)}


def compute_by_batch(runner, batches: list, sizes, own: int | None, own_compute_s: float, **timing) -> list[dict]:
    """The compute at each size, the run's own batch taken from its own timing."""
    return [{"batch_per_device": size, "compute_s": own_compute_s} if size == own
            else compute_at(runner, batches, size, **timing) for size in sorted(set(sizes))]
