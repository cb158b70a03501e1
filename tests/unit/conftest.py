"""Fixtures several unit test files share: the working directory moved to tmp_path, a gloo
group of one rank in this process, and the fixtures' user modules importable."""

from __future__ import annotations

import os
import socket

import pytest
import torch.distributed as dist

from helpers.workflow import ROOT


@pytest.fixture
def in_tmp(tmp_path):
    old = os.getcwd()
    os.chdir(tmp_path)
    yield tmp_path
    os.chdir(old)


@pytest.fixture
def one_rank_group(monkeypatch):
    """A gloo group of one rank in this process: DDP can wrap a module."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    dist.init_process_group("gloo", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.fixture
def usermods(monkeypatch, tmp_path):
    """The fixtures' user modules, importable as the workflow imports them; Lightning's default
    checkpoint folder in tmp_path."""
    monkeypatch.syspath_prepend(str(ROOT / "tests/fixtures"))
    monkeypatch.chdir(tmp_path)
    import usermods.cnn
    import usermods.imagedata
    import usermods.manual
    import usermods.unprobeable

    return usermods
