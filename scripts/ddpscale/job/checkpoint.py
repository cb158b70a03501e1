"""The resume checkpoint: one file, rewritten at the end of every epoch, and no work per step;
the one it replaces kept as previous.ckpt, and each signed with its checksum once complete.

Lightning calls every hook of every callback at every step, and names each call by the
callback's state_key, which ModelCheckpoint formats anew from its settings each time (about
4 us, 6 hooks a step). Its on_train_batch_end only serves every_n_train_steps and
train_time_interval, which a per-epoch checkpoint does not use. On the spiral MLP, a
2 ms step, that was measurable (docs/performance.md), so both are skipped here.
"""

from __future__ import annotations

import time
from pathlib import Path

from pytorch_lightning.callbacks import ModelCheckpoint

from ddpscale.job import checksum
from ddpscale.job.runinfo import LAST, PREVIOUS


class EpochCheckpoint(ModelCheckpoint):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # the seconds of each save in this process, for the projection of the full training (a
        # save per epoch is part of what it costs); every rank waits for rank 0's write
        self.save_seconds: list[float] = []
        self.save_epochs: list[int] = []  # the epoch each save ended

    @property
    def state_key(self) -> str:
        # the settings it is made of are fixed at __init__
        if getattr(self, "_state_key_cache", None) is None:
            self._state_key_cache = super().state_key
        return self._state_key_cache

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        """Nothing to do: saving happens at validation end or train epoch end."""

    def _save_checkpoint(self, trainer, filepath: str) -> None:
        started = time.perf_counter()
        # Lightning writes in place: the one this save replaces is kept until the next, so a
        # kill mid-write leaves a whole one to resume from (ddpscale.job.checksum)
        if trainer.is_global_zero:
            checksum.rotate(filepath, Path(filepath).with_name(PREVIOUS))
        super()._save_checkpoint(trainer, filepath)  # ends with a barrier: the file is complete
        if trainer.is_global_zero:
            checksum.sign(filepath)  # part of what a save costs, so timed with it
        self.save_seconds.append(time.perf_counter() - started)
        self.save_epochs.append(int(trainer.current_epoch))

    def record(self) -> dict:
        return {"checkpoint_s": sum(self.save_seconds), "checkpoint_saves": len(self.save_seconds),
                # [epoch, seconds] of each save in this process, for the projection
                "checkpoint_save_s": [[e, s] for e, s in zip(self.save_epochs, self.save_seconds)]}


def epoch_checkpoint(ckpt_dir: str) -> EpochCheckpoint:
    # save_top_k=1 with no monitor keeps the latest. (save_last with save_top_k=0 writes nothing
    # in Lightning 2.6: "last" is only saved when a top-k checkpoint was saved in that step.)
    return EpochCheckpoint(dirpath=ckpt_dir, filename=LAST.removesuffix(".ckpt"), save_top_k=1,
                           enable_version_counter=False)
