"""Where one training step's time goes: waiting for data, compute, and exposed gradient sync.

The user's real LightningModule and train dataloader run outside a Trainer, on the ranks of
the topology. Blocks of steps under DDP's no_sync() (forward, backward, optimizer step, no
gradient all-reduce) alternate with ordinary synced blocks, so noise of the machine hits
both; the difference is the communication that overlapping with backward did not hide.

With gradient accumulation (accumulate_grad_batches = k) the steps run as Lightning runs
them: k micro-batches per optimizer step, the first k - 1 under no_sync() and only the last
synchronised, then one optimizer step. Every time is per micro-batch (one per-device batch,
what the training run's throughput measures), so the exposed communication is that of one
synchronisation spread over k batches.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time
import warnings

import torch
from torch import nn

from ddpscale.measurement.commbench import align, slowest
from ddpscale.training import plugins
from ddpscale.training.runargs import build_modules

# Outside a Trainer, self.log() in training_step only warns; it logs nothing either way.
_LOG_WARNING = r"You are trying to `self\.log\(\)` but the `self\.trainer` reference is not registered"


def resolve_device(accelerator: str, local_rank: int) -> torch.device:
    """cuda:LOCAL_RANK for gpu (auto: when CUDA is present), else cpu, as Lightning picks it."""
    if accelerator == "gpu" and not torch.cuda.is_available():
        raise ValueError("--accelerator gpu but CUDA is not available on this machine")
    if accelerator == "gpu" or (accelerator == "auto" and torch.cuda.is_available()):
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def precision_plan(precision: str, device_type: str) -> dict:
    """How to run Lightning's precision setting: autocast dtype, parameter dtype, loss scaling."""
    p = str(precision)
    if p in ("32", "32-true"):
        return {"autocast": None, "params": None, "scaler": False}
    if p in ("64", "64-true"):
        return {"autocast": None, "params": torch.float64, "scaler": False}
    if p in ("bf16", "bf16-mixed"):
        return {"autocast": torch.bfloat16, "params": None, "scaler": False}
    if p == "bf16-true":
        return {"autocast": None, "params": torch.bfloat16, "scaler": False}
    if p in ("16", "16-mixed"):
        if device_type != "cuda":
            raise ValueError(f"precision {p} needs a GPU; on CPU use bf16-mixed or 32-true")
        return {"autocast": torch.float16, "params": None, "scaler": True}
    if p == "16-true":
        return {"autocast": None, "params": torch.float16, "scaler": False}
    raise ValueError(f"the probe does not know precision '{p}'; use 32-true, bf16-mixed, 16-mixed, "
                     "bf16-true, 16-true or 64-true")


def first_optimizer(conf, owner: str) -> torch.optim.Optimizer:
    """The optimizer in whatever configure_optimizers() returned (the first, if several)."""
    if isinstance(conf, torch.optim.Optimizer):
        return conf
    if isinstance(conf, dict) and "optimizer" in conf:
        return first_optimizer(conf["optimizer"], owner)
    if isinstance(conf, (list, tuple)) and conf:
        return first_optimizer(conf[0], owner)
    raise plugins.PluginError(
        f"{owner}.configure_optimizers() returned no optimizer ({type(conf).__name__}); the probe "
        "times a training step and needs one"
    )


def loss_of(output) -> torch.Tensor:
    loss = output["loss"] if isinstance(output, dict) else output
    if not torch.is_tensor(loss):
        raise ValueError(f"training_step returned {type(output).__name__}, not a loss tensor or a dict with 'loss'")
    return loss


class _TrainingStep(nn.Module):
    """What DDP wraps: forward is the module's training_step, returning its loss."""

    def __init__(self, module, autocast_dtype, device_type: str):
        super().__init__()
        self.module = module
        self.autocast_dtype = autocast_dtype
        self.device_type = device_type

    def forward(self, batch, batch_idx: int):
        autocast = (torch.autocast(self.device_type, dtype=self.autocast_dtype) if self.autocast_dtype
                    else contextlib.nullcontext())
        with autocast, warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_LOG_WARNING)
            return loss_of(self.module.training_step(batch, batch_idx))


def to_device(batch, device: torch.device, dtype=None):
    """Move a batch (tensors in lists, tuples, dicts) to the device; floating tensors to dtype."""
    if torch.is_tensor(batch):
        batch = batch.to(device, non_blocking=True)
        return batch.to(dtype) if dtype is not None and batch.is_floating_point() else batch
    if isinstance(batch, dict):
        return {k: to_device(v, device, dtype) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        moved = [to_device(v, device, dtype) for v in batch]
        return type(batch)(*moved) if hasattr(batch, "_fields") else type(batch)(moved)
    return batch


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def prepare(args, device: torch.device):
    """The user's model on the device (in its training dtype) and its train dataloader."""
    model, datamodule = build_modules(args)
    datamodule.setup("fit")
    loader = datamodule.train_dataloader()
    plan = precision_plan(args.precision, device.type)
    model = model.to(device)
    if plan["params"] is not None:
        model = model.to(plan["params"])
    model.train()
    return model, loader, plan


def draw_batches(loader, count: int, device: torch.device, dtype=None) -> tuple[list, list[float]]:
    """count batches from the loader, moved to the device, and the wait for each."""
    batches, waits = [], []
    iterator = iter(loader)
    while len(batches) < count:
        start = time.perf_counter()
        try:
            batch = next(iterator)
        except StopIteration:
            if not batches and not waits:
                raise ValueError("the train dataloader yields no batches") from None
            iterator = iter(loader)  # an epoch is shorter than the probe: start the next one
            batch = next(iterator)
        batch = to_device(batch, device, dtype)
        _sync(device)
        waits.append(time.perf_counter() - start)
        batches.append(batch)
    return batches, waits


class _Calls:
    calls = 0


def counting_allreduce(state: _Calls, bucket) -> torch.futures.Future[torch.Tensor]:
    """DDP's own all-reduce of a gradient bucket (default_hooks.allreduce_hook), counted: the
    record then shows how often a micro-batch really synchronised, not how often it should."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    state.calls += 1
    return default_hooks.allreduce_hook(None, bucket)


# DDP checks the annotation itself; `from __future__ import annotations` left it a string
counting_allreduce.__annotations__["return"] = torch.futures.Future[torch.Tensor]


def measure(model, loader, plan: dict, device: torch.device, world_size: int, local_rank: int,
            steps: int = 20, rounds: int = 5, warmup: int = 3, batch_per_device: int | None = None,
            accumulate: int = 1) -> dict:
    """Per micro-batch data wait, compute (no_sync) and synced time; collective over all ranks.

    A block is ceil(steps / accumulate) optimizer steps of `accumulate` micro-batches each.
    """
    if steps < 1 or rounds < 1 or accumulate < 1:
        raise ValueError("the step probe needs --steps >= 1, --rounds >= 1 and --accumulate-grad-batches >= 1")
    optimizer = first_optimizer(model.configure_optimizers(), type(model).__name__)
    opt_steps = math.ceil(steps / accumulate)
    micro = opt_steps * accumulate  # micro-batches per block
    batches, waits = draw_batches(loader, min(steps, micro), device, plan["params"])
    step_module = _TrainingStep(model, plan["autocast"], device.type)
    counter = _Calls()
    if world_size > 1:
        ddp = nn.parallel.DistributedDataParallel(
            step_module, device_ids=[local_rank] if device.type == "cuda" else None)
        ddp.register_comm_hook(counter, counting_allreduce)
    else:
        ddp = step_module
    scaler = torch.amp.GradScaler(device.type) if plan["scaler"] else None

    def backward(i: int) -> None:
        loss = ddp(batches[i % len(batches)], i)
        (loss if scaler is None else scaler.scale(loss)).backward()

    def one_step(i: int, synced: bool) -> None:
        """One optimizer step as Lightning runs it: only the last micro-batch may synchronise."""
        optimizer.zero_grad(set_to_none=True)
        for j in range(accumulate):
            last = j == accumulate - 1
            quiet = world_size > 1 and not (synced and last)
            with ddp.no_sync() if quiet else contextlib.nullcontext():
                backward(i * accumulate + j)
        if scaler is None:
            optimizer.step()
        else:
            scaler.step(optimizer)
            scaler.update()

    def block(count: int, synced: bool) -> float:
        """Per micro-batch seconds of count optimizer steps, all ranks starting together."""
        align(device)
        start = time.perf_counter()
        for i in range(count):
            one_step(i, synced)
        _sync(device)
        return (time.perf_counter() - start) / (count * accumulate)

    kinds = [False, True] if world_size > 1 else [False]  # False: no_sync (compute only)
    for synced in kinds:  # DDP builds its buckets in the first synced steps; caches fill
        block(max(1, warmup), synced)
    times = {synced: [] for synced in kinds}
    calls = {synced: 0 for synced in kinds}
    for r in range(rounds):
        for synced in (kinds if r % 2 == 0 else kinds[::-1]):  # neither kind always goes first
            before = counter.calls
            times[synced].append(block(opt_steps, synced))
            calls[synced] += counter.calls - before

    data_s = slowest(statistics.median(waits), device)
    compute_s = slowest(statistics.median(times[False]), device)
    sync_s = slowest(statistics.median(times[True]), device) if world_size > 1 else compute_s
    how = ("DDP no_sync() (no gradient all-reduce) vs with gradient all-reduce, alternating"
           if world_size > 1 else "one rank, no DDP")
    accumulation = (f" of {accumulate} micro-batches each, only the last one synchronised"
                    if accumulate > 1 else "")
    timed = rounds * micro  # micro-batches in each kind's timed blocks
    return {
        "method": (f"{opt_steps} training steps (forward, backward, optimizer step){accumulation} per "
                   f"block, {how}, {rounds} rounds; per micro-batch median over rounds, slowest rank; "
                   f"data wait: median over {len(waits)} batches drawn from the train dataloader and "
                   "moved to the device"),
        "steps": opt_steps,
        "rounds": rounds,
        "accumulate_grad_batches": accumulate,
        "micro_batches_per_block": micro,
        # gradient-bucket all-reduces DDP made per micro-batch, counted by a comm hook
        "allreduce_calls_per_batch": calls[True] / timed if world_size > 1 else 0.0,
        "allreduce_calls_per_batch_no_sync": calls[False] / timed if world_size > 1 else 0.0,
        "batch_per_device": batch_per_device,
        "data_s": data_s,
        "compute_s": compute_s,
        "sync_step_s": sync_s,
        "exposed_comm_s": max(0.0, sync_s - compute_s),
        "comm_diff_s": sync_s - compute_s,
    }


def gradient_numel(model) -> tuple[int, int]:
    """(elements, bytes) of the trainable parameters' gradients: what DDP all-reduces per step."""
    params = [p for p in model.parameters() if p.requires_grad]
    return sum(p.numel() for p in params), sum(p.numel() * p.element_size() for p in params)
