"""Training FLOPs per sample, achieved TFLOP/s, and model (MFU) and hardware (HFU) FLOPs utilisation.

FLOPs are counted by torch's FlopCounterMode (matrix multiplies, convolutions and attention;
elementwise work is not counted, as in the usual MFU convention) inside the fit, over real
training steps of the trained module: on the trainer's device, in its precision, with its
trainer attached (a step may read self.trainer, log, or all_gather), on the batches the
loaders really yield. A copy counted apart from the fit could do none of that: built on the
meta device it had no trainer, and the trained module counted after fit met the wrong device
or dtype (Lightning had moved it back to the CPU while resident batches stayed on the GPU,
or bf16-true weights met fp32 inputs).

The counter costs time (every op passes through Python), so only a few steps are counted: the
first of each attempt, inside its first epoch and first throughput window, which are warm-up
in both measure modes (ddpscale.job.callbacks.FlopsCount); no figure is timed on them.
Per sample is a ratio of sums over those steps (their FLOPs over their samples, as the run
counts them), so batches of varying shapes (length bucketing) weigh by their samples; the
smallest and largest batch's figure are kept, to say how much FLOPs vary per batch.

Activation checkpointing (torch.utils.checkpoint) recomputes part of the forward during
backward. Those FLOPs are told apart as they run: an op in the backward phase (between
Lightning's on_before_backward and on_after_backward) with grad mode on is a recomputed
forward op, for autograd runs backward formulas with grad mode off (create_graph=False) and
checkpointing recomputes under torch.enable_grad(). MFU divides model FLOPs, without the
recomputation (the PaLM paper's definition, Chowdhery et al. 2022, appendix B); HFU,
hardware FLOPs utilisation, includes it.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
from torch.utils.flop_counter import FlopCounterMode, flop_registry

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


def training_flops(module, batch, size: int) -> tuple[float, float]:
    """FLOPs of one forward + backward of a bare module's training_step on this batch (no
    trainer, no optimizer), divided by size, and their share in convolutions: a hand check of
    what StepCounter counts inside the fit."""
    module.train()
    with FlopCounterMode(display=False) as counter, warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_LOG_WARNING)
        loss_of(training_step(module, batch, 0)).backward()
    module.zero_grad(set_to_none=True)
    total = counter.get_total_flops()
    return total / size, (conv_flops(counter) / total if total else 0.0)


def training_flops_per_sample(module, batch, size: int) -> float:
    """FLOPs of one training step (forward + backward) on this batch, divided by its size."""
    return training_flops(module, batch, size)[0]


def conv_flops(counter: FlopCounterMode) -> int:
    """The counted FLOPs in convolutions (cuDNN's, which TF32 may speed apart from matmuls)."""
    return sum(n for op, n in counter.get_flop_counts().get("Global", {}).items() if "convolution" in str(op))


@dataclass(frozen=True)
class Counted:
    """One training batch as counted: every FLOP its step ran (recomputation included), those
    that activation checkpointing recomputed, those in convolutions, and its samples."""
    flops: int
    recomputed: int
    conv: int
    samples: int


class StepCounter:
    """FlopCounterMode over one real training step, entered at its batch's start and left at
    its end (so everything Lightning runs for the batch is in it: forward, backward, the
    optimizer, under the trainer's precision), with recomputed FLOPs told apart (the module's
    docstring says how). An op whose FLOPs the counter cannot compute spoils the count, never
    the step: the error is kept (`error`) and the count is then not used."""

    def __init__(self):
        self.in_backward = False
        self.error: str | None = None
        self._recomputed = 0
        self._mode: FlopCounterMode | None = None
        self._stance = None
        # FlopCounterMode's own formulas, each wrapped to tally recomputation (custom_mapping is
        # its public way to give formulas; _get_raw: they take the op's arguments, as registered)
        self._formulas = {op: self._tallying(formula) for op, formula in flop_registry.items()}

    def _tallying(self, formula):
        def count(*args, out_val=None, **kwargs):
            try:
                flops = formula(*args, out_val=out_val, **kwargs)
            except Exception as err:  # noqa: BLE001 - inside the user's step: never raise there
                self.error = self.error or f"{type(err).__name__}: {err}"
                return 0
            if self.in_backward and torch.is_grad_enabled():
                self._recomputed += flops
            return flops

        count._get_raw = True
        return count

    @property
    def counting(self) -> bool:
        return self._mode is not None

    def start(self) -> None:
        self._recomputed, self.in_backward = 0, False
        # counted steps run eagerly: dynamo compiling under the counter's dispatch mode guarded
        # on tensors as the mode sees them, and recompiled at the first step after it (2 of 2
        # compiled test runs); a module that compiles itself then recorded no compiled graph.
        # The compile happens at the first uncounted step; model FLOPs are the same eagerly.
        self._stance = torch.compiler.set_stance("force_eager")
        self._mode = FlopCounterMode(display=False, custom_mapping=self._formulas)
        self._mode.__enter__()

    def stop(self, samples: int) -> Counted:
        mode, self._mode = self._mode, None
        mode.__exit__(None, None, None)
        self._stance.__exit__(None, None, None)  # the stance before start, the user's own if set
        self.in_backward = False
        return Counted(mode.get_total_flops(), self._recomputed, conv_flops(mode), samples)

    def abandon(self) -> None:
        """Leave a step that did not reach its batch's end (an exception, a skipped epoch)."""
        if self._mode is not None:
            self.stop(0)


def summarise(counted: list[Counted]) -> dict:
    """metrics.json entries of the counted batches: model FLOPs per sample (recomputation left
    out) as a ratio of sums, the recomputed FLOPs per sample, the convolutions' share, and the
    smallest and largest batch's model FLOPs per sample (they differ where batch shapes vary)."""
    samples = sum(c.samples for c in counted)
    if not counted or samples <= 0:
        return {"flops_per_sample": None, "flops_recomputed_per_sample": None, "flops_conv_share": None,
                "flops_per_sample_min": None, "flops_per_sample_max": None, "flops_batches": 0}
    total, recomputed = sum(c.flops for c in counted), sum(c.recomputed for c in counted)
    each = [(c.flops - c.recomputed) / c.samples for c in counted if c.samples > 0]
    return {"flops_per_sample": (total - recomputed) / samples, "flops_recomputed_per_sample": recomputed / samples,
            "flops_conv_share": sum(c.conv for c in counted) / total if total else 0.0,
            "flops_per_sample_min": min(each), "flops_per_sample_max": max(each), "flops_batches": len(counted)}


def utilisation(flops_per_sample: float | None, throughput: float | None, world_size: int,
                device_name: str, precision: str, float32: dict | None = None,
                conv_share: float | None = None, recomputed_per_sample: float | None = None) -> dict:
    """Achieved TFLOP/s over all devices (model FLOPs), the peak per device (and which: 'tf32',
    '32', ...), MFU (model FLOPs over the peak) and HFU (with the recomputed FLOPs too; None where
    nothing was recomputed), None where unknown. float32: the float32 settings in effect
    (float32_record)."""
    achieved = (flops_per_sample * throughput / 1e12
                if flops_per_sample and throughput else None)
    tf32 = peaks.tf32_in_effect(**(float32 or {}))
    peak, used = peaks.peak(device_name, precision, tf32["matmul"], tf32["conv"], conv_share)
    mfu = achieved / (peak * world_size) if achieved is not None and peak else None
    hfu = (mfu * (flops_per_sample + recomputed_per_sample) / flops_per_sample
           if mfu is not None and recomputed_per_sample else None)
    return {"achieved_tflops": achieved, "peak_tflops_per_device": peak, "peak_precision": used, "mfu": mfu,
            "hfu": hfu}


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
    matmul = lambda: _fp32_setting(backends.cuda.matmul.fp32_precision, backends.fp32_precision)
    conv = lambda: _fp32_setting(backends.cudnn.conv.fp32_precision, backends.cudnn.fp32_precision,
                                 backends.fp32_precision)
    return {"float32_matmul_precision": legacy_or(torch.get_float32_matmul_precision,
                                                  lambda: _LEGACY_MATMUL.get(matmul(), "highest")),
            "cuda_matmul_allow_tf32": bool(legacy_or(lambda: backends.cuda.matmul.allow_tf32,
                                                     lambda: matmul() == "tf32")),
            "cudnn_allow_tf32": bool(legacy_or(lambda: backends.cudnn.allow_tf32, lambda: conv() == "tf32"))}


def check_analytic(counted: float | None, analytic: float | None, rel: float = 0.01) -> str | None:
    """A warning when the counted FLOPs and the module's own analytic count disagree."""
    if counted is None or analytic is None or abs(counted - analytic) <= rel * abs(analytic):
        return None
    return (f"ddpscale: counted {counted:,.0f} training FLOPs per sample but the module's "
            f"flops_per_sample() says {analytic:,.0f}; MFU uses the counted figure")
