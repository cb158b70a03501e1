"""Two experiments on one machine train one after the other (ddpscale.job.launch.machinelock).

Real launchers (scripts/launch_local.py, as the local profile starts every run) in processes
of their own, sharing one lock folder as two snakemake processes on one machine do. The ranks
are a script that says when it starts and, for the first launcher, waits for the test's word
to end: the test waits for states, never for seconds.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.workflow import ROOT
from ddpscale.job.launch import machinelock

RANK = '''
import os, sys, time
from pathlib import Path
folder = Path(sys.argv[1])
(folder / f"{sys.argv[2]}-started-{os.environ['RANK']}").write_text(str(time.time()))
while sys.argv[2] == "first" and not (folder / "release").exists():
    time.sleep(0.05)
(folder / f"{sys.argv[2]}-ended-{os.environ['RANK']}").write_text(str(time.time()))
'''


def launch(name: str, folder: Path, lock_dir: Path) -> tuple[subprocess.Popen, Path]:
    log = folder / f"{name}.log"
    env = {**os.environ, machinelock.LOCK_DIR_ENV: str(lock_dir)}
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "scripts/launch_local.py"), "--nodes", "1", "--procs-per-node", "2", "--",
         sys.executable, str(folder / "rank.py"), str(folder), name],
        cwd=folder, env={**env, "PYTHONPATH": str(ROOT / "scripts")}, stdout=log.open("w"), stderr=subprocess.STDOUT)
    return proc, log


def wait_until(done, procs, what: str, timeout: float = 120) -> None:
    """Poll for a state; a launcher that ends first, or no state in time, fails with its logs."""
    deadline = time.monotonic() + timeout
    while not done():
        if any(proc.poll() is not None for proc, _ in procs) or time.monotonic() > deadline:
            logs = "\n".join(log.read_text() for _, log in procs)
            pytest.fail(f"waiting for {what}:\n{logs}")
        time.sleep(0.05)


def test_a_second_experiment_waits_for_the_first_to_end(tmp_path):
    (tmp_path / "rank.py").write_text(RANK)
    lock_dir = tmp_path / "lock"
    lock_dir.mkdir()
    first = launch("first", tmp_path, lock_dir)
    try:
        wait_until(lambda: len(list(tmp_path.glob("first-started-*"))) == 2, [first], "the first run's two ranks")
        second = launch("second", tmp_path, lock_dir)
        # which comes first: the second saying it waits (the lock) or its ranks starting (no lock)
        wait_until(lambda: "waiting for it to end" in second[1].read_text() or any(tmp_path.glob("second-started-*")),
                   [first, second], "the second launcher to wait or to start")
        assert not list(tmp_path.glob("second-started-*")), "the second experiment trained beside the first"
        said = second[1].read_text()
        assert "another ddpscale training holds this machine: topology 1x2 in " in said
        assert f"(pid {first[0].pid})" in said
        (tmp_path / "release").write_text("")
        assert first[0].wait(timeout=120) == 0
        assert second[0].wait(timeout=120) == 0
    finally:
        for proc, _ in (first, *([second] if "second" in locals() else [])):
            if proc.poll() is None:
                proc.kill()
    first_ended = max(float(p.read_text()) for p in tmp_path.glob("first-ended-*"))
    second_started = min(float(p.read_text()) for p in tmp_path.glob("second-started-*"))
    assert second_started >= first_ended
    assert "training starts" in second[1].read_text()


def test_a_lock_file_left_by_a_killed_launcher_does_not_block(tmp_path):
    (tmp_path / "rank.py").write_text(RANK.replace('sys.argv[2] == "first"', "False"))
    lock_dir = tmp_path / "lock"
    lock_dir.mkdir()
    (lock_dir / machinelock.LOCK_NAME).write_text("topology 2x2 in /gone (pid 1), training since yesterday")
    proc, log = launch("first", tmp_path, lock_dir)
    assert proc.wait(timeout=120) == 0, log.read_text()
    assert "waiting" not in log.read_text()
    # the lock file names the run that held it last, for the next one to show
    assert (lock_dir / machinelock.LOCK_NAME).read_text().startswith("topology 1x2 in ")


def test_the_waiting_line_shows_no_control_characters():
    line = machinelock.waiting_line("topology 1x2 in /home/x\x1b[2J\rfake (pid 3)\n")
    assert "\x1b" not in line and "\r" not in line and "\n" not in line
    assert "topology 1x2 in /home/x\\x1b[2J\\rfake (pid 3)" in line
    assert "a run that has not yet said what it is" in machinelock.waiting_line("")
