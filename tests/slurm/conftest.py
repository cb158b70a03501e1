"""The throwaway SLURM cluster (tests/slurm/minicluster.sh) as fixtures: one per session for
every test that asks for it, brought up for each test or the test skipped."""

from __future__ import annotations

import fcntl
import os
import subprocess
import time

import pytest

from helpers.slurm import MINICLUSTER


def _up() -> str | None:
    """minicluster.sh up (a no-op when it is up and healthy); why not, or None."""
    if os.geteuid() != 0:
        return "the throwaway SLURM cluster needs root (it installs slurm-wlm and writes /etc/slurm)"
    start = time.monotonic()
    up = subprocess.run(["bash", str(MINICLUSTER), "up"], capture_output=True, text=True, timeout=600)
    if up.returncode != 0:
        return f"minicluster.sh up failed: {(up.stdout + up.stderr)[-1500:]}"
    if "already up" not in up.stdout:
        print(f"\nSLURM test cluster up in {time.monotonic() - start:.1f} s")
    return None


@pytest.fixture(scope="session")
def _slurm_session():
    """One cluster serves one pytest session at a time: a second session waits on the lock,
    else its teardown would stop the daemons under the first one's jobs. Down at the end."""
    lock = open("/tmp/ddpscale-slurm-tests.lock", "w")
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
        yield
    finally:
        subprocess.run(["bash", str(MINICLUSTER), "down"], capture_output=True, timeout=120)
        lock.close()


@pytest.fixture
def slurm_cluster(_slurm_session):
    """The cluster, up for this test; skip where it cannot come up, except under CI=true.

    Checked per test (about 0.1 s when it is up): tests/slurm/test_netns.py takes the cluster down to
    have the node namespaces to itself, whatever order the tests run in."""
    reason = _up()
    if reason:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the SLURM tests, but: {reason}")
        pytest.skip(reason)
