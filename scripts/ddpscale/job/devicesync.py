"""Waiting for the device before a clock is read: the one rule every timer here shares."""
from __future__ import annotations


def sync_device(device) -> None:
    """Wait for the device's queued work. CUDA kernels run asynchronously, so a clock read
    without this stops before the GPU has finished; on CPU the work is already done. torch is
    imported here, not at the top, so modules of pure arithmetic that use this stay importable
    without it."""
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)
