"""Shared fixtures: a throwaway copy of the workflow, and helpers to run it for real."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))  # pytest.ini's pythonpath comes after conftest imports
from ddpscale.plan.workflowplan import snakemake_command, workflow_python  # noqa: E402

# The console script, as README and `make run` start the workflow. `python -m snakemake` puts
# the working directory on sys.path and so hid that the console script did not find a user
# module at the repository root: every test runs the console script where
# there is one. A GPU node's shared Python has none, and its GPU tests must still collect.
SNAKEMAKE = snakemake_command() or [sys.executable, "-m", "snakemake"]
WORKFLOW_PYTHON = workflow_python(SNAKEMAKE)


def clean_distributed_env(monkeypatch) -> None:
    """Drop rank and SLURM variables: a test must not inherit them, nor leak its own."""
    for name in list(os.environ):
        if name.startswith(("SLURM_", "DDPSCALE_")) or name in (
            "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK",
        ):
            monkeypatch.delenv(name, raising=False)


# The suite's workers train at once on purpose (its time budget): each gets a machine lock of
# its own (ddpscale.job.machinelock), or one worker's runs would wait for another's.
_LOCK_DIR = tempfile.mkdtemp(prefix="ddpscale-lock-")
atexit.register(shutil.rmtree, _LOCK_DIR, True)


@pytest.fixture(autouse=True)
def _clean_distributed_env(monkeypatch):
    clean_distributed_env(monkeypatch)
    monkeypatch.setenv("DDPSCALE_LOCK_DIR", _LOCK_DIR)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    """Under pytest-xdist (`make test` runs `-n 3 --dist loadgroup`), every test of the throwaway
    SLURM cluster runs on one worker, one after another, while the other workers run the rest:
    they share the cluster's daemons and nodes, some read the whole queue, and test_netns.py
    takes the cluster down. Without xdist the mark does nothing.

    The longest first: the SLURM tests, then the slow ones, then the quick ones, which fill the
    workers' last minutes instead of a long test starting late on one worker while the others
    wait (in file order the slow workflow tests came last). Within each, file order."""
    for item in items:
        if _on_the_cluster(item):
            item.add_marker(pytest.mark.xdist_group("slurm-cluster"))
    items.sort(key=lambda item: 0 if _on_the_cluster(item) else 1 if item.get_closest_marker("slow") else 2)


def _on_the_cluster(item) -> bool:
    return bool(item.get_closest_marker("slurm") or item.get_closest_marker("network"))


def load_profile(name: str) -> dict:
    """A profile's config.yaml: a name under profiles/, or a folder relative to the repository."""
    folder = ROOT / name if "/" in name else ROOT / "profiles" / name
    return yaml.safe_load((folder / "config.yaml").read_text())


_PROFILE_COPIES = Path(tempfile.mkdtemp(prefix="ddpscale-profiles-"))
# the copies are read by snakemake subprocesses until the session ends; without this, each
# suite run left a score of folders in /tmp
atexit.register(shutil.rmtree, _PROFILE_COPIES, True)


def with_account(folder: str, account: str) -> str:
    """The profile folder with its placeholder account replaced, as a user edits it before the
    first run: a copy in a temporary folder, or the folder itself when it names no placeholder."""
    from ddpscale.plan.site.profile import PLACEHOLDERS

    profile = yaml.safe_load((ROOT / folder / "config.yaml").read_text())
    defaults = profile.get("default-resources") or {}
    if str(defaults.get("slurm_account")) not in PLACEHOLDERS["slurm_account"]:
        return folder
    defaults["slurm_account"] = account
    copy = Path(tempfile.mkdtemp(dir=_PROFILE_COPIES)) / Path(folder).name
    copy.mkdir()
    (copy / "config.yaml").write_text(yaml.safe_dump(profile, sort_keys=False))
    return str(copy)


def profile_site(name: str):
    from ddpscale.plan.site.resources import site_from_resources

    return site_from_resources(load_profile(name)["set-resources"]["train"])


def tiny_config(**overrides) -> dict:
    """The shipped config, shrunk so a whole workflow runs in seconds."""
    config = yaml.safe_load((ROOT / "config/config.yaml").read_text())
    # one run per topology (repeats: auto is 3 on a cluster, where runs measure throughput);
    # a test that needs a run to last (a kill, a time limit, a status while running) sets measure: full
    config.update(topologies=["1x1", "1x2"], max_epochs=2, repeats=1)
    config["dataset"]["samples"] = 1200
    config.update(overrides)
    return config


@pytest.fixture(scope="module")
def data_file(tmp_path_factory) -> str:
    """A small spiral dataset, written as prepare_data writes it, shared by a test module."""
    from ddpscale.plan.spiral import write_dataset

    folder = tmp_path_factory.mktemp("data")
    write_dataset(str(folder / "data.npz"), str(folder / "manifest.json"), 1200, 0.2, 7, [0.7, 0.15, 0.15])
    return str(folder / "data.npz")


def require_cuda():
    """torch, or a skip that says why: CI and this machine have no GPU."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU; this machine has none (CI never does)")
    return torch


def launched(command: list[str], nodes: int, devices: int) -> list[str]:
    """The command as the local profile starts it: alone for one rank, else under launch_local."""
    if nodes * devices == 1:
        return command
    return [sys.executable, str(ROOT / "scripts/launch_local.py"), "--nodes", str(nodes),
            "--procs-per-node", str(devices), "--", *command]


def run_user_module(tmp_path: Path, source: str, class_path: str, data_file: str, *flags: str,
                    nodes: int = 1, devices: int = 1, timeout: int = 280) -> subprocess.CompletedProcess:
    """train.py on the spiral data with a model module written to tmp_path as `source` (its file
    named by class_path's module) and imported from there, as a user's own module is; flags come
    last, so they override the defaults here (CPU, 2 epochs, weak scaling, batch 32 per device)."""
    (tmp_path / f"{class_path.partition('.')[0]}.py").write_text(source)
    train = [sys.executable, str(ROOT / "scripts/train.py"), "--topology", f"{nodes}x{devices}", "--nodes", str(nodes),
             "--devices", str(devices), "--accelerator", "cpu", "--max-epochs", "2", "--scaling", "weak",
             "--batch-size", "32", "--model-class", class_path,
             "--data-class", "ddpscale.workloads.spiral_datamodule.SpiralDataModule", "--data-file", data_file,
             "--ckpt-dir", str(tmp_path / "ckpt"), "--metrics", str(tmp_path / "metrics.json"), *flags]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT / "scripts")])}
    return subprocess.run(launched(train, nodes, devices), capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env=env)


def trained_on_one_and_two(tmp_path_factory, source: str, class_path: str, data_file: str,
                           *flags: str) -> dict[int, tuple[dict, str]]:
    """A user's module trained on 1x1 and on 1x2 (run_user_module, full mode, 3 epochs):
    {devices: (its metrics.json, what it printed)}."""
    out = {}
    for devices in (1, 2):
        folder = tmp_path_factory.mktemp(f"{class_path.partition('.')[0]}1x{devices}")
        done = run_user_module(folder, source, class_path, data_file, "--max-epochs", "3", "--measure", "full",
                               *flags, devices=devices)
        assert done.returncode == 0, done.stderr[-3000:]
        out[devices] = json.loads((folder / "metrics.json").read_text()), done.stdout + done.stderr
    return out


def assert_counted(m: dict, said: str, per_epoch: int) -> None:
    """Every epoch's samples counted once (per_epoch: the data module's true size), and the
    throughput those samples over the run's own steady train time."""
    assert m["samples_uncounted"] is None and "samples not counted" not in said
    assert m["samples_trained"] == per_epoch * m["epochs_completed"]
    steady = m["steady_epochs"]
    assert m["throughput_samples_s"] == pytest.approx(
        per_epoch * len(steady) / sum(m["train_times_s"][i] for i in steady), rel=1e-3)  # times kept to the us


def assert_speedup_of(runs: dict[int, tuple[dict, str]]) -> None:
    """The report of the 1x1 and 1x2 runs: 1x2's speedup is the ratio of their throughputs,
    and no row says its samples were not counted."""
    from test_projection import build

    summary = build([runs[1][0], runs[2][0]]).summary.set_index("topology")
    one, two = (runs[d][0]["throughput_samples_s"] for d in (1, 2))
    assert summary.loc["1x2", "speedup"] == pytest.approx(two / one, rel=2e-2)
    assert not any("samples not counted" in str(c) for c in summary["caveats"])


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


@pytest.fixture
def workspace(tmp_path) -> Workspace:
    return Workspace(tmp_path / "ws")


# The throwaway SLURM cluster, one per session for every module that asks for it (defined with
# the SLURM helpers; imported last, since slurmtools imports from this file).
from slurmtools import _slurm_session, slurm_cluster  # noqa: E402,F401
