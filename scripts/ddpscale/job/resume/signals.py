"""Stop a run on SIGUSR1 or SIGTERM: every rank at the same step, with a checkpoint to resume.

A cluster profile asks SLURM for SIGUSR1 some time before the limit (`--signal=USR1@s`);
SLURM sends SIGTERM at the limit, on preemption and on scancel; the local launcher forwards
SIGTERM to every rank. Each rank sees its signal at a slightly different batch, and a
collective or a save that only one rank enters deadlocks the job. So the handler only notes
the signal; every CHECK_EVERY steps all ranks all-reduce what they noted and, if any rank
has one, all of them save the same mid-epoch checkpoint and stop. The run then exits
non-zero (128 + signal), so Snakemake's retry (or the user's rerun) resumes from that step
instead of from the last epoch end.

Lightning's own SIGTERM handler is replaced while training: it broadcasts from inside the
handler, which deadlocks when only some ranks received the signal, and ends with a
SystemExit whose code None reads as success.
"""

from __future__ import annotations

import os
import signal

import pytorch_lightning as pl
import torch
import torch.distributed as dist

from ddpscale.job.resume import checksum
from ddpscale.job.resume.checkpoint import PREVIOUS

STOP_SIGNALS = (signal.SIGUSR1, signal.SIGTERM)
# An all-reduce of one integer every 10 steps: Lightning 2.6 already broadcasts a flag every
# DDP step, so this adds little; the stop lands at most 10 steps after the signal.
CHECK_EVERY = 10


HANDLED = ("ddpscale: training; from now on SIGUSR1 or SIGTERM stops every rank at one step with a "
           "mid-epoch checkpoint")


class StopRequested(Exception):
    """Every rank stopped at the same step on a signal; the checkpoint holds that step."""

    def __init__(self, signum: int, checkpoint: str | None):
        self.signum, self.checkpoint = signum, checkpoint
        super().__init__(stop_message(signum, checkpoint))


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def exit_code(signum: int) -> int:
    """The shell's convention for 'ended by this signal', and never 0: Snakemake retries it."""
    return 128 + signum


def stop_message(signum: int, checkpoint: str | None) -> str:
    where = (f"saved a checkpoint at {checkpoint}; running the workflow again (or its retry) "
             "resumes from it") if checkpoint else \
        "running the workflow again resumes from its last finished epoch, if any"
    return f"terminated by {signal_name(signum)} before the run finished: {where}"


def check_due(steps: int, every: int) -> bool:
    """Whether the ranks agree at this step (counted from 1 in this process, so equal on every rank)."""
    return steps % every == 0


class GracefulStop(pl.Callback):
    """Notes SIGUSR1/SIGTERM and stops every rank at the same step, after saving `checkpoint`.

    before_save(trainer, pl_module) runs on every rank just before the save, at the agreed
    step (EpochTiming.pause keeps the partial epoch's time and samples there)."""

    def __init__(self, checkpoint: str, every: int = CHECK_EVERY, before_save=None):
        self.checkpoint, self.every, self.before_save = checkpoint, every, before_save
        self.received = 0
        self._steps = 0
        self._due = False

    def _note(self, signum, _frame) -> None:
        self.received = self.received or int(signum)

    def on_train_start(self, trainer, pl_module) -> None:
        # after Lightning registered its handlers (Trainer._run), so these replace them
        for signum in STOP_SIGNALS:
            signal.signal(signum, self._note)
        # Until every rank has replaced them, a signal still meets Lightning's handler somewhere;
        # after this barrier it stops all ranks at one step, and the log says from when.
        trainer.strategy.barrier("ddpscale signal handlers")
        if trainer.is_global_zero:
            print(HANDLED, flush=True)

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        # the previous epoch's checkpoint is written: stopping here loses nothing
        signum = self._agree(trainer)
        if signum:
            raise StopRequested(signum, None)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._steps += 1
        self._due = self._due or check_due(self._steps, self.every)
        # Not on an epoch's last batch: Lightning resumes a checkpoint saved there by training
        # that whole epoch again. The epoch's end (and the next epoch's start) comes next anyway.
        if not self._due or trainer.fit_loop.epoch_loop.batch_progress.is_last_batch:
            return
        self._due = False
        signum = self._agree(trainer)
        if not signum:
            return
        if self.before_save is not None:
            self.before_save(trainer, pl_module)
        saved = self._save(trainer)
        raise StopRequested(signum, saved)

    def _agree(self, trainer) -> int:
        """The signal any rank received (the largest number), the same on every rank; 0: none."""
        if not (dist.is_available() and dist.is_initialized()):
            return self.received
        flag = torch.tensor([self.received], dtype=torch.int64, device=trainer.strategy.root_device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return int(flag.item())

    def _save(self, trainer) -> str:
        # written aside and renamed: a kill during the write leaves the previous checkpoint
        partial = self.checkpoint + ".partial"
        trainer.save_checkpoint(partial)  # every rank; rank 0 writes, then a barrier
        if trainer.is_global_zero:
            # the epoch's checkpoint stays as previous.ckpt, and this one is signed as it is
            checksum.rotate(self.checkpoint, os.path.join(os.path.dirname(self.checkpoint), PREVIOUS))
            os.replace(partial, self.checkpoint)
            checksum.sign(self.checkpoint)
        return self.checkpoint
