"""Debian packages some tests need (chromium, g++): found on PATH or installed with apt.

We are root on CI, where apt works after `apt-get update`, so a missing tool is installed
rather than skipped; elsewhere the error names the fix.
"""

from __future__ import annotations

import fcntl
import functools
import os
import shutil
import subprocess


# Two pytest workers, or a worker and tests/slurm/minicluster.sh, may install at once: apt takes
# dpkg's lock without waiting, so the second install failed and its tests were skipped. Every
# install of the suite takes this lock first (minicluster.sh too); the timeout waits for any other.
APT_LOCK = "/var/lock/ddpscale-apt.lock"
APT = "apt-get -o DPkg::Lock::Timeout=600"


class ToolUnavailable(RuntimeError):
    """Not on PATH and could not be installed; the message names the fix."""


@functools.cache  # only successes are cached: a failed install is tried again next call
def ensure(commands: tuple[str, ...], package: str) -> str:
    """The path of the first of `commands` on PATH, installing Debian `package` if none is."""
    def found():
        return next((path for path in map(shutil.which, commands) if path), None)

    fix = f"apt-get install {package}"
    if found():
        return found()
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise ToolUnavailable(f"no {commands[0]} on PATH and cannot install it here (needs root and apt); fix: {fix}")
    with open(APT_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if found():  # the other worker installed it meanwhile
            return found()
        install = subprocess.run(
            f"{APT} update -q && {APT} install -y -q {package}", shell=True,
            capture_output=True, text=True, timeout=900,
            env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    if not found():
        raise ToolUnavailable(f"installing {package} failed (rc {install.returncode}); fix: {fix}\n"
                              f"{(install.stdout + install.stderr)[-1500:]}")
    return found()


def require(commands: tuple[str, ...], package: str) -> str:
    """ensure() for a test: a skip that names the fix, but a failure under CI=true, which must
    run every test (as tests/slurm/test_slurm.py does for SLURM)."""
    import pytest

    try:
        return ensure(commands, package)
    except ToolUnavailable as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run this test, but: {exc}")
        pytest.skip(str(exc))
