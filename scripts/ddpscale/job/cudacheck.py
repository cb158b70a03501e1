"""A GPU run stops at start when torch sees no CUDA device.

With `accelerator: auto`, Lightning trains on the CPU without a word when the CUDA build of
torch cannot start on a node (its driver too old, no driver, a CPU-only wheel), and the report
would show a CPU benchmark of a GPU cluster. Cluster runs ask for the GPU explicitly (the
workflow passes --accelerator gpu), and this check turns the silent fallback into one line
naming torch's CUDA, the node's driver and the fix, before any process group or data exists.

stop_line and driver_text are pure (unit-tested with the texts torch, nvidia-smi and the
kernel module print); node_facts reads them on the node.
"""
from __future__ import annotations

import re
import shutil
import socket
import subprocess
from pathlib import Path

PROC_VERSION = Path("/proc/driver/nvidia/version")
NO_DRIVER = "no NVIDIA driver found"


class CudaUnavailable(RuntimeError):
    """The run asked for the GPU and torch sees none; the message says why and what to do."""


def _cuda_of(code: int) -> str:
    """CUDA's version code (11040, as the driver reports it) as '11.4'."""
    return f"{code // 1000}.{code % 1000 // 10}"


def driver_text(init_error: str | None, smi_output: str | None, proc_version: str | None) -> str:
    """What this node's NVIDIA driver is, from the best source there is.

    init_error: torch's CUDA initialisation error ("The NVIDIA driver on your system is too
    old (found version 11040)..."; 11040 is the newest CUDA the driver supports). smi_output:
    `nvidia-smi --query-gpu=driver_version --format=csv,noheader` ("470.223.02"). proc_version:
    /proc/driver/nvidia/version ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  470.223.02 ...").
    """
    version = None
    for line in (smi_output or "").splitlines():
        if re.fullmatch(r"\d+(\.\d+)+", line.strip()):
            version = line.strip()
            break
    if version is None and proc_version:
        found = re.search(r"Kernel Module\s+(\d+(?:\.\d+)+)", proc_version)
        version = found[1] if found else None
    supported = re.search(r"found version (\d+)", init_error or "")
    if version and supported:
        return f"driver {version}, which supports CUDA up to {_cuda_of(int(supported[1]))}"
    if version:
        return f"driver {version}"
    if supported:
        return f"a driver that supports CUDA up to {_cuda_of(int(supported[1]))}"
    if init_error and "no NVIDIA driver" in init_error:
        return NO_DRIVER
    return f"{NO_DRIVER} ({init_error})" if init_error else NO_DRIVER


def stop_line(accelerator: str, device_count: int, torch_version: str, torch_cuda: str | None,
              driver: str, host: str, visible_devices: str | None = None) -> str | None:
    """The one line that stops a GPU run torch cannot give a GPU, or None to go on.

    Only `gpu` is checked: `cpu` trains on the CPU by choice (the local profile's simulation),
    and the workflow never passes `auto` to a cluster run.
    """
    if accelerator != "gpu" or device_count > 0:
        return None
    build = "a CPU-only build of torch" if torch_cuda is None else f"torch built for CUDA {torch_cuda}"
    head = f"accelerator gpu, but torch {torch_version} sees no CUDA device on {host}: {build}, {driver}"
    if visible_devices is not None and not visible_devices.strip():
        fix = ("CUDA_VISIBLE_DEVICES is empty, so this rank was given no GPU: ask for GPUs "
               "(site_gpus_per_node, site_gpu_type in the profile) and do not clear the variable")
    elif torch_cuda is None:
        fix = ("install a CUDA build of torch into the environment the jobs run (pytorch.org lists "
               "one per CUDA version, e.g. pip install torch --index-url https://download.pytorch.org/whl/cu126), "
               "one the node's driver supports")
    elif driver.startswith(NO_DRIVER):
        fix = ("this node has no usable NVIDIA driver: check that the partition has GPUs "
               "(slurm_partition, site_gpu_type in the profile) and that the job asked for them")
    else:
        fix = ("install a torch built for a CUDA the driver supports (pytorch.org lists one per CUDA "
               "version), or load the site's newer CUDA/driver module before the run (module load ...)")
    return f"{head}. Fix: {fix}"


def _run(cmd: list[str]) -> str | None:
    if shutil.which(cmd[0]) is None:
        return None
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def node_facts(torch) -> dict:
    """What stop_line needs, read on this node (torch's CUDA initialised only when it failed)."""
    import os

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    init_error = None
    if count == 0 and torch.version.cuda is not None:
        try:
            torch.cuda.init()  # raises the reason is_available() only warned about
        except Exception as err:  # noqa: BLE001 - whatever torch raises is the reason we report
            init_error = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    proc = PROC_VERSION.read_text(errors="replace") if count == 0 and PROC_VERSION.exists() else None
    smi = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]) if count == 0 else None
    return {"device_count": count, "torch_version": torch.__version__, "torch_cuda": torch.version.cuda,
            "driver": driver_text(init_error, smi, proc), "host": socket.gethostname(),
            "visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}


def require_gpu(accelerator: str) -> None:
    """Raise CudaUnavailable when a GPU run's torch sees no GPU; nothing to do for cpu/auto."""
    if accelerator != "gpu":
        return
    import torch

    line = stop_line(accelerator, **node_facts(torch))
    if line:
        raise CudaUnavailable(line)
