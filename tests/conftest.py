"""Fixtures and hooks every test folder shares: a throwaway copy of the workflow, a small
dataset, no inherited rank variables, each worker's machine lock, and the order tests run in."""

from __future__ import annotations

import atexit
import shutil
import tempfile

import pytest

from helpers.training import clean_distributed_env
from helpers.workflow import Workspace

# The suite's workers train at once on purpose (its time budget): each gets a machine lock of
# its own (ddpscale.job.launch.machinelock), or one worker's runs would wait for another's.
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


@pytest.fixture(scope="module")
def data_file(tmp_path_factory) -> str:
    """A small spiral dataset, written as prepare_data writes it, shared by a test module."""
    from ddpscale.core.spiral import write_dataset

    folder = tmp_path_factory.mktemp("data")
    write_dataset(str(folder / "data.npz"), str(folder / "manifest.json"), 1200, 0.2, 7, [0.7, 0.15, 0.15])
    return str(folder / "data.npz")


@pytest.fixture
def workspace(tmp_path) -> Workspace:
    return Workspace(tmp_path / "ws")
