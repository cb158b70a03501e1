"""A GPU run that torch cannot give a GPU stops at start, in one line.

CI has no GPU: the end-to-end tests run train.py in the cluster mode (--accelerator gpu, as the
SLURM profiles now pass) with this machine's real CPU-only torch, where CUDA is unavailable, and
check the exit and the line; the local profile still trains on the CPU.
"""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from ddpscale.plan.site.resources import Site, run_accelerator
from ddpscale.job.device.gpu import NO_DRIVER, driver_text, stop_line

from helpers.profiles import dry_run, profile_site, train_jobs
from helpers.training import launched, throughput
from helpers.workflow import ROOT

# Texts as the tools print them. torch's CUDA init error and its warning:
# "The NVIDIA driver on your system is too old (found version 11040). Please update your GPU
# driver ..." (issues lllyasviel/Fooocus#1313, weaviate/Verba#72, pytorch/pytorch#162531);
# Verba#72 shows the same node's /proc/driver/nvidia/version line and nvidia-smi's driver 470.
TOO_OLD = ("The NVIDIA driver on your system is too old (found version 11040). Please update your GPU driver "
           "by downloading and installing a new version from the URL: http://www.nvidia.com/Download/index.aspx")
PROC = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  470.223.02  Sat Oct  7 15:39:11 UTC 2023\n"
NO_DRIVER_ERROR = ("Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU and "
                   "installed a driver from http://www.nvidia.com/Download/index.aspx")


@pytest.mark.parametrize("init_error, smi, proc, expected", [
    (TOO_OLD, "470.223.02\n", None, "driver 470.223.02, which supports CUDA up to 11.4"),
    (TOO_OLD, None, PROC, "driver 470.223.02, which supports CUDA up to 11.4"),
    (TOO_OLD, None, None, "a driver that supports CUDA up to 11.4"),
    (None, None, PROC, "driver 470.223.02"),
    (NO_DRIVER_ERROR, None, None, NO_DRIVER),
    (None, None, None, NO_DRIVER),
    # nvidia-smi printing an error instead of a version is not a version
    (None, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n", None, NO_DRIVER),
])
def test_the_driver_is_named_from_the_best_source(init_error, smi, proc, expected):
    assert driver_text(init_error, smi, proc) == expected


def test_a_gpu_run_without_a_cuda_device_stops_with_torch_and_driver_and_fix():
    old = stop_line("gpu", 0, "2.13.0+cu128", "12.8", driver_text(TOO_OLD, "470.223.02", None), "node7")
    assert old.startswith("accelerator gpu, but torch 2.13.0+cu128 sees no CUDA device on node7: torch built for "
                          "CUDA 12.8, driver 470.223.02, which supports CUDA up to 11.4. Fix: install a torch built")
    assert "module load" in old and "\n" not in old
    cpu_build = stop_line("gpu", 0, "2.13.0+cpu", None, NO_DRIVER, "node7")
    assert "a CPU-only build of torch, no NVIDIA driver found" in cpu_build and "install a CUDA build of torch" in cpu_build
    no_driver = stop_line("gpu", 0, "2.13.0+cu128", "12.8", NO_DRIVER, "node7")
    assert "partition has GPUs" in no_driver
    hidden = stop_line("gpu", 0, "2.13.0+cu128", "12.8", "driver 550.54.15", "node7", visible_devices="")
    assert "CUDA_VISIBLE_DEVICES is empty" in hidden


@pytest.mark.parametrize("accelerator, count", [("gpu", 1), ("cpu", 0), ("auto", 0)])
def test_a_run_with_a_gpu_or_not_asking_for_one_goes_on(accelerator, count):
    assert stop_line(accelerator, count, "2.13.0", None, NO_DRIVER, "h") is None


def test_a_cluster_run_asks_for_the_gpu_unless_the_config_says_cpu():
    cluster, local = Site(launcher="srun", gpus_per_node=4), Site()
    assert run_accelerator("auto", cluster) == "gpu"
    assert run_accelerator("gpu", cluster) == "gpu"
    assert run_accelerator("cpu", cluster) == "cpu"  # a test cluster without GPUs, chosen in the config
    assert run_accelerator("cpu", local) == "cpu" and run_accelerator("gpu", local) == "gpu"


def train_command(tmp_path, nodes: int, devices: int, accelerator: str) -> list[str]:
    # the data file does not exist: a run that got as far as its data would say so instead
    train = [sys.executable, str(ROOT / "scripts/train.py"), "--topology", f"{nodes}x{devices}",
             "--num-nodes", str(nodes), "--devices-per-node", str(devices), *throughput(), "--accelerator", accelerator,
             "--cluster-env", "local", "--max-epochs", "2", "--scaling", "weak", "--batch-size", "32",
             "--model-class", "ddpscale.workloads.models.SpiralMLP",
             "--data-class", "ddpscale.workloads.spiral_datamodule.SpiralDataModule",
             "--data-file", str(tmp_path / "absent.npz"),
             "--ckpt-dir", str(tmp_path / "ckpt"), "--metrics", str(tmp_path / "metrics.json")]
    return launched(train, nodes, devices)


@pytest.mark.timeout(120)
@pytest.mark.skipif(torch.cuda.is_available(), reason="needs torch without a CUDA device; this machine has one")
def test_train_in_the_cluster_mode_stops_before_any_group_or_data_on_cpu_only_torch(tmp_path):
    done = subprocess.run(train_command(tmp_path, 1, 2, "gpu"), capture_output=True, text=True, timeout=100, cwd=ROOT)
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if line.startswith("ddpscale train:")]
    # one line per rank, each naming torch's CUDA, the driver and the fix
    assert len(lines) == 2, done.stderr[-3000:]
    cuda = "a CPU-only build of torch" if torch.version.cuda is None else f"torch built for CUDA {torch.version.cuda}"
    for line in lines:
        assert f"accelerator gpu, but torch {torch.__version__} sees no CUDA device" in line
        assert cuda in line and ". Fix: " in line
    # stopped before the data was read and before rank 0 stamped its checkpoint folder
    assert "absent.npz" not in done.stderr and not (tmp_path / "ckpt").exists()
    assert not (tmp_path / "metrics.json").exists()


def test_cluster_dry_runs_pass_the_gpu_accelerator_and_the_local_profile_cpu():
    for profile in ("gilbreth", "raven", "slurm", "local"):
        gpus = profile_site(profile).gpus_per_node or 2
        rc, output = dry_run(profile, ["1x1", f"2x{gpus}"])
        assert rc == 0, output
        jobs = train_jobs(output)
        expected = "cpu" if profile == "local" else "gpu"  # no visible GPU here: the local profile simulates
        for name, (_, shell) in jobs.items():
            assert f" --accelerator={expected} " in shell, (profile, name, shell)
