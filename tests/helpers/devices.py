"""GPUs as the tests meet them: a skip where there is no CUDA, a fake nvidia-smi and the local
profile's dry run under it, and `make gpu-check`'s script (benchmarks/gpu_check.py) as a module."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.workflow import ROOT, SNAKEMAKE


def require_cuda():
    """torch, or a skip that says why: CI and this machine have no GPU."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU; this machine has none (CI never does)")
    return torch


SMI_ONE = "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-5a1c2f0e-0000-4000-8000-000000000000)\n"


def fake_nvidia_smi(folder: Path, listing: str, code: int = 0) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "nvidia-smi"
    script.write_text(f"#!/bin/sh\n[ \"$1\" = \"-L\" ] || exit 9\nprintf '%s' '{listing}'\nexit {code}\n")
    script.chmod(0o755)
    return folder


def dry_run(workspace, config: dict, cuda_visible_devices: str | None = None, smi: str | None = None):
    """`snakemake --profile profiles/local -n -p` with a fake nvidia-smi (or none) on PATH."""
    workspace.write_config(config)
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    bin_dir = workspace.path.parent / "fakebin"
    if smi is not None:
        fake_nvidia_smi(bin_dir, smi)
    env["PATH"] = f"{bin_dir}:{Path(sys.executable).parent}:/usr/bin:/bin"
    if cuda_visible_devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = cuda_visible_devices
    proc = subprocess.run([*SNAKEMAKE, "--profile", "profiles/local", "-n", "-p"], cwd=workspace.path,
                          capture_output=True, text=True, timeout=120, env=env)
    return proc.returncode, proc.stdout + proc.stderr


def train_commands(output: str) -> dict[str, str]:
    """{topology: shell command} of the planned train jobs."""
    commands = {}
    for line in output.splitlines():
        match = re.search(r"scripts/train\.py --topology=(\d+x\d+) ", line)
        if line.startswith("Shell command: ") and match:
            commands[match.group(1)] = line[len("Shell command: "):]
    return commands


spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks/gpu_check.py")
gpu_check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_check)
