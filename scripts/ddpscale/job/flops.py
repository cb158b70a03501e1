"""Training FLOPs per sample, achieved TFLOP/s and model FLOPs utilisation (MFU).

FLOPs are counted by torch's FlopCounterMode over one forward + backward of the module's
training_step (matrix multiplies, convolutions and attention; elementwise work is not counted,
as in the usual MFU convention). They depend on shapes only, so the count runs on a fresh
copy of the module built on the meta device, with the batch's shapes: no memory, no compute,
and no way for the module and the batch to sit on different devices or in different dtypes.
(Counting the trained module after fit failed on every GPU run: Lightning had moved the
module back to the CPU while resident batches stayed on the GPU, or bf16-true weights met
fp32 inputs.)
"""

from __future__ import annotations

import warnings

import torch
from torch.utils.flop_counter import FlopCounterMode

from ddpscale.job import peaks
from ddpscale.job.stepprobe import loss_of, training_step

# Outside a Trainer, self.log() in training_step only warns; it logs nothing either way.
_LOG_WARNING = r"You are trying to `self\.log\(\)` but the `self\.trainer` reference is not registered"

def precision_plan(precision: str, device_type: str) -> dict:
    """How to run Lightning's precision setting: autocast dtype, parameter dtype, loss scaling."""
    p = str(precision)
    if p in ("32", "32-true"):
        return {"autocast": None, "params": None, "scaler": False}
    if p in ("64", "64-true"):
        return {"autocast": None, "params": torch.float64, "scaler": False}
    if p in ("bf16", "bf16-mixed"):
        return {"autocast": torch.bfloat16, "params": None, "scaler": False}
    if p == "bf16-true":
        return {"autocast": None, "params": torch.bfloat16, "scaler": False}
    if p in ("16", "16-mixed"):
        if device_type != "cuda":
            raise ValueError(f"precision {p} needs a GPU; on CPU use bf16-mixed or 32-true")
        return {"autocast": torch.float16, "params": None, "scaler": True}
    if p == "16-true":
        return {"autocast": None, "params": torch.float16, "scaler": False}
    raise ValueError(f"the FLOP count does not know precision '{p}'; use 32-true, bf16-mixed, 16-mixed, "
                     "bf16-true, 16-true or 64-true")


def to_device(batch, device: torch.device, dtype=None):
    """Move a batch (tensors in lists, tuples, dicts) to the device; floating tensors to dtype."""
    if torch.is_tensor(batch):
        batch = batch.to(device, non_blocking=True)
        return batch.to(dtype) if dtype is not None and batch.is_floating_point() else batch
    if isinstance(batch, dict):
        return {k: to_device(v, device, dtype) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        moved = [to_device(v, device, dtype) for v in batch]
        return type(batch)(*moved) if hasattr(batch, "_fields") else type(batch)(moved)
    return batch


def training_flops(module, batch, size: int) -> tuple[float, float]:
    """FLOPs of one training step (forward + backward) on this batch, divided by its size (its
    samples, as ddpscale.job.samplecount counts them), and the share of them in
    convolutions (cuDNN's, which TF32 may speed apart from matmuls)."""
    module.train()
    with FlopCounterMode(display=False) as counter, warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_LOG_WARNING)
        loss_of(training_step(module, batch, 0)).backward()
    module.zero_grad(set_to_none=True)
    total = counter.get_total_flops()
    conv = sum(n for op, n in counter.get_flop_counts().get("Global", {}).items() if "convolution" in str(op))
    return total / size, (conv / total if total else 0.0)


def training_flops_per_sample(module, batch, size: int) -> float:
    """FLOPs of one training step (forward + backward) on this batch, divided by its size."""
    return training_flops(module, batch, size)[0]


def utilisation(flops_per_sample: float | None, throughput: float | None, world_size: int,
                device_name: str, precision: str, float32: dict | None = None,
                conv_share: float | None = None) -> dict:
    """Achieved TFLOP/s over all devices, the peak per device (and which: 'tf32', '32', ...),
    and MFU (None where unknown). float32: the float32 settings in effect (float32_record)."""
    achieved = (flops_per_sample * throughput / 1e12
                if flops_per_sample and throughput else None)
    tf32 = peaks.tf32_in_effect(**(float32 or {}))
    peak, used = peaks.peak(device_name, precision, tf32["matmul"], tf32["conv"], conv_share)
    mfu = achieved / (peak * world_size) if achieved is not None and peak else None
    return {"achieved_tflops": achieved, "peak_tflops_per_device": peak, "peak_precision": used, "mfu": mfu}


# torch.backends.*.fp32_precision values (torch >= 2.9) as the legacy getters name them: "none"
# defers to the parent setting (generic > cuda.matmul; generic > cudnn > cudnn.conv)
_LEGACY_MATMUL = {"ieee": "highest", "tf32": "high", "bf16": "medium"}


def _fp32_setting(*chain) -> str:
    """The first setting of a fp32_precision chain (child first) that is not 'none'; 'ieee' if all are."""
    return next((value for value in chain if value != "none"), "ieee")


def float32_record() -> dict:
    """The float32 arithmetic settings in effect now (read at fit time, after the user's module
    and callbacks have set theirs), as metrics.json entries.

    Once anything sets torch's fp32_precision API (torch.backends.fp32_precision or a backend's),
    the legacy getters raise RuntimeError ("mix of the legacy and new APIs"); the new API reads
    every setting, legacy ones included, so a getter that refuses is answered from it."""
    def legacy_or(getter, new_value):
        try:
            return getter()
        except RuntimeError:
            return new_value()

    backends = torch.backends
    matmul = lambda: _fp32_setting(backends.cuda.matmul.fp32_precision, backends.fp32_precision)  # noqa: E731
    conv = lambda: _fp32_setting(backends.cudnn.conv.fp32_precision, backends.cudnn.fp32_precision,  # noqa: E731
                                 backends.fp32_precision)
    return {"float32_matmul_precision": legacy_or(torch.get_float32_matmul_precision,
                                                  lambda: _LEGACY_MATMUL.get(matmul(), "highest")),
            "cuda_matmul_allow_tf32": bool(legacy_or(lambda: backends.cuda.matmul.allow_tf32,
                                                     lambda: matmul() == "tf32")),
            "cudnn_allow_tf32": bool(legacy_or(lambda: backends.cudnn.allow_tf32, lambda: conv() == "tf32"))}


def count_split(model_cls, model_args: dict, batch, size: int, precision: str,
                trained=None) -> tuple[float, float] | None:
    """FLOPs per training sample of one step on this batch's shapes and their share in
    convolutions (training_flops); None if they cannot be counted.

    First on a fresh module built on the meta device, in the dtype the precision trains in
    (bf16-true: bf16 weights and inputs). A module that cannot be built there (say, it loads
    weights in __init__) is counted on the trained module instead, with the batch moved to that
    module's device and dtype.
    """
    dtype = precision_plan(precision, "cuda")["params"]
    try:
        with torch.device("meta"):
            module = model_cls(**model_args)
            module = module.to(dtype) if dtype is not None else module
            return training_flops(module, to_device(batch, torch.device("meta"), dtype), size)
    except Exception as err:
        meta_error = err
    if trained is not None:
        owner = trained._trainer
        try:
            trained.trainer = None  # outside the loop: self.log() must only warn, not raise
            param = next(trained.parameters())
            return training_flops(trained, to_device(batch, param.device, dtype), size)
        except Exception as err:
            meta_error = err
        finally:
            trained.trainer = owner
    # a user module that cannot run outside the Trainer: no MFU, no crash
    print(f"ddpscale: could not count FLOPs ({type(meta_error).__name__}: {meta_error}); MFU will be n/a",
          flush=True)
    return None


def count(model_cls, model_args: dict, batch, size: int, precision: str, trained=None) -> float | None:
    """FLOPs per training sample of one step on this batch's shapes; None if it cannot be counted."""
    split = count_split(model_cls, model_args, batch, size, precision, trained)
    return None if split is None else split[0]


def check_analytic(counted: float | None, analytic: float | None, rel: float = 0.01) -> str | None:
    """A warning when the counted FLOPs and the module's own analytic count disagree."""
    if counted is None or analytic is None or abs(counted - analytic) <= rel * abs(analytic):
        return None
    return (f"ddpscale: counted {counted:,.0f} training FLOPs per sample but the module's "
            f"flops_per_sample() says {analytic:,.0f}; MFU uses the counted figure")
