"""Training FLOPs per sample, achieved TFLOP/s and model FLOPs utilisation (MFU).

FLOPs are counted by torch's FlopCounterMode over one real forward + backward of the module's
training_step (matrix multiplies and convolutions; elementwise work is not counted, as in
the usual MFU convention). They depend on shapes only, so the count runs once after training,
on the CPU copy of the model that Lightning leaves behind.
"""

from __future__ import annotations

import warnings

import torch
from torch.utils.flop_counter import FlopCounterMode

from ddpscale.stepprobe import _LOG_WARNING, loss_of

# Dense peak TFLOP/s per GPU by precision, from the vendors' data sheets (no sparsity).
# A name matches when every word of the key is in torch.cuda.get_device_name().
PEAK_TFLOPS = {
    ("H200",): {"bf16": 989.0, "16": 989.0, "32": 67.0},
    ("H100", "SXM"): {"bf16": 989.0, "16": 989.0, "32": 67.0},
    ("H100", "PCIe"): {"bf16": 756.0, "16": 756.0, "32": 51.0},
    ("H100",): {"bf16": 989.0, "16": 989.0, "32": 67.0},
    ("A100",): {"bf16": 312.0, "16": 312.0, "32": 19.5},
    ("V100",): {"16": 125.0, "32": 15.7},
    ("L40S",): {"bf16": 362.0, "16": 362.0, "32": 91.6},
    ("A40",): {"bf16": 149.7, "16": 149.7, "32": 37.4},
}


def precision_family(precision: str) -> str:
    """'bf16' for bf16-mixed/bf16-true, '16' for 16-mixed/16-true, else '32'."""
    if precision.startswith("bf16"):
        return "bf16"
    if precision.startswith("16"):
        return "16"
    return "32"


def peak_tflops(device_name: str, precision: str) -> float | None:
    """A GPU's dense peak for this precision, or None (CPU, unknown GPU, unknown precision)."""
    for words, peaks in PEAK_TFLOPS.items():
        if all(word in device_name for word in words):
            return peaks.get(precision_family(precision))
    return None


def training_flops_per_sample(module, batch) -> float:
    """FLOPs of one training step (forward + backward) on this batch, divided by its size."""
    size = len(batch[0] if isinstance(batch, (list, tuple)) else batch)
    module.train()
    with FlopCounterMode(display=False) as counter, warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_LOG_WARNING)
        loss_of(module.training_step(batch, 0)).backward()
    module.zero_grad(set_to_none=True)
    return counter.get_total_flops() / size


def utilisation(flops_per_sample: float | None, throughput: float | None, world_size: int,
                device_name: str, precision: str) -> dict:
    """Achieved TFLOP/s over all devices, the peak per device, and MFU (None where unknown)."""
    achieved = (flops_per_sample * throughput / 1e12
                if flops_per_sample and throughput else None)
    peak = peak_tflops(device_name, precision)
    mfu = achieved / (peak * world_size) if achieved is not None and peak else None
    return {"achieved_tflops": achieved, "peak_tflops_per_device": peak, "mfu": mfu}


def count(module, datamodule) -> float | None:
    """FLOPs per training sample on the first training batch, on the CPU; None if it fails."""
    trainer = module._trainer
    try:
        module.trainer = None  # outside the loop: self.log() must only warn, not raise
        batch = next(iter(datamodule.train_dataloader()))
        module.cpu()
        return training_flops_per_sample(module, batch)
    except Exception as err:  # a user module that cannot run outside the Trainer: no MFU, no crash
        print(f"ddpscale: could not count FLOPs ({type(err).__name__}: {err}); MFU will be n/a", flush=True)
        return None
    finally:
        module.trainer = trainer
