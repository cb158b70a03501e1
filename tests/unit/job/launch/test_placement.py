"""Each rank owns its GPU, and rank 0's port is not another job's.

The records are shaped as ddpscale.job.launch.ranks gathers them on a real node; no GPU is
needed to check them.
"""
import os
import socket
import subprocess
import sys

import pytest

from ddpscale.job.launch.placement import PORT_HIGH, PORT_LOW, PlacementError, check, master_port, summary
from ddpscale.job.launch.ranks import PlacementCheck, launcher_rank, own_record

from helpers.workflow import ROOT

UUIDS = ["GPU-5f2c6a1e-0b7d-4c55-9f0e-1a2b3c4d5e60", "GPU-8e1d2f3a-4b5c-6d7e-8f90-a1b2c3d4e5f6",
         "GPU-0a9b8c7d-6e5f-4a3b-2c1d-0e9f8a7b6c5d", "GPU-1f2e3d4c-5b6a-4978-8695-a4b3c2d1e0f9"]


def gpu_rank(rank, local_rank, node_rank=0, host="gilbreth-k012", visible="0,1,2,3", uuid=None):
    """One rank as srun starts it on a 4-GPU node: it sees every GPU, trains on cuda:local_rank."""
    return {"rank": rank, "node_rank": node_rank, "local_rank": local_rank, "host": host,
            "cuda_visible_devices": visible, "gpus_visible": len(visible.split(",")),
            "device": f"cuda:{local_rank}", "gpu_uuid": uuid or UUIDS[local_rank],
            "master_addr": "gilbreth-k012", "master_port": "21234"}


def test_four_ranks_on_four_gpus_pass():
    records = [gpu_rank(r, r) for r in range(4)]
    check(records, 4)
    assert summary(records)["gpu_per_rank"] is True


def test_two_nodes_may_report_the_same_index():
    # cuda:0 on two hosts is two GPUs: different UUIDs
    records = [gpu_rank(0, 0), gpu_rank(1, 0, node_rank=1, host="gilbreth-k013", uuid=UUIDS[3])]
    check(records, 1)


def test_two_ranks_on_one_gpu_fail_naming_both():
    """A site that lists each task's own GPU first (rank 1 sees "1,0"): Lightning gives local
    rank 1 the second GPU it sees, GPU 0, which rank 0 trains on too."""
    records = [gpu_rank(0, 0, visible="0,1"), gpu_rank(1, 1, visible="1,0", uuid=UUIDS[0])]
    with pytest.raises(PlacementError) as err:
        check(records, 2)
    message = str(err.value)
    assert message.startswith("rank 0 (node 0 gilbreth-k012, local rank 0, CUDA_VISIBLE_DEVICES=0,1) and "
                              "rank 1 (node 0 gilbreth-k012, local rank 1, CUDA_VISIBLE_DEVICES=1,0) "
                              f"share GPU {UUIDS[0]} on gilbreth-k012. ")
    assert "SLURM_GPU_BIND=none" in message


def test_rank_that_sees_too_few_gpus_fails_naming_it():
    """--gpus-per-task=1 / --gpu-bind=single: each rank sees only its own GPU, but Lightning
    (devices=4) asks every rank for all four and gives local rank 2 the third."""
    records = [gpu_rank(r, r, visible=str(r), uuid=UUIDS[r]) for r in range(4)]
    with pytest.raises(PlacementError) as err:
        check(records, 4)
    assert "rank 2 (node 0 gilbreth-k012, local rank 2, CUDA_VISIBLE_DEVICES=2) sees 1 GPU(s) but needs 4" in str(err.value)
    assert "\n" not in str(err.value)


def test_cpu_run_records_that_no_gpu_is_used():
    mine = own_record(None, {"rank": 0, "node_rank": 0, "local_rank": 0})
    assert mine["device"] == "cpu" and mine["gpu_uuid"] is None
    check([mine, {**mine, "rank": 1, "local_rank": 1}], 2)
    assert summary([mine])["gpu_per_rank"] is False


def test_gpu_count_is_checked_before_the_trainer(monkeypatch):
    """Without GPUs a GPU run stops in the callback, naming the rank as srun set it."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # no GPU on this machine
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setenv("SLURM_PROCID", "5")
    monkeypatch.setenv("SLURM_LOCALID", "1")
    monkeypatch.setenv("SLURM_NODEID", "1")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert launcher_rank() == {"rank": 5, "node_rank": 1, "local_rank": 1}
    with pytest.raises(PlacementError, match=r"^rank 5 \(node 1 .*local rank 1, CUDA_VISIBLE_DEVICES=1\) "
                                             r"sees 1 GPU\(s\) but needs 2"):
        PlacementCheck("auto", 2)
    PlacementCheck("cpu", 2)  # a CPU run needs no GPU


# --- rank 0's port (item 8) ---

def test_jobs_running_together_start_from_different_ports():
    ports = {master_port(job_id, lambda port: True) for job_id in range(5_000_000, 5_000_100)}
    assert len(ports) == 100
    assert all(PORT_LOW <= p <= PORT_HIGH for p in ports)
    # Lightning's own default (last 4 digits + 15000) gives jobs 10000 apart one port
    assert master_port(5_001_234, lambda p: True) != master_port(5_011_234, lambda p: True)


def test_a_taken_port_is_skipped():
    first = master_port(42, lambda p: True)
    assert master_port(42, lambda p: p not in (first, first + 1)) == first + 2
    assert master_port(PORT_HIGH - PORT_LOW, lambda p: p != PORT_HIGH) == PORT_LOW  # wraps round
    with pytest.raises(PlacementError, match="no free port"):
        master_port(42, lambda p: False)


def test_master_port_script_avoids_a_port_in_use():
    """The real script on this host: the port its job id maps to is held by another process."""
    env = {**os.environ, "SLURM_JOB_ID": "777", "PYTHONPATH": str(ROOT / "scripts")}
    script = [sys.executable, str(ROOT / "scripts/master_port.py")]
    free = int(subprocess.run(script, env=env, capture_output=True, text=True, check=True).stdout)
    with socket.socket() as held:
        held.bind(("", free))
        held.listen()
        again = int(subprocess.run(script, env=env, capture_output=True, text=True, check=True).stdout)
    assert again != free and PORT_LOW <= again <= PORT_HIGH


def test_master_port_script_outside_slurm_says_so():
    env = {k: v for k, v in os.environ.items() if k != "SLURM_JOB_ID"}
    proc = subprocess.run([sys.executable, str(ROOT / "scripts/master_port.py")], env=env,
                          capture_output=True, text=True)
    assert proc.returncode != 0 and proc.stderr.strip().startswith("ddpscale master_port: SLURM_JOB_ID is not set")
