"""One measurement at a time on one machine: the lock every local training run takes.

The local profile trains one run at a time (train_slots), but only within one snakemake
process: a second experiment started beside it trained at the same time, and each measured the
other (35.7k samples/s instead of 79.5k) without a word in either report. So the local launcher
holds an exclusive flock on one file per machine while its ranks run; a second launcher says
who holds it and waits. The wait comes before any rank starts, so no figure contains it.

flock is released by the kernel when the last descriptor closes, so a killed launcher (and its
ranks, which die with it) never leaves a stale lock. The file lives in /tmp, shared by every
user of the machine; DDPSCALE_LOCK_DIR moves it (the test suite gives each of its parallel
workers its own).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import os
import time
from pathlib import Path
from typing import Callable, Iterator, Mapping

from ddpscale.core.io import terminal_safe

LOCK_NAME = "ddpscale-local-training.lock"
LOCK_DIR_ENV = "DDPSCALE_LOCK_DIR"


def lock_path(environ: Mapping[str, str]) -> Path:
    return Path(environ.get(LOCK_DIR_ENV) or "/tmp") / LOCK_NAME


def holder_line(what: str, pid: int, cwd: str, since: dt.datetime) -> str:
    """Who holds the lock, as a waiting launcher shows it: what trains, where, since when."""
    return f"{what} in {cwd} (pid {pid}), training since {since.isoformat(timespec='seconds')}"


def waiting_line(holder: str) -> str:
    # the file is anyone's to write, and this line goes to a terminal: no control characters
    held_by = terminal_safe(holder.strip()) or "a run that has not yet said what it is"
    return (f"another ddpscale training holds this machine: {held_by}; waiting for it to end, so that "
            "neither run measures the other")


@contextlib.contextmanager
def held(path: Path, holder: str, say: Callable[[str], None]) -> Iterator[float]:
    """Hold the machine's lock for the block; yields the seconds spent waiting for it.

    A lock file this user cannot open (another user made it private) is said in one line and
    the run goes on without it, as it did before there was a lock."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    except OSError as err:
        say(f"cannot open the machine lock {path} ({err.strerror}); a second experiment on this "
            f"machine would train at the same time. Set {LOCK_DIR_ENV} to a folder every user can write")
        yield 0.0
        return
    waited = 0.0
    try:
        with contextlib.suppress(OSError):  # another user's file: its mode is theirs to set
            os.fchmod(fd, 0o666)  # the umask narrowed O_CREAT's mode; every user must open it
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(waiting_line(os.pread(fd, 4096, 0).decode("utf-8", "replace")))
            started = time.monotonic()
            fcntl.flock(fd, fcntl.LOCK_EX)
            waited = time.monotonic() - started
            say(f"the machine is free after {waited:.0f} s of waiting; training starts")
        os.ftruncate(fd, 0)
        os.pwrite(fd, holder.encode(), 0)
        yield waited
    finally:
        os.close(fd)
