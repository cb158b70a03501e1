"""The workflow as the tests run it: the repository (ROOT), the snakemake command and the
workflow's Python, a throwaway copy of the workflow (Workspace) with the shipped config shrunk
to seconds (tiny_config), and the jobs a run's output counts."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))  # pytest.ini's pythonpath comes after conftest imports
from ddpscale.plan.workflowplan import snakemake_command, workflow_python  # noqa: E402


# The console script, as README and `make run` start the workflow. `python -m snakemake` puts
# the working directory on sys.path and so hid that the console script did not find a user
# module at the repository root: every test runs the console script where
# there is one. A GPU node's shared Python has none, and its GPU tests must still collect.
SNAKEMAKE = snakemake_command() or [sys.executable, "-m", "snakemake"]
WORKFLOW_PYTHON = workflow_python(SNAKEMAKE)


def tiny_config(**overrides) -> dict:
    """The shipped config, shrunk so a whole workflow runs in seconds."""
    config = yaml.safe_load((ROOT / "config/config.yaml").read_text())
    # one run per topology (repeats: auto is 3 on a cluster, where runs measure throughput);
    # a test that needs a run to last (a kill, a time limit, a status while running) sets measure: full
    config.update(topologies=["1x1", "1x2"], max_epochs=2, repeats=1)
    config["dataset"]["samples"] = 1200
    config.update(overrides)
    return config


class Workspace:
    """A copy of the workflow in a temporary folder, so tests never touch results/ here."""

    def __init__(self, path: Path):
        self.path = path
        for name in ("workflow", "scripts", "profiles", "config"):
            shutil.copytree(ROOT / name, path / name, ignore=shutil.ignore_patterns("__pycache__"))

    def write_config(self, config: dict) -> Path:
        target = self.path / "config/config.yaml"
        target.write_text(yaml.safe_dump(config, sort_keys=False))
        return target

    def snakemake(self, *args, timeout: int = 240, env: dict | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*SNAKEMAKE, "--profile", "profiles/local", *args], cwd=self.path,
            capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})},
        )

    @property
    def results(self) -> Path:
        """The folder the workspace's config/config.yaml writes to: results/<experiment>/ with
        data/, runs/, logs/, checkpoints/ and report/ (ddpscale.core.layout)."""
        from ddpscale.core.layout import layout

        return self.path / layout(yaml.safe_load((self.path / "config/config.yaml").read_text())).root

    def metrics(self, topology: str, repeat: int = 0) -> Path:
        return self.results / f"runs/{topology}/r{repeat}/metrics.json"

    def start_until_checkpoint(self, topology: str, timeout: float = 300) -> subprocess.Popen:
        """The local workflow started in the background, returned once `topology`'s run has
        written its first checkpoint (so a kill now leaves something to resume)."""
        proc = subprocess.Popen([*SNAKEMAKE, "--profile", "profiles/local"], cwd=self.path,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        last = self.results / f"checkpoints/{topology}/r0/last.ckpt"
        deadline = time.monotonic() + timeout
        while not last.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert last.exists(), f"no {topology} checkpoint before the run ended"
        return proc


def job_counts(stdout_and_err: str) -> dict[str, int]:
    """Snakemake's 'Job stats' table of the run: rule -> number of jobs."""
    table = stdout_and_err.split("Job stats:")[1].split("total")[0]
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M)}
