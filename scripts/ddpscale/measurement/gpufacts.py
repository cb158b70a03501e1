"""GPU facts of a training run: peak memory, and utilisation sampled with nvidia-smi.

Sampling never stops training: without nvidia-smi, or when it fails, there are no samples.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading

QUERY = ["--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"]


def parse_utilization(text: str) -> int | None:
    """Percent from nvidia-smi's csv,noheader,nounits output ("87"); None if it holds no number."""
    for line in text.splitlines():
        line = line.strip().rstrip("%").strip()
        if line:
            try:
                return int(line)
            except ValueError:
                return None  # "[N/A]", "[Not Supported]", an error message
    return None


def smi_index(cuda_index: int, visible: str | None = None) -> str:
    """What nvidia-smi -i calls CUDA device cuda_index of this process.

    CUDA numbers only the devices in CUDA_VISIBLE_DEVICES (an index or a UUID each);
    nvidia-smi sees them all.
    """
    visible = os.environ.get("CUDA_VISIBLE_DEVICES") if visible is None else visible
    entries = [e.strip() for e in (visible or "").split(",") if e.strip()]
    if entries and cuda_index < len(entries):
        return entries[cuda_index]
    return str(cuda_index)


class UtilizationSampler:
    """A daemon thread that reads this rank's GPU utilisation every interval_s seconds."""

    def __init__(self, cuda_index: int, interval_s: float = 1.0, command: str = "nvidia-smi"):
        self.index = smi_index(cuda_index)
        self.interval_s = interval_s
        self.command = command
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> "UtilizationSampler":
        executable = shutil.which(self.command)
        if executable is not None:
            self._argv = [executable, *QUERY, "-i", self.index]
            self._thread = threading.Thread(target=self._run, name="gpu-utilization", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                done = subprocess.run(self._argv, capture_output=True, text=True,
                                      timeout=max(5.0, 5 * self.interval_s))
            except (OSError, subprocess.SubprocessError):
                return
            value = parse_utilization(done.stdout) if done.returncode == 0 else None
            if value is None:
                return  # it will not start working: stop asking
            self.samples.append(value)

    def stop(self) -> list[int]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval_s + 10.0)
        return list(self.samples)


def peak_memory_mb(device) -> float | None:
    """Peak memory allocated by tensors on a CUDA device, in MiB; None on a CPU."""
    import torch

    device = torch.device(device)
    if device.type != "cuda":
        return None
    return torch.cuda.max_memory_allocated(device) / 2**20


def summarize(ranks: list[dict]) -> dict:
    """The metrics-record entries from each rank's {"peak_memory_mb", "utilization"} (samples)."""
    peaks = [r["peak_memory_mb"] for r in ranks if r.get("peak_memory_mb") is not None]
    means = [sum(r["utilization"]) / len(r["utilization"]) for r in ranks if r.get("utilization")]
    return {
        "gpu_peak_memory_mb": max(peaks) if peaks else None,
        "gpu_utilization_pct": sum(means) / len(means) if means else None,
        "gpu_utilization_samples": sum(len(r.get("utilization") or []) for r in ranks),
    }


CPU_RECORD = {"gpu_peak_memory_mb": None, "gpu_utilization_pct": None, "gpu_utilization_samples": 0}
