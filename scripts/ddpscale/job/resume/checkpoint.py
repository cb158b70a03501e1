"""The resume checkpoint: one file, rewritten at the end of every epoch, and no work per step;
the one it replaces kept as previous.ckpt, and each signed with its checksum once complete;
and which of them a run resumes from (resume_path), or the record of a run that finished in an
earlier attempt of its job (finished_record).

Lightning calls every hook of every callback at every step, and names each call by the
callback's state_key, which ModelCheckpoint formats anew from its settings each time (about
4 us, 6 hooks a step). Its on_train_batch_end only serves every_n_train_steps and
train_time_interval, which a per-epoch checkpoint does not use. On the spiral MLP, a
2 ms step, that was measurable (docs/performance.md), so both are skipped here.
"""

from __future__ import annotations

import pickle
import re
import time
from pathlib import Path

import torch
from pytorch_lightning.callbacks import ModelCheckpoint

from ddpscale.core import record as run_record
from ddpscale.core.io import read_json_dict, terminal_safe, write_json_atomic
from ddpscale.job.resume import checksum
from ddpscale.run import identity

LAST = "last.ckpt"
PREVIOUS = "previous.ckpt"  # the checkpoint last.ckpt replaced, kept until the next save (ddpscale.job.resume.checksum)
FINGERPRINT = "fingerprint.json"
FINAL = "final.json"  # the metrics record of a finished run, kept for a retry of the same job


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
        # kill mid-write leaves a whole one to resume from (ddpscale.job.resume.checksum)
        if trainer.is_global_zero:
            checksum.rotate(filepath, Path(filepath).with_name(PREVIOUS))
        super()._save_checkpoint(trainer, filepath)  # ends with a barrier: the file is complete
        if trainer.is_global_zero:
            checksum.sign(filepath)  # part of what a save costs, so timed with it
        self.save_seconds.append(time.perf_counter() - started)
        self.save_epochs.append(int(trainer.current_epoch))

    def section(self) -> dict:
        """The record's checkpoint section (ddpscale.core.record.SECTIONS)."""
        return {"checkpoint_s": sum(self.save_seconds), "checkpoint_saves": len(self.save_seconds),
                # [epoch, seconds] of each save in this process, for the projection
                "checkpoint_save_s": [[e, s] for e, s in zip(self.save_epochs, self.save_seconds)]}


def epoch_checkpoint(ckpt_dir: str) -> EpochCheckpoint:
    # save_top_k=1 with no monitor keeps the latest. (save_last with save_top_k=0 writes nothing
    # in Lightning 2.6: "last" is only saved when a top-k checkpoint was saved in that step.)
    return EpochCheckpoint(dirpath=ckpt_dir, filename=LAST.removesuffix(".ckpt"), save_top_k=1,
                           enable_version_counter=False)


def resume_path(ckpt_dir: str, settings: dict, is_rank_zero: bool) -> str | None:
    """The checkpoint to resume from, or None to start fresh.

    A checkpoint is only resumed if it was written by a run with the same settings and
    identity (data checksum, training code, versions); a stale one is removed by rank 0 so a
    changed config, dataset or code starts over. Of a matching one, last.ckpt is resumed if it
    is whole, signed and loads as data (problem), else previous.ckpt, the one it replaced; one
    that is not is set aside (last.ckpt.damaged), or every rerun would crash, resume damaged
    weights or run the code a planted file names.
    Every rank reaches the same answer without a process group: rank 0 deletes or renames
    a checkpoint (atomic) before it rewrites the fingerprint or looks at the next one, each
    rank checks a file itself (a rank that finds it renamed already goes on to the next, as
    rank 0 did), and a new checkpoint cannot appear before all ranks have started.
    """
    ckpt_dir = Path(ckpt_dir)
    last, stamp = ckpt_dir / LAST, ckpt_dir / FINGERPRINT
    wanted = identity.digest(settings)
    recorded = _read_stamp(stamp)
    candidates = [ckpt_dir / LAST, ckpt_dir / PREVIOUS]
    if recorded.get("fingerprint") == wanted:
        damaged = False
        for path in candidates:
            if not path.exists():
                continue
            why = problem(path, interrupted=path == last and (ckpt_dir / PREVIOUS).exists())
            if why is None:
                return str(path)
            damaged = True
            if is_rank_zero:
                aside = checksum.put_aside(path)
                print(f"ddpscale: {path} {why}; set aside as {aside.name}", flush=True)
        if damaged and is_rank_zero:
            print("ddpscale: no whole checkpoint left; starting this run fresh", flush=True)
        return None
    if is_rank_zero:
        if last.exists():
            changed = ", ".join(k for k in changed_keys(recorded.get("settings"), settings)
                                if not k.endswith("digest")) or "unknown"
            print(f"ddpscale: {last} was written with other settings (changed: {changed}); "
                  "starting this run fresh", flush=True)
        for path in candidates:
            checksum.remove(path)
        # atomic: the other ranks read this file while rank 0 writes it
        write_json_atomic(stamp, {"fingerprint": wanted, "settings": settings})
    return None


def _read_stamp(stamp: Path) -> dict:
    return read_json_dict(stamp) or {}


def problem(path: Path, interrupted: bool) -> str | None:
    """Why a checkpoint is not resumed, as the rest of a sentence ("is damaged (...)"), or None.

    Its checksum decides whether it is whole. One without a checksum is never resumed: where a
    previous.ckpt exists its save was cut short, else ddpscale did not write it (a copied or
    planted file), and a checkpoint is trusted only as far as this run's own signature goes. A
    whole one must still load as data (unloadable), or resuming would stop at trainer.fit."""
    why = checksum.mismatch(path)
    if why == checksum.UNSIGNED:
        if interrupted:
            return "is damaged (it has no checksum: its save was interrupted)"
        return (f"is not resumed (it has no checksum, {checksum.sidecar(path).name}: ddpscale resumes only "
                "checkpoints it wrote and signed)")
    if why:
        return f"is damaged ({why})"
    why = unloadable(path)
    return f"is not resumed ({why})" if why else None


def unloadable(path: Path) -> str | None:
    """Why torch cannot load this checkpoint as data, or None.

    weights_only=True: a checkpoint is unpickled as tensors and plain types only, so a file that
    names a function to call (a pickle's __reduce__) is refused instead of run. Lightning's own
    contents (hyper-parameters, loops, callbacks, optimizer states) are plain types; a module
    that saves its own classes registers them (docs/your-model.md). Cheap for a checkpoint of
    gigabytes: mmap=True reads the zip directory and unpickles the structure, but leaves the
    tensor bytes on disk until used.
    """
    try:
        saved = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    except pickle.UnpicklingError as err:
        found = re.search(r"Unsupported global: GLOBAL (\S+)", str(err))
        held = found.group(1) if found else "an object torch does not load as data"
        return (f"it holds {terminal_safe(held)}, which torch would load only by running code; a module's own "
                "class must be allowed with torch.serialization.add_safe_globals (docs/your-model.md)")
    except Exception as err:  # noqa: BLE001 - whatever torch raises, the file is unusable
        return f"{type(err).__name__}: {str(err).splitlines()[0][:120] if str(err) else 'no detail'}"
    if not isinstance(saved, dict) or "state_dict" not in saved:
        return "not a Lightning checkpoint"
    return None


def changed_keys(old, new, prefix: str = "") -> list[str]:
    """Dotted names of the entries that differ between two settings dicts."""
    if not isinstance(old, dict) or not isinstance(new, dict):
        return [prefix] if old != new and prefix else []
    out = []
    for key in sorted(set(old) | set(new)):
        name = f"{prefix}{key}"
        if isinstance(old.get(key), dict) and isinstance(new.get(key), dict):
            out += changed_keys(old[key], new[key], name + ".")
        elif old.get(key) != new.get(key):
            out.append(name)
    return out


def finish(ckpt_dir: str, settings: dict, record: dict) -> None:
    """After success: keep the record, drop the resume checkpoint.

    A job can finish and still be killed before it exits (SLURM's time limit during
    interpreter teardown): the scheduler then reports TIMEOUT and Snakemake deletes the
    metrics. The retry re-emits this record instead of training again.
    """
    ckpt_dir = Path(ckpt_dir)
    run_record.write_final(ckpt_dir / FINAL, identity.digest(settings), record)
    for name in (LAST, PREVIOUS):
        checksum.remove(ckpt_dir / name)


def finished_record(ckpt_dir: str, settings: dict, attempt: int, is_rank_zero: bool) -> dict | None:
    """The record of this same run if it finished in an earlier attempt of this job.

    Only for a retry (attempt > 1): a new command (say, after deleting metrics.json to
    measure again) always trains afresh. Every rank reaches the same answer; only rank 0
    removes a record that no longer applies.
    """
    path = Path(ckpt_dir) / FINAL
    if not path.exists():
        return None
    # a record of another shape or version is as good as none: the run trains (or resumes) and writes its own
    final = run_record.read_final(path)
    if attempt > 1 and final is not None and final[0] == identity.digest(settings):
        return final[1]
    if is_rank_zero:
        path.unlink(missing_ok=True)
    return None
