"""One measurement at a time on one machine: the lock every local training run takes.

The local profile trains one run at a time (train_slots), but only within one snakemake
process: a second experiment started beside it trained at the same time, and each measured the
other (35.7k samples/s instead of 79.5k) without a word in either report. So the local launcher
holds an exclusive flock on one file per machine while its ranks run; a second launcher says
who holds it and waits. The wait comes before any rank starts, so no figure contains it.

flock is released by the kernel when the last descriptor closes, so a killed launcher (and its
ranks, which die with it) never leaves a stale lock.

Where it lives: a folder of this user's own, /tmp/ddpscale-<uid> (mode 0700, made here and used
only if it is a real folder this user owns that no one else can write), or DDPSCALE_LOCK_DIR (the
test suite gives each of its parallel workers its own). A folder shared by every user would also
keep two users' experiments apart, but it is anyone's to plant a file in: a lock another user made
there is theirs to hold for ever, and a link planted there made a root run empty and open up
/etc/passwd. So two users' experiments are no longer kept apart; set DDPSCALE_LOCK_DIR to one
sticky folder (chmod 1777) to share a lock between users who trust each other.

The lock is opened as a lock and nothing else: without following a symbolic link, without
blocking on a FIFO or taking a terminal, and used only if it is a regular file with no other
name (a hard link to /etc/passwd is refused) owned by this user or root, in a folder others cannot
swap it in. Its mode and contents are changed only where this user owns it; a root-owned lock in
a shared folder is flocked read-only (flock needs no write access), and a waiting launcher takes
the holder's pid from the kernel (/proc/locks), showing the file's line only where it names that
pid. A lock it refuses is said in one line and the run goes on without it, as one it cannot open
does: failing would let any user of the machine stop every ddpscale run on it by planting a file.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import fcntl
import os
import pwd
import stat
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from ddpscale.core.io import file_kind, terminal_safe

LOCK_NAME = "ddpscale-local-training.lock"
LOCK_DIR_ENV = "DDPSCALE_LOCK_DIR"
TEMP_DIR = "/tmp"
PROC_LOCKS = "/proc/locks"
# never follow a link, never wait for a FIFO's writer, never make a terminal ours
OPEN_FLAGS = os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NOCTTY | os.O_NONBLOCK


def lock_path(environ: Mapping[str, str], uid: int | None = None) -> Path:
    """DDPSCALE_LOCK_DIR's lock, else the one in this user's own folder under /tmp."""
    if environ.get(LOCK_DIR_ENV):
        return Path(environ[LOCK_DIR_ENV]) / LOCK_NAME
    return Path(TEMP_DIR) / f"ddpscale-{os.geteuid() if uid is None else uid}" / LOCK_NAME


def _own_folder(path: Path) -> None:
    """Make this user's lock folder (0700) where it is missing; a planted one is judged by
    folder_problem, never changed."""
    if path.name == f"ddpscale-{os.geteuid()}" and str(path.parent) == TEMP_DIR:
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)


def holder_line(what: str, pid: int, cwd: str, since: dt.datetime) -> str:
    """Who holds the lock, as a waiting launcher shows it: what trains, where, since when."""
    return f"{what} in {cwd} (pid {pid}), training since {since.isoformat(timespec='seconds')}"


def folder_problem(mode: int, owner: int = 0, me: int = 0) -> str | None:
    """Why a folder (its lstat st_mode and st_uid) is no place for user `me`'s lock, or None: it
    must be a real folder of this user or root, and one that others may write must be sticky, or
    any of them could swap the file under a waiting launcher."""
    if stat.S_ISLNK(mode):
        return "is a symbolic link (name the folder it points to)"
    if not stat.S_ISDIR(mode):
        return "is not a folder"
    if owner not in (0, me):
        return f"belongs to another user (uid {owner})"
    if mode & (stat.S_IWGRP | stat.S_IWOTH) and not mode & stat.S_ISVTX:
        return "is writable by other users and not sticky (chmod +t)"
    return None


def file_problem(mode: int, links: int, owner: int = 0, me: int = 0) -> str | None:
    """Why the file opened at the lock's path (its st_mode, st_nlink and st_uid) is not a lock
    for user `me`, or None."""
    if not stat.S_ISREG(mode):
        return f"is {file_kind(mode)}, not a regular file"
    if links != 1:
        return f"has {links} names (a hard link to another file)"
    if owner not in (0, me):
        return f"belongs to another user (uid {owner}), who could hold it for ever"
    return None


def lock_holders(locks: str, inode: int) -> list[int]:
    """The pids holding a flock on the file with this inode, read from /proc/locks' text.
    Waiters ("->") are left out; the device is not compared, since overlayfs and btrfs show
    other device numbers there than stat does."""
    pids = []
    for line in locks.splitlines():
        fields = line.split()
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[4].isdigit() \
                and fields[5].rpartition(":")[2] == str(inode):
            pids.append(int(fields[4]))
    return pids


def waiting_line(holder: str, pids: list[int] | None = None, users: Mapping[int, str] | None = None) -> str:
    """What a waiting launcher says. holder is the lock file's text, anyone's to write, and this
    line goes to a terminal: no control characters. pids are the holders the kernel names; where
    the text names none of them (another user's file, which its holder could not write), the pid
    and its user are shown instead."""
    text = terminal_safe(holder.strip())
    if pids and not any(f"(pid {pid})" in text for pid in pids):
        user = (users or {}).get(pids[0])
        text = f"pid {pids[0]}" + (f" of user {user}" if user else "")
    held_by = text or "a run that has not yet said what it is"
    return (f"another ddpscale training holds this machine: {held_by}; waiting for it to end, so that "
            "neither run measures the other")


def _holders(inode: int) -> tuple[list[int], dict[int, str]]:
    """The kernel's word on who holds the lock, with their user names; nothing where there is no
    /proc/locks (not Linux)."""
    try:
        with open(PROC_LOCKS) as handle:
            pids = lock_holders(handle.read(), inode)
    except OSError:
        return [], {}
    users = {}
    for pid in pids:
        with contextlib.suppress(OSError, KeyError):
            users[pid] = pwd.getpwuid(os.stat(f"/proc/{pid}").st_uid).pw_name
    return pids, users


def _open(path: Path) -> tuple[int, bool]:
    """A descriptor on the lock and whether this call created it. Create-exclusive first: a file
    made here is this user's; else the one there, read-write where this user may, else read-only."""
    for _ in range(3):  # the file can vanish between two opens (its owner removed it)
        try:
            return os.open(path, OPEN_FLAGS | os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644), True
        except FileExistsError:
            pass
        for access in (os.O_RDWR, os.O_RDONLY):
            try:
                return os.open(path, OPEN_FLAGS | access), False
            except FileNotFoundError:
                break
            except OSError as err:
                if access == os.O_RDONLY or err.errno not in (errno.EACCES, errno.EPERM, errno.EROFS, errno.EISDIR):
                    raise
    raise FileNotFoundError(errno.ENOENT, "it vanished each time it was opened", str(path))


def _opened(path: Path) -> tuple[int | None, bool, str | None]:
    """(a descriptor on the lock, whether the holder line may be written in it, why not to use
    it). The line is written only in a file this user owns, opened for writing."""
    try:
        _own_folder(path.parent)
        found = os.lstat(path.parent)
        folder = folder_problem(found.st_mode, found.st_uid, os.geteuid())
        if folder:
            return None, False, f"is in a folder that {folder}"
        fd, created = _open(path)
    except OSError as err:
        return None, False, "is a symbolic link" if err.errno == errno.ELOOP else f"cannot be opened ({err.strerror})"
    found = os.fstat(fd)
    why = file_problem(found.st_mode, found.st_nlink, found.st_uid, os.geteuid())
    if why:
        os.close(fd)
        return None, False, why
    if created:  # the umask narrowed O_CREAT's mode; every user must be able to open it to wait
        with contextlib.suppress(OSError):
            os.fchmod(fd, 0o644)
    writable = fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDWR
    return fd, writable and (created or found.st_uid == os.geteuid()), None


@contextlib.contextmanager
def held(path: Path, holder: str, say: Callable[[str], None]) -> Iterator[float]:
    """Hold the machine's lock for the block; yields the seconds spent waiting for it.

    A lock this user cannot open, or one that is not a lock ddpscale would make (module
    docstring), is said in one line and the run goes on without it, as it did before there
    was a lock."""
    fd, ours, why = _opened(path)
    if fd is None:
        say(f"the machine lock {path} {why}; not using it, so a second experiment on this machine could "
            f"train at the same time. Remove it, or set {LOCK_DIR_ENV} to a folder of your own")
        yield 0.0
        return
    waited = 0.0
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(waiting_line(os.pread(fd, 4096, 0).decode("utf-8", "replace"), *_holders(os.fstat(fd).st_ino)))
            started = time.monotonic()
            fcntl.flock(fd, fcntl.LOCK_EX)
            waited = time.monotonic() - started
            say(f"the machine is free after {waited:.0f} s of waiting; training starts")
        if ours:  # another user's file is theirs to write: the kernel names its holder instead
            os.ftruncate(fd, 0)
            os.pwrite(fd, holder.encode(), 0)
        yield waited
    finally:
        os.close(fd)
