"""make setup's interpreter check (scripts/setup_python.sh): the fix named in one line, and no
apt where apt cannot work (a login node: no root, or a Python that is not the system's)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.workflow import ROOT

SCRIPT = ROOT / "scripts/setup_python.sh"


def fake(bin_dir: Path, name: str, text: str) -> Path:
    path = bin_dir / name
    path.write_text("#!/bin/bash\n" + text)
    path.chmod(0o755)
    return path


def fake_python(bin_dir: Path, version: str, has_venv: bool) -> Path:
    # answers the script's three questions the way a Python of that version would
    major, minor = version.split(".")
    old = int(major) < 3 or (int(major) == 3 and int(minor) < 11)
    return fake(bin_dir, f"python{version}", f"""
case "$2" in
  *sys.version_info\\[:2\\]*) echo {version} ;;
  *"sys.exit(sys.version_info < (3, 11))"*) exit {1 if old else 0} ;;
  *"import ensurepip, venv"*) exit {0 if has_venv else 1} ;;
esac
""")


def run(tmp_path, python, uid="1000"):
    """The script with fake apt-get (records its calls) and id (the user) on PATH."""
    bin_dir = tmp_path / "bin"
    calls = tmp_path / "apt-calls"
    fake(bin_dir, "apt-get", f'echo "$*" >> {calls}\n')
    fake(bin_dir, "id", f"echo {uid}\n")
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    proc = subprocess.run(["bash", str(SCRIPT), str(python)], capture_output=True, text=True, env=env, timeout=60)
    return proc, calls.read_text() if calls.exists() else ""


@pytest.fixture
def bin_dir(tmp_path):
    (tmp_path / "bin").mkdir()
    return tmp_path / "bin"


def test_an_old_python_is_refused_naming_the_fix_before_anything_is_installed(tmp_path, bin_dir):
    proc, apt = run(tmp_path, fake_python(bin_dir, "3.9", has_venv=True), uid="0")
    assert proc.returncode == 1
    line = proc.stderr.strip()
    assert "\n" not in line
    assert "is Python 3.9; snakemake 9 and its SLURM plugin need 3.11 or newer" in line
    assert "module load python/3.11" in line and "make setup PYTHON=/path/to/python3.11" in line
    assert apt == ""


def test_no_apt_for_a_python_without_venv_on_a_login_node(tmp_path, bin_dir):
    # not root: apt cannot work, so the message says what to do instead
    proc, apt = run(tmp_path, fake_python(bin_dir, "3.12", has_venv=False), uid="1000")
    assert proc.returncode == 1
    assert "has no venv module" in proc.stderr and "make setup PYTHON=" in proc.stderr
    assert apt == ""
    # root, but a Python outside /usr/bin (a module's, a conda one): apt would install the
    # system's venv, not this Python's
    proc, apt = run(tmp_path, fake_python(bin_dir, "3.12", has_venv=False), uid="0")
    assert proc.returncode == 1 and apt == ""


def test_a_missing_interpreter_is_named(tmp_path, bin_dir):
    proc, _ = run(tmp_path, "python3.99-not-here")
    assert proc.returncode == 1
    assert "no 'python3.99-not-here' found" in proc.stderr


def test_this_python_passes():
    proc = subprocess.run(["bash", str(SCRIPT), sys.executable], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
