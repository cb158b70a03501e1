"""Small file helpers shared by the scripts."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import shutil
import signal
import stat
from contextlib import ExitStack, contextmanager
from pathlib import Path

# What srun adds once a rank has exited: "srun: error: n1: task 0: Exited with exit code 3",
# "srun: Terminating StepId=12.0", ... The cause is above these lines. slurmstepd's own lines
# (a cancelled job, a time limit, memory) are causes themselves and stay.
SRUN_AFTERMATH = re.compile(r"^srun: (error: \S+: tasks? [\d,-]+: (Exited with exit code \d+|Aborted|Killed"
                            r"|Terminated)|(Force )?Terminat(ing|ed) StepId=\S+|launch/slurm: _step_signal: "
                            r"Terminating StepId=\S+|error: Timed out waiting for job step to complete)$")

# C0 controls, DEL and C1 controls: a terminal acts on them (ESC starts a sequence that can move
# the cursor, recolour or retitle; 0x9b is a one-byte CSI; CR rewrites the line) instead of
# showing them; in a one-line message a newline splits it
CONTROL_CHARACTER = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def terminal_safe(text: str) -> str:
    """text with each control character escaped as Python writes it (ESC as \\x1b, CR as \\r):
    whatever a file holds, what ddpscale prints shows it and does nothing to the terminal."""
    return CONTROL_CHARACTER.sub(lambda m: repr(m.group())[1:-1], text)


# every control character but the newline and tab that lay out a text file, which are white space
# in HTML and SVG and do nothing on a terminal
LAYOUT_KEPT = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def text_safe(text: str) -> str:
    """A whole text file (a page, an SVG, a log) with its control characters escaped as
    terminal_safe escapes them, newlines and tabs kept: a name with ESC or CR in it shows as
    text, and an SVG stays well-formed XML (which allows no C0 control but those)."""
    return LAYOUT_KEPT.sub(lambda m: repr(m.group())[1:-1], text)


# A spreadsheet opening a TSV takes a cell that starts with one of these for a formula (OWASP,
# "CSV Injection"): =HYPERLINK(...) in a model's name would become a live link, or worse. OWASP
# also lists a leading tab and CR: sheet_cell escapes those as it does every control character.
FORMULA_START = ("=", "+", "-", "@")
# The defence OWASP gives: a leading single quote, which spreadsheets take as "this is text".
SHEET_QUOTE = "'"
# a number with a sign is data, not a formula: "-1.5" or "+2e-3" stays as it is (while "-inf",
# "-1+1" or "-cmd" are names or sums to a spreadsheet, and get the quote)
SIGNED_NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")


def sheet_cell(text: str) -> str:
    """A text cell of a TSV as ddpscale writes it: control characters escaped (a tab, newline or
    CR would split the row; ESC acts on a terminal that shows the file), then SHEET_QUOTE before
    a cell that a spreadsheet would evaluate. A cell that starts with the quote itself gets one
    more, so from_sheet_cell, dropping one, gives back exactly the escaped text."""
    text = terminal_safe(text)
    if text.startswith(SHEET_QUOTE) or (text.startswith(FORMULA_START) and not SIGNED_NUMBER.fullmatch(text)):
        return SHEET_QUOTE + text
    return text


def from_sheet_cell(text: str) -> str:
    """The text sheet_cell wrote a cell from (its control characters still escaped)."""
    return text.removeprefix(SHEET_QUOTE)


def atomic_write(path: str | os.PathLike, write) -> None:
    """write(tmp_path), then rename: a reader, or Snakemake after a killed job, never sees
    half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_json_atomic(path: str | os.PathLike, data) -> None:
    def dump(tmp: Path) -> None:
        with open(tmp, "w") as handle:
            json.dump(data, handle, indent=2, sort_keys=True)
            handle.flush()
            os.fsync(handle.fileno())

    atomic_write(path, dump)


def set_aside(path: str | os.PathLike, suffix: str) -> Path:
    """Rename a damaged file to path + suffix (".1", ".2", ... after it where that name is taken,
    so an earlier one is kept) and return the new name: nothing is deleted, and the next run
    finds the original name free. os.replace is atomic, so a concurrent reader sees the file
    under one of its names or not at all."""
    path = Path(path)
    aside = path.with_name(path.name + suffix)
    number = 0
    while aside.exists():
        number += 1
        aside = path.with_name(f"{path.name}{suffix}.{number}")
    os.replace(path, aside)
    return aside


KEPT = ".previous"  # beside a workflow output: the copy keep() made of it


def kept(path: str | os.PathLike) -> Path:
    path = Path(path)
    return path.parent / KEPT / path.name


def keep(paths) -> None:
    """A hard link (a copy where links fail) of each output that exists, in .previous/ beside
    it: Snakemake deletes a job's outputs before it runs, and a report job that fails would
    otherwise leave no report at all. The writers replace files by rename, so the link keeps
    the old content."""
    for path in map(Path, paths):
        if not path.is_file():
            continue
        target = kept(path)
        target.parent.mkdir(exist_ok=True)
        target.unlink(missing_ok=True)
        try:
            os.link(path, target)
        except OSError:
            shutil.copy2(path, target)


def restore(paths) -> list[str]:
    """Each missing output whose kept copy exists, put back (its old time stamp makes the next
    run rebuild it); returns those restored. Per folder under publish_lock: a writer that was
    still moving a new set into place (staged) finishes first, and a file it put there is kept."""
    restored = []
    folders = {}
    for path in map(Path, paths):
        folders.setdefault(path.parent, []).append(path)
    for folder, files in folders.items():
        if not folder.is_dir():
            continue
        with publish_lock(folder):
            for path in files:
                if not path.exists() and kept(path).is_file():
                    os.replace(kept(path), path)
                    restored.append(str(path))
    return restored


STAGING = ".staging-"  # + the writer's pid: a folder inside the one a set of files is published to


@contextmanager
def publish_lock(folder: str | os.PathLike):
    """Held while a set of files moves into folder (staged) and while restore puts files back, so
    the two never interleave: an flock on the folder itself, which leaves no file behind. Where
    the folder cannot be locked (gone, or a file system without flock, such as Lustre mounted
    without -o flock, or NFS for a folder) there is no writer to wait for, or no way to."""
    with ExitStack() as stack:
        try:
            fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
            stack.callback(os.close, fd)  # closing releases the lock
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:
            pass
        yield


STOPPING = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}


def _clear_stale_stages(folder: Path) -> None:
    """Staging folders that killed writers left (their pid is gone) take no more space."""
    for stage in folder.glob(f"{STAGING}*"):
        pid = stage.name[len(STAGING):]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(stage, ignore_errors=True)
        except OSError:  # alive, someone else's
            pass


@contextmanager
def staged(folder: str | os.PathLike):
    """A fresh folder to write a set of files into; on a clean exit they all move into folder, in
    the order they were written, by rename (the same file system, so each is whole), holding
    publish_lock with SIGINT, SIGTERM and SIGHUP held back until the last one is in place. On an
    error or a signal before that, folder keeps the files it had: a report is whole, the new one
    or the previous one, never half of each."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    _clear_stale_stages(folder)
    stage = folder / f"{STAGING}{os.getpid()}"
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir()
    try:
        yield stage
        files = sorted(stage.iterdir(), key=lambda path: (path.stat().st_mtime_ns, path.name))
        held = signal.pthread_sigmask(signal.SIG_BLOCK, STOPPING)
        try:
            with publish_lock(folder):
                for path in files:
                    os.replace(path, folder / path.name)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def read_json_dict(path: str | os.PathLike) -> dict | None:
    """A JSON object the workflow wrote (a cache, a plan), or None where there is none: the
    file missing or unreadable, cut short, or not an object. Its writer makes it again."""
    try:
        data = json.loads(read_regular(path))  # a FIFO in its place is refused, not waited on
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def last_nonempty_line(text: str) -> str:
    """The last non-empty line of a log, stripped (usually the error); "" when it has none."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def cause_line(text: str) -> str:
    """The line of a failed run's log that says why: the last non-empty one that is not srun's
    aftermath (SRUN_AFTERMATH); the last line when there is no other; "" when it has none."""
    causes = "\n".join(line for line in text.splitlines() if not SRUN_AFTERMATH.match(line.strip()))
    return last_nonempty_line(causes) or last_nonempty_line(text)


def file_kind(mode: int) -> str:
    """What a stat mode is, in words, for a message about a path that is not a regular file."""
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return name
    return "not a regular file"


def read_regular(path: str | os.PathLike) -> bytes:
    """The bytes of a regular file (a symbolic link to one too), else OSError saying what it is.

    Opened without blocking and checked on the open descriptor: opening a FIFO for reading
    waits for a writer, which would hang whatever reads a results folder someone put one in,
    and a check before the open could be raced by a rename."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise OSError(errno.EINVAL, f"{file_kind(mode)}, not a regular file")
        # the descriptor reads as usual once it is known to be a file: O_NONBLOCK means nothing to one
        with os.fdopen(fd, "rb", closefd=False) as handle:
            return handle.read()
    finally:
        os.close(fd)
