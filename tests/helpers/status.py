"""`make status` (scripts/status.py) in a folder: the command run there, a results tree written
for it (configs, records, a crashed run's log, a lock) and the progress line a run logs."""

from __future__ import annotations

import json
import subprocess
import sys

import yaml

from ddpscale.core import record as run_record
from helpers.records import make_run
from helpers.workflow import ROOT


STATUS = ROOT / "scripts/status.py"
NOW = 1_700_000_000.0


def progress_line(epoch, max_epochs, epoch_s, throughput, fit_s, at, attempt=1) -> str:
    return run_record.progress_line(run_record.Progress(epoch, max_epochs, epoch_s, throughput, attempt, fit_s, at))


def run_status(cwd, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(STATUS), *args], cwd=cwd, capture_output=True, text=True, timeout=60)


def write_tree(root, *, lock: bool) -> None:
    (root / "config").mkdir()
    (root / "config/config.yaml").write_text(yaml.safe_dump(
        {"topologies": ["1x1", "1x2", "2x1"], "baseline": "1x1", "repeats": 1, "max_epochs": 3}))
    (root / "config/more.yaml").write_text(yaml.safe_dump({"repeats": 2}))
    for (topology, repeat), thr, world in [(("1x1", 0), 100.0, 1), (("1x1", 1), 110.0, 1), (("1x2", 0), 189.0, 2)]:
        path = root / f"out/runs/{topology}/r{repeat}/metrics.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(make_run(topology, repeat=repeat, throughput_samples_s=thr, fit_time_s=12.5)))
    log = root / "out/logs/train/2x1/r0.log"
    log.parent.mkdir(parents=True)
    log.write_text(progress_line(1, 3, 1.0, 90.0, 1.0, NOW) + "\nTraceback (most recent call last):\n"
                   "RuntimeError: rank 1 exited with signal 9\n\n")
    if lock:
        (root / ".snakemake/locks").mkdir(parents=True)
        (root / ".snakemake/locks/0.input.lock").write_text("x\n")
    (root / "profiles/local").mkdir(parents=True)
    (root / "profiles/local/config.yaml").write_text("cores: 1\n")


def status_of(path) -> str:
    done = subprocess.run([sys.executable, str(ROOT / "scripts/status.py")], cwd=path, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout
