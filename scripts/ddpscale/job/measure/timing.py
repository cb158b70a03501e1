"""The run's clock: its epochs' times, and how long the run held its devices.

EpochTiming measures what the report needs, cheaply enough not to be the bottleneck. Its state
(epoch times, sample counts, attempts) is saved in every checkpoint, so a run resumed after a
kill keeps the time of the epochs it already finished and counts each epoch once.
Every process a run trained in has its own cold start (CUDA context, caches, compilation), so
the warm-up epochs are left out of steady state in each attempt, not only in the first.

How long a run held its devices (started, held_s): the cost a scheduler bills, not only the epochs.
From as early as the training process can know to the moment rank 0 writes the record:
- start: under SLURM, the job's start (SLURM_JOB_START_TIME, set by Slurm 23.02 and later; an
  older Slurm, such as Debian 12's 22.05, sets none, and `scontrol show job` gives its StartTime),
  so what ran in the job before train.py (the environment's set-up, Snakemake's own start,
  torch's import) counts; else the process's start as the kernel recorded it (psutil), which
  already includes the interpreter's start and every import.
- end: after the test pass and the transport gather, just before metrics.json is written.
In between: process-group set-up, the probe, data set-up, every epoch, checkpoint writes, the
test pass. Queue time is not held and is not counted.

A resumed run adds what its earlier attempts held up to their last checkpoint (kept in the
checkpoint with the epoch times): an attempt killed without a checkpoint loses the time since
its last one, so over attempts this is a lower bound.
"""

from __future__ import annotations

import socket
import subprocess
import time
from datetime import datetime

import pytorch_lightning as pl
import torch
import torch.distributed as dist

from ddpscale.core.record import Progress, progress_line
from ddpscale.job.device.gpu import sync_device
from ddpscale.job.launch import ranks
from ddpscale.job.measure import samplecount


class NonFiniteLossError(RuntimeError):
    pass


class WorldSizeError(RuntimeError):
    pass


def check_world_size(formed: int, expected: int) -> None:
    """The process group that formed must hold every rank the topology asks for: a multi-node
    job wrapped in `srun -n1`, say, would train on one rank and "succeed"."""
    if formed != expected:
        raise WorldSizeError(f"the process group has {formed} rank(s) but the topology asks for "
                             f"{expected}: the launcher did not start every rank")


class EpochTiming(pl.Callback):
    def __init__(self, warmup_epochs: int = 1, expected_world_size: int | None = None, batch_dim: int = 0,
                 batch_per_device: int | None = None):
        self.warmup_epochs = warmup_epochs
        self.batch_per_device = batch_per_device  # what the loader's batch must be, checked at fit start
        # every batch's samples, the one count all figures per sample use (ddpscale.job.measure.samplecount)
        self.counter = samplecount.BatchCounter(batch_dim)
        # why the samples could not be counted on some rank (the figures per sample are then n/a)
        self.uncounted: str | None = None
        self.expected_world_size = expected_world_size
        self.epoch_times: list[float] = []  # train + validation of each finished epoch
        self.train_times: list[float] = []  # training batches only
        self.samples: list[int] = []  # training samples over all ranks
        self.epoch_attempts: list[int] = []  # the attempt (process) each epoch ran in, from 1
        self.attempts = 0
        self.resumed_from_epoch: int | None = None
        self.ranks: list[dict] = []
        # the part of an unfinished epoch that an earlier attempt trained before it stopped on
        # a signal (pause, ddpscale.job.resume.signals): the resumed attempt adds it to the rest of that
        # epoch, so the epoch counts once, whole, with the time it really took
        self._partial: dict | None = None
        self.resumed_mid_epoch = False
        self._fit_t0 = time.perf_counter()  # reset when training starts
        # the devices held (ddpscale.job.measure.timing): since this process's start unless the
        # script names an earlier one (a SLURM job's), plus what earlier attempts held
        self.held_since, self.held_from = process_start(), FROM_PROCESS
        self.held_before_s = 0.0
        self._reset_epoch()

    def _reset_epoch(self) -> None:
        self._t0 = self._t_train = None
        self._count = 0
        self._loss_sum = None
        self._epoch_open = False
        self._carry = None

    # -- checkpointed state -------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"epoch_times": self.epoch_times, "train_times": self.train_times,
                "samples": self.samples, "attempts": self.attempts, "epoch_attempts": self.epoch_attempts,
                "partial": self._partial, "held_s": self.held_s(), "uncounted": self.uncounted}

    def load_state_dict(self, state: dict) -> None:
        self.epoch_times = list(state["epoch_times"])
        self.train_times = list(state["train_times"])
        self.samples = list(state["samples"])
        self.attempts = int(state["attempts"])
        # a checkpoint from before attempts were recorded per epoch: assume all in attempt 1
        self.epoch_attempts = list(state.get("epoch_attempts", [1] * len(self.epoch_times)))
        self._partial = state.get("partial")
        self.held_before_s = float(state.get("held_s", 0.0))  # 0 from a checkpoint that predates it
        self.uncounted = state.get("uncounted")

    # -- hooks ------------------------------------------------------------------------
    def on_fit_start(self, trainer, pl_module) -> None:
        me = {"global_rank": trainer.global_rank, "node_rank": trainer.node_rank,
              "local_rank": trainer.local_rank, "host": socket.gethostname()}
        self.ranks = sorted(ranks.gather(me), key=lambda r: r["global_rank"])
        if self.expected_world_size is not None:
            check_world_size(len(self.ranks), self.expected_world_size)
        if self.batch_per_device is not None:
            # before the probe and the first step: the loader, built as fit builds it (fit then
            # uses it), must batch as ddpscale set it up, or nothing said of the batch holds
            trainer.fit_loop.setup_data()
            problem = samplecount.batch_size_problem(trainer.train_dataloader, self.batch_per_device)
            if problem:
                raise samplecount.BatchSizeError(problem)
        if trainer.global_rank == 0:
            # the banner the multi-GPU guides print: what formed, as read from the process group
            nodes = sorted({r["node_rank"] for r in self.ranks})
            backend = dist.get_backend() if dist.is_available() and dist.is_initialized() else "none"
            print(f"ddpscale: world size {len(self.ranks)} on node ranks {nodes}, hosts "
                  f"{sorted({r['host'] for r in self.ranks})}, backend {backend}, device "
                  f"{pl_module.device}", flush=True)

    def on_train_start(self, trainer, pl_module) -> None:
        self._fit_t0 = time.perf_counter()
        self.attempts += 1
        twice = samplecount.sharded_twice(trainer.train_dataloader, trainer.world_size)
        if twice and trainer.global_rank == 0:
            print(twice, flush=True)
        if trainer.current_epoch > 0:
            self.resumed_from_epoch = trainer.current_epoch
        if self._partial is not None and self._partial["epoch"] == trainer.current_epoch:
            # resumed mid-epoch: Lightning calls no on_train_epoch_start for this epoch
            self.resumed_from_epoch = trainer.current_epoch
            self.resumed_mid_epoch = True
            self.on_train_epoch_start(trainer, pl_module)
            self._carry = self._partial
        self._partial = None

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self._reset_epoch()
        # every training loader's batches; a padded shard's repeats not counted (ddpscale.job.measure.samplecount)
        self.counter.start_epoch(trainer)
        sync_device(pl_module.device)
        self._t0 = time.perf_counter()
        self._epoch_open = True

    def pause(self, trainer, pl_module) -> None:
        """Keep the open epoch's part so far for the checkpoint about to be written (a stop
        on a signal, on every rank at the same training step, so the all-reduce matches)."""
        sync_device(pl_module.device)
        elapsed = time.perf_counter() - self._t0
        count = torch.tensor([self._count], dtype=torch.int64, device=pl_module.device)
        count = trainer.strategy.reduce(count, reduce_op="sum")
        carry = self._carry or {"samples": 0, "train_time_s": 0.0}
        self._partial = {"epoch": trainer.current_epoch, "samples": carry["samples"] + int(count.item()),
                         "train_time_s": carry["train_time_s"] + elapsed}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._count += self.counter.count(batch, pl_module)
        # a manual-optimisation step that returns nothing reaches here as {}
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if loss is not None:
            # summed on the device; checked once per epoch, so no host sync per step. A copy
            # starts the sum: a float32 loss's detach().float() is its own storage, and under
            # CUDA graphs (reduce-overhead) that is a buffer the next replay overwrites
            # (Lightning's manual-optimisation loop hands it on uncloned)
            loss = loss.detach().float()
            self._loss_sum = loss.clone() if self._loss_sum is None else self._loss_sum + loss

    def _end_training_phase(self, pl_module) -> None:
        if self._t_train is None and self._t0 is not None:
            sync_device(pl_module.device)
            self._t_train = time.perf_counter() - self._t0

    def on_validation_start(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking and self._epoch_open:
            self._end_training_phase(pl_module)

    def on_validation_end(self, trainer, pl_module) -> None:
        # Closing here, not at train-epoch end, puts this epoch into the checkpoint that
        # ModelCheckpoint writes right after (Lightning orders checkpoint callbacks last).
        if not trainer.sanity_checking and self._epoch_open:
            self._close_epoch(trainer, pl_module)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if self._epoch_open:
            self._close_epoch(trainer, pl_module)

    def _close_epoch(self, trainer, pl_module) -> None:
        self._end_training_phase(pl_module)
        elapsed = time.perf_counter() - self._t0
        loss_sum = self._loss_sum if self._loss_sum is not None else torch.zeros((), device=pl_module.device)
        # float64: a float32 count is inexact above 2^24 samples; float64 holds 2^53
        totals = torch.stack([torch.tensor(self._count, dtype=torch.float64, device=pl_module.device),
                              loss_sum.double(),
                              torch.tensor(float(self.counter.problem is not None), dtype=torch.float64,
                                           device=pl_module.device)])
        # one all-reduce per epoch: exact sample count, every rank sees a NaN on any rank, and
        # whether any rank met a batch it could not count
        totals = trainer.strategy.reduce(totals, reduce_op="sum")
        if totals[2] > 0 and self.uncounted is None:
            self.uncounted = self.counter.problem or ("a batch on another rank could not be counted "
                                                      "(its log says why); " + samplecount.DECLARE)
        if not torch.isfinite(totals[1]):
            raise NonFiniteLossError(
                f"training loss became non-finite (NaN or inf) in epoch {trainer.current_epoch}; "
                "lower the learning rate in config (model.init_args) or check the data"
            )
        self.samples.append(int(totals[0].item()))
        self.train_times.append(self._t_train)
        self.epoch_times.append(elapsed)
        self.epoch_attempts.append(self.attempts)
        if self._carry is not None:  # what earlier attempts trained of this epoch
            self.samples[-1] += self._carry["samples"]
            self.train_times[-1] += self._carry["train_time_s"]
            self.epoch_times[-1] += self._carry["train_time_s"]
        self._epoch_open = False
        if trainer.global_rank == 0:  # for `make status` (ddpscale.core.record.progress_line)
            print(progress_line(Progress(
                epoch=len(self.epoch_times), max_epochs=trainer.max_epochs, epoch_s=self.epoch_times[-1],
                throughput=self.samples[-1] / self.epoch_times[-1] if self.epoch_times[-1] > 0 else 0.0,
                attempt=self.attempts, fit_s=time.perf_counter() - self._fit_t0, at=time.time())), flush=True)

    # -- summary ----------------------------------------------------------------------
    def held_s(self) -> float:
        return held_s(self.held_before_s, self.held_since, time.time())

    def steady_figure(self) -> tuple[float | None, float | None]:
        """The steady epochs' figure: (samples per second, seconds per epoch), None where no
        epoch is steady or the samples were not counted. Which figure is the run's headline is
        ddpscale.job.measure.windows.headline's to say."""
        steady = steady_epochs(self.epoch_attempts, self.warmup_epochs)
        samples = None if self.uncounted else sum(self.samples[i] for i in steady)
        seconds = sum(self.train_times[i] for i in steady)
        epoch_times = [self.epoch_times[i] for i in steady]
        return (samples / seconds if samples is not None and seconds > 0 else None,
                sum(epoch_times) / len(epoch_times) if epoch_times else None)

    def section(self) -> dict:
        """The record's timing section (ddpscale.core.record.SECTIONS), rank 0, just before it is written."""
        steady = steady_epochs(self.epoch_attempts, self.warmup_epochs)
        steady_samples = sum(self.samples[i] for i in steady)
        steady_time = sum(self.train_times[i] for i in steady)
        if self.uncounted:  # never a wrong number: what the counts were is not what was trained
            steady_samples = None
        return {
            "epochs_completed": len(self.epoch_times),
            "warmup_epochs": self.warmup_epochs,
            "epoch_times_s": [round(t, 6) for t in self.epoch_times],
            "train_times_s": [round(t, 6) for t in self.train_times],
            "fit_time_s": sum(self.epoch_times),
            # every finished epoch's training samples over all ranks, warm-up included: what the
            # fit time bought (under weak scaling with fixed steps per epoch, more ranks train more)
            "samples_trained": None if self.uncounted else sum(self.samples),
            "samples_uncounted": self.uncounted,
            # devices held, set-up, probe, checkpoints and test pass included (called just before
            # the record is written); held_from: where it starts (ddpscale.job.measure.timing)
            "held_s": self.held_s(),
            "held_from": self.held_from,
            "steady_samples": steady_samples,
            "steady_time_s": steady_time,
            "steady_epochs": steady,
            "epoch_attempts": list(self.epoch_attempts),
            "attempts": self.attempts,
            "resumed_from_epoch": self.resumed_from_epoch,
            "resumed_mid_epoch": self.resumed_mid_epoch,
        }


def steady_epochs(epoch_attempts: list[int], warmup_epochs: int) -> list[int]:
    """Indices of the epochs counted as steady state: in every attempt (process), the first
    warmup_epochs it trained are cold (start-up, compilation) and left out. None may be left:
    then the run reports no throughput rather than a cold one."""
    seen: dict[int, int] = {}
    steady = []
    for index, attempt in enumerate(epoch_attempts):
        seen[attempt] = seen.get(attempt, 0) + 1
        if seen[attempt] > warmup_epochs:
            steady.append(index)
    return steady


JOB_START = "SLURM_JOB_START_TIME"
FROM_JOB = "slurm job start"
FROM_PROCESS = "process start"


def process_start() -> float:
    """This process's start (Unix seconds), or now where psutil cannot read it."""
    try:
        import psutil  # installed with Snakemake

        return float(psutil.Process().create_time())
    except Exception:  # noqa: BLE001 - an unreadable start only makes the figure smaller
        return time.time()


def start_time(scontrol_text: str) -> float | None:
    """StartTime of `scontrol show job -o` (the controller's local time, as this node's clock
    reads it: a site keeps them in one zone) in Unix seconds; None if absent or unknown."""
    for item in scontrol_text.split():
        if item.startswith("StartTime="):
            try:
                return datetime.strptime(item.split("=", 1)[1], "%Y-%m-%dT%H:%M:%S").timestamp()
            except ValueError:
                return None  # "Unknown", or a format of another Slurm
    return None


def scontrol_start(job_id: str | None) -> float | None:
    """This job's start from the controller; None where scontrol is missing or does not answer."""
    if not job_id:
        return None
    try:
        done = subprocess.run(["scontrol", "show", "job", "-o", str(job_id)], capture_output=True,
                              text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return start_time(done.stdout) if done.returncode == 0 else None


def started(environ, process_started: float, on_slurm: bool, ask=scontrol_start) -> tuple[float, str]:
    """(start, what it is): the SLURM job's start where this run's job is a SLURM job (from the
    environment, else asked of scontrol), else the process's. A job start after the process's
    (clocks of controller and node apart) is not believed: the process cannot have started
    before its job."""
    if on_slurm:
        try:
            job = float(environ[JOB_START])
        except (KeyError, ValueError):
            job = ask(environ.get("SLURM_JOB_ID"))
        if job is not None and 0 < job <= process_started:
            return job, FROM_JOB
    return process_started, FROM_PROCESS


def held_s(earlier_s: float, since: float, now: float) -> float:
    """Seconds held over all attempts: the earlier attempts' plus this one's so far."""
    return float(earlier_s) + max(0.0, now - since)
