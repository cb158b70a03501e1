"""The machine lock opens a lock and nothing else (ddpscale.job.launch.machinelock).

Its folder is this user's own under /tmp, or one DDPSCALE_LOCK_DIR names, which may be shared;
whatever another user planted at its path (a link to a file of root's, a FIFO, a file of their
own, a folder of their own in this user's name) must come out unchanged, and no launcher may hang
on it. The two-launcher behaviour is tested in tests/workflow/test_machine_lock.py.
"""

from __future__ import annotations

import fcntl
import os
import stat
import threading

import pytest
from ddpscale.job.launch import machinelock
from ddpscale.job.launch.machinelock import LOCK_NAME

HOLDER = "topology 1x2 in /home/me/exp (pid 4242), training since 2025-01-01T00:00:00+00:00"
VICTIM = "root:x:0:0:root:/root:/bin/bash\n"


@pytest.fixture
def folder(tmp_path):
    made = tmp_path / "lock"
    made.mkdir()
    return made


@pytest.fixture
def victim(tmp_path):
    path = tmp_path / "passwd"
    path.write_text(VICTIM)
    path.chmod(0o600)
    return path


def hold(path) -> list[str]:
    said = []
    with machinelock.held(path, HOLDER, said.append) as waited:
        assert waited == 0.0
    return said


def mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_a_symlink_at_the_lock_path_leaves_the_file_it_points_at_alone(folder, victim):
    (folder / LOCK_NAME).symlink_to(victim)
    said = hold(folder / LOCK_NAME)
    assert victim.read_text() == VICTIM and mode(victim) == 0o600
    assert len(said) == 1 and "is a symbolic link; not using it" in said[0]
    assert machinelock.LOCK_DIR_ENV in said[0]


def test_a_dangling_symlink_creates_no_file_where_it_points(folder, tmp_path):
    target = tmp_path / "etc-cron.d-job"
    (folder / LOCK_NAME).symlink_to(target)
    said = hold(folder / LOCK_NAME)
    assert not target.exists()
    assert "is a symbolic link" in said[0]


def test_a_hard_link_to_another_file_is_refused(folder, victim):
    os.link(victim, folder / LOCK_NAME)
    said = hold(folder / LOCK_NAME)
    assert victim.read_text() == VICTIM and mode(victim) == 0o600
    assert "has 2 names (a hard link to another file)" in said[0]


@pytest.mark.timeout(60)  # a launcher that waits for a FIFO's writer fails here instead of hanging
def test_a_fifo_at_the_lock_path_neither_hangs_nor_is_changed(folder):
    os.mkfifo(folder / LOCK_NAME, 0o600)
    said = hold(folder / LOCK_NAME)
    assert mode(folder / LOCK_NAME) == 0o600 and stat.S_ISFIFO(os.lstat(folder / LOCK_NAME).st_mode)
    assert "is a FIFO, not a regular file" in said[0]


def test_a_lock_in_a_folder_any_user_can_swap_it_in_is_refused(folder):
    folder.chmod(0o777)
    said = hold(folder / LOCK_NAME)
    assert not (folder / LOCK_NAME).exists()
    assert "is writable by other users and not sticky (chmod +t)" in said[0]
    folder.chmod(0o1777)  # as /tmp is
    assert hold(folder / LOCK_NAME) == []


def test_the_lock_it_creates_is_readable_by_all_and_writable_by_its_owner_only(folder):
    old = os.umask(0o077)
    try:
        assert hold(folder / LOCK_NAME) == []
    finally:
        os.umask(old)
    assert mode(folder / LOCK_NAME) == 0o644
    assert (folder / LOCK_NAME).read_text() == HOLDER


LEFT = "topology 2x2 in /home/other (pid 1), training since yesterday"


def planted(folder, bits: int, uid: int | None = None):
    """A lock left at the path by someone else: its line, its mode and, given, its owner."""
    lock = folder / LOCK_NAME
    lock.write_text(LEFT)
    lock.chmod(bits)
    if uid is not None:
        os.chown(lock, uid, uid)
    return lock


@pytest.mark.skipif(os.geteuid() != 0, reason="making a file of another user needs root (os.chown)")
def test_another_users_lock_is_refused_and_never_changed(folder):
    """Another user's lock is theirs to hold for ever: it is refused, not waited on."""
    lock = planted(folder, 0o644, uid=12345)
    said = hold(lock)
    assert "belongs to another user (uid 12345)" in said[0]
    assert lock.read_text() == LEFT and mode(lock) == 0o644 and lock.stat().st_uid == 12345


def test_a_lock_it_did_not_create_keeps_its_mode_and_still_excludes(folder):
    lock = planted(folder, 0o444 if os.geteuid() == 0 else 0o644)
    with machinelock.held(lock, HOLDER, [].append):
        # it still excludes: a second descriptor cannot take it meanwhile
        other = os.open(lock, os.O_RDONLY)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(other)
    assert mode(lock) == (0o444 if os.geteuid() == 0 else 0o644)


def test_the_default_lock_is_in_a_folder_of_this_users_own():
    path = machinelock.lock_path({}, uid=4321)
    assert path == machinelock.Path("/tmp/ddpscale-4321") / LOCK_NAME


def test_a_folder_planted_in_this_users_name_is_refused(tmp_path, victim):
    link = tmp_path / "planted"
    link.symlink_to(victim.parent)
    said = hold(link / LOCK_NAME)
    assert "is a symbolic link" in said[0] and not (victim.parent / LOCK_NAME).exists()
    assert machinelock.folder_problem(stat.S_IFDIR | 0o755, owner=12345, me=1000) == \
        "belongs to another user (uid 12345)"
    assert machinelock.folder_problem(stat.S_IFDIR | 0o700, owner=1000, me=1000) is None


@pytest.mark.timeout(60)
@pytest.mark.skipif(not os.path.exists("/proc/locks"), reason="the kernel names lock holders in /proc/locks")
def test_a_waiting_launcher_names_the_holder_the_kernel_names_not_a_stale_line(folder):
    """A holder that could not write its line (another user's file) leaves the last one there:
    the waiting launcher shows the pid that really holds it."""
    lock = folder / LOCK_NAME
    lock.write_text("topology 2x2 in /gone (pid 1), training since yesterday")
    first = os.open(lock, os.O_RDONLY)
    fcntl.flock(first, fcntl.LOCK_EX)
    said, waiting = [], threading.Event()

    def say(line):
        said.append(line)
        waiting.set()

    def second():
        with machinelock.held(lock, HOLDER, say):
            pass

    thread = threading.Thread(target=second)
    thread.start()
    try:
        assert waiting.wait(timeout=50), "the second holder never said it waits"
    finally:
        os.close(first)  # releases the flock: the second takes it
        thread.join(timeout=50)
    assert not thread.is_alive()
    assert f"holds this machine: pid {os.getpid()} of user " in said[0] and "/gone" not in said[0]
    assert "training starts" in said[1]


def test_lock_holders_reads_proc_locks_and_leaves_waiters_out():
    text = ("1: POSIX  ADVISORY  WRITE 700 fe:00:99 0 EOF\n"
            "2: FLOCK  ADVISORY  WRITE 9924 fe:00:2499123 0 EOF\n"
            "2: -> FLOCK  ADVISORY  WRITE 9925 fe:00:2499123 0 EOF\n"
            "3: FLOCK  ADVISORY  WRITE 11 00:2e:12499123 0 EOF\n")
    assert machinelock.lock_holders(text, 2499123) == [9924]
    assert machinelock.lock_holders(text, 99) == []  # a POSIX lock is not ours
    assert machinelock.lock_holders("", 1) == []


def test_the_waiting_line_shows_the_files_line_where_it_names_the_holder():
    assert "holds this machine: topology 1x2 in /x (pid 5)" in machinelock.waiting_line("topology 1x2 in /x (pid 5)", [5])
    assert "holds this machine: pid 6 of user ann;" in machinelock.waiting_line("topology 1x2 in /x (pid 5)", [6],
                                                                               {6: "ann"})
    assert "holds this machine: pid 6;" in machinelock.waiting_line("\x1b[2J", [6])
    # no kernel word (not Linux): the file's line, as before
    assert "holds this machine: topology 1x2 in /x (pid 5)" in machinelock.waiting_line("topology 1x2 in /x (pid 5)")
