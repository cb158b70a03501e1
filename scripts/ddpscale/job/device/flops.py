"""Training FLOPs per sample, achieved TFLOP/s, the device's dense peak, and model (MFU) and
hardware (HFU) FLOPs utilisation.

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

Dense peak TFLOP/s per GPU, and which peak a run's arithmetic could reach.

A 32-true run is not always FP32: on Ampere and later, cuBLAS runs float32 matmuls in TF32
when torch.set_float32_matmul_precision("high"/"medium") (or allow_tf32) says so, and cuDNN
runs float32 convolutions in TF32 by default (torch.backends.cudnn.allow_tf32). Dividing
such a run by the FP32 peak overstates MFU up to 7x on an H100 (494.5 / 67) and can pass
100%. So the peak follows the precision in effect, recorded at fit time
(ddpscale.job.callbacks.FlopsCount), and the counted FLOPs' share in convolutions.

A bare module's step runs as Lightning runs it (training_step, loss_of): here for the hand check
of the count (training_flops), in the step probe to time it.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass

import torch
from pytorch_lightning.utilities.signature_utils import is_param_in_hook_signature
from torch.utils.flop_counter import FlopCounterMode, flop_registry


def loss_of(output, batch_idx: int | None = None) -> torch.Tensor:
    loss = output["loss"] if isinstance(output, dict) else output
    if not torch.is_tensor(loss):
        where = "" if batch_idx is None else f" for batch {batch_idx}"
        raise ValueError(f"training_step returned {type(output).__name__}{where}, not a loss tensor or a "
                         "dict with 'loss'; the probe times whole steps")
    return loss


def training_step(module, batch, batch_idx: int):
    """module.training_step called as Lightning calls it: batch_idx is optional in Lightning (its
    GAN tutorial writes `training_step(self, batch)`), passed where the signature takes it."""
    if is_param_in_hook_signature(module.training_step, "batch_idx", min_args=2):
        return module.training_step(batch, batch_idx)
    return module.training_step(batch)


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
    tf32 = tf32_in_effect(**(float32 or {}))
    per_device, used = peak(device_name, precision, tf32["matmul"], tf32["conv"], conv_share)
    mfu = achieved / (per_device * world_size) if achieved is not None and per_device else None
    hfu = (mfu * (flops_per_sample + recomputed_per_sample) / flops_per_sample
           if mfu is not None and recomputed_per_sample else None)
    return {"achieved_tflops": achieved, "peak_tflops_per_device": per_device, "peak_precision": used, "mfu": mfu,
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


# Dense figures (the datasheets mark sparse ones with *; dense is half of those). Columns:
# "bf16"/"16" tensor-core half precision, "tf32" tensor-core TF32, "32" FP32 on CUDA cores,
# "64" FP64 where the datasheet states it: the FP64 Tensor Core figure where there is one
# (cuBLAS runs float64 GEMMs on them from Ampere on), absent (so MFU n/a) where the datasheet
# gives none, rather than a guess.
# A name matches when every word of the key is a word of torch.cuda.get_device_name() (dashes
# read as spaces, case ignored). Names as the driver reports them: "NVIDIA H100 80GB HBM3"
# (SXM5), "NVIDIA H100 PCIe", "NVIDIA H100 NVL", "NVIDIA H200" (SXM), "NVIDIA H200 NVL",
# "NVIDIA GH200 480GB", "NVIDIA H800" (SXM), "NVIDIA H800 PCIe", "NVIDIA A100-SXM4-80GB",
# "NVIDIA A100 80GB PCIe", "NVIDIA A800-SXM4-80GB", "NVIDIA A800 80GB PCIe",
# "Tesla V100-SXM2-32GB", "Tesla V100-PCIE-16GB"; a MIG instance adds its profile:
# "NVIDIA A100-SXM4-40GB MIG 3g.20gb" (see MIG_SMS). More specific rows come first.
# A bare "NVIDIA H100" has no row, so MFU is n/a: the driver names some SXM variants so (96GB
# HBM2e ones among them), and the name cannot tell them from other forms
# (github.com/pytorch/torchtitan/pull/554); nor has "NVIDIA H100 SXM5 64GB" (NVIDIA's vGPU
# docs name it so), whose figures no datasheet gives.
# The search corpus held few NVIDIA pages; the figures below are the datasheets' (URLs
# given), and the secondary pages named agree with them.
_HOPPER_SXM = {"bf16": 989.5, "16": 989.5, "tf32": 494.5, "32": 67.0, "64": 67.0}
_HOPPER_NVL = {"bf16": 835.5, "16": 835.5, "tf32": 417.5, "32": 60.0, "64": 60.0}
_AMPERE_GA100 = {"bf16": 312.0, "16": 312.0, "tf32": 156.0, "32": 19.5, "64": 19.5}
PEAK_TFLOPS = {
    # GH200 datasheet (nvidia.com/en-us/data-center/grace-hopper-superchip/): as the H100 SXM
    ("GH200",): _HOPPER_SXM,
    # nvidia.com/en-us/data-center/h200/ : H200 NVL TF32 835*, BF16/FP16 1,671*, FP32 60,
    # FP64 Tensor Core 60 (a 600 W PCIe card, lower than the SXM's)
    ("H200", "NVL"): _HOPPER_NVL,
    # same page, H200 SXM: TF32 989*, BF16/FP16 1,979*, FP32 67, FP64 Tensor Core 67
    ("H200",): _HOPPER_SXM,
    # nvidia.com/en-us/data-center/h100/ : H100 PCIe TF32 756*, BF16/FP16 1,513*, FP32 51,
    # FP64 Tensor Core 51 (hpctech.co.jp's copy of the table, sparse marked, agrees)
    ("H100", "PCIe"): {"bf16": 756.5, "16": 756.5, "tf32": 378.0, "32": 51.0, "64": 51.0},
    # same page, H100 NVL: TF32 835*, BF16/FP16 1,671*, FP32 60, FP64 Tensor Core 60
    ("H100", "NVL"): _HOPPER_NVL,
    # same page, H100 SXM: TF32 989*, BF16/FP16 1,979*, FP32 67, FP64 Tensor Core 67
    # (glennklockwood.com's H100 table from the whitepaper: 494.7 / 989.4 / 66.9 / 66.9)
    ("H100", "HBM3"): _HOPPER_SXM,
    # H800: the H100 for export, NVLink and FP64 cut, the rest of its compute the H100's. SXM
    # ("NVIDIA H800": NVSwitch fabric and 1,980 MHz clocks in github.com/NVIDIA/DCGM/issues/120):
    # BF16/FP16 1,979* as the H100 SXM (the H800 datasheet as github.com/astroC86/gpu-datasheet
    # lists it; github.com/ai-dynamo/aiconfigurator/pull/968: 989 dense); same SMs and clocks, so
    # TF32 and FP32 as well. PCIe: 114 SMs and FP8 3,026* as the H100 PCIe. FP64 is cut to
    # about 1 TFLOPS, which no NVIDIA page in the corpus states exactly: "64" absent (n/a).
    # The 94GB card ("H800 PCIe 94GB (H800 NVL)" in NVIDIA's vGPU docs) has no figures found:
    # empty rows, so n/a rather than an 80GB card's.
    ("H800", "NVL"): {},
    ("H800", "94GB"): {},
    ("H800", "PCIe"): {"bf16": 756.5, "16": 756.5, "tf32": 378.0, "32": 51.0},
    ("H800",): {key: value for key, value in _HOPPER_SXM.items() if key != "64"},
    # A100 datasheet (nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf), SXM and PCIe alike:
    # TF32 156 (312*), BF16/FP16 312 (624*), FP32 19.5, FP64 Tensor Core 19.5
    ("A100",): _AMPERE_GA100,
    # A800: the A100 for export, the same GA100 with 108 SMs at 1,410 MHz
    # (siliconcat.net/gpu/nvidia-a800-pcie-40-gb), so the A100's figures
    # (hmc-tech.com/gpu/nvidia-a800-40gb-vs-nvidia-t4: TF32 155.9, BF16 311.9, FP32 19.5, FP64
    # Tensor 19.5). SXM4 and PCIe, 40GB and 80GB alike.
    ("A800",): _AMPERE_GA100,
    # Tesla V100 datasheet (images.nvidia.com/content/technologies/volta/pdf/
    # volta-v100-datasheet-update-us-1165301-r5.pdf): SXM2 Tensor 125, FP32 15.7, FP64 7.8;
    # PCIe Tensor 112, FP32 14, FP64 7 (io-tech.fi and cvw.cac.cornell.edu agree). No bf16 or
    # TF32 on Volta. A V100 named neither way (FHHL, SXM3) has its own clocks: unknown.
    ("V100", "SXM2"): {"16": 125.0, "32": 15.7, "64": 7.8},
    ("V100", "PCIE"): {"16": 112.0, "32": 14.0, "64": 7.0},
    # V100S PCIe (same datasheet): Tensor 130, FP32 16.4, FP64 8.2
    ("V100S",): {"16": 130.0, "32": 16.4, "64": 8.2},
    # L40S datasheet: TF32 183 (366*), BF16/FP16 362.05 (733*), FP32 91.6; no FP64 stated
    ("L40S",): {"bf16": 362.05, "16": 362.05, "tf32": 183.0, "32": 91.6},
    # A40 datasheet: TF32 74.8 (149.6*), BF16/FP16 149.7 (299.4*), FP32 37.4; no FP64 stated
    ("A40",): {"bf16": 149.7, "16": 149.7, "tf32": 74.8, "32": 37.4},
    # L4 datasheet: TF32 120*, BF16/FP16 242*, FP32 30.3; no FP64 stated
    ("L4",): {"bf16": 121.0, "16": 121.0, "tf32": 60.0, "32": 30.3},
}

# A MIG instance has the SMs of its profile, at the full GPU's clocks: its peak is the full
# GPU's times its share of the SMs, as `nvidia-smi mig -lgip` lists them. Not the compute
# slices' share g/7: the SMs per slice vary (an A100 7g has 98 of 108; an H100 3g has 60 of
# 132, a 4g 64), so each row holds the GPU's SMs and each documented profile's; a profile not
# here, or a compute instance smaller than its GPU instance ("MIG 1c.3g.20gb"), gets None.
# A100 (A800 unlisted): 14 SMs per compute slice of 108, forums.developer.nvidia.com/t/
# why-mig-instances-can-only-sum-up-to-98-sms-instead-of-the-108-sms-available/170488 (40GB);
# the 80GB's names follow by memory, each with the 40GB profile's share of SMs
# (docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html).
# H100 80GB HBM3: jbarrow.ai/field_notes/nvidia-mig/ ; H200: github.com/NVIDIA/mig-parted/
# issues/120 ; H100 NVL: github.com/NVIDIA/gpu-operator/pull/900 ; GH200 144G:
# github.com/NVIDIA/mig-parted/pull/139 . "+me" (media extensions) adds no SMs.
_A100_MIG = {"1g.5gb": 14, "1g.10gb": 14, "1g.20gb": 14, "2g.10gb": 28, "2g.20gb": 28, "3g.20gb": 42,
             "3g.40gb": 42, "4g.20gb": 56, "4g.40gb": 56, "7g.40gb": 98, "7g.80gb": 98}
MIG_SMS = {
    ("A100",): (108, _A100_MIG),
    ("H100", "HBM3"): (132, {"1g.10gb": 16, "1g.20gb": 26, "2g.20gb": 32, "3g.40gb": 60, "4g.40gb": 64,
                             "7g.80gb": 132}),
    ("H200",): (132, {"1g.18gb": 16, "1g.35gb": 26, "2g.35gb": 32, "3g.71gb": 60, "4g.71gb": 64}),
    ("H100", "NVL"): (132, {"1g.12gb": 16, "1g.24gb": 26, "2g.24gb": 32}),
    ("GH200",): (132, {"1g.18gb": 16, "1g.36gb": 26, "2g.36gb": 32}),
}
_MIG = re.compile(r"\bMIG\b(?:\s+(?:(\d+)c\.)?(\d+)g\.(\d+)gb(?:\+[\w.]+)?\b)?", re.IGNORECASE)

MATMUL_TF32_PRECISIONS = ("high", "medium")  # torch.get_float32_matmul_precision() values


def precision_family(precision: str) -> str:
    """'bf16' for bf16-mixed/bf16-true, '16' for 16-mixed/16-true, '64' for 64/64-true, else '32'."""
    precision = str(precision)
    if precision.startswith("bf16"):
        return "bf16"
    if precision.startswith("16"):
        return "16"
    if precision.startswith("64"):
        return "64"
    return "32"


def _row(device_name: str) -> tuple[tuple[str, ...] | None, dict | None]:
    """The first table row whose words are all words of the name, and its key."""
    names = device_name.replace("-", " ").upper().split()
    for words, peaks in PEAK_TFLOPS.items():
        if all(word.upper() in names for word in words):
            return words, peaks
    return None, None


def _mig_share(key: tuple[str, ...] | None, match: re.Match) -> float | None:
    """A MIG instance's SMs over its GPU's, or None where this file does not know them."""
    compute, slices, memory = match.groups()
    if slices is None or (compute is not None and int(compute) != int(slices)):
        return None
    full, profiles = MIG_SMS.get(key, (None, {}))
    sms = profiles.get(f"{int(slices)}g.{int(memory)}gb")
    return sms / full if sms else None


def device_peaks(device_name: str) -> dict | None:
    """The table row for this GPU, scaled to a MIG instance's share of its SMs; None for a CPU,
    an unknown GPU, or a MIG instance whose share is not known (never the whole GPU's row)."""
    match = _MIG.search(device_name)
    key, peaks = _row(device_name[:match.start()] if match else device_name)
    if not peaks or match is None:
        return peaks or None
    share = _mig_share(key, match)
    return None if share is None else {column: value * share for column, value in peaks.items()}


def tf32_in_effect(float32_matmul_precision: str | None = None, cuda_matmul_allow_tf32: bool | None = None,
                   cudnn_allow_tf32: bool | None = None) -> dict:
    """Which float32 arithmetic may run as TF32: {"matmul": bool, "conv": bool}."""
    return {"matmul": bool(cuda_matmul_allow_tf32) or float32_matmul_precision in MATMUL_TF32_PRECISIONS,
            "conv": bool(cudnn_allow_tf32)}


def _columns(peaks: dict, family: str, matmul_tf32: bool, conv_tf32: bool,
             conv_share: float | None) -> dict[str, float]:
    """The table columns a run's FLOPs ran at, each with its share of them: the precision's own
    column, or for float32 on a GPU with TF32 the matmuls' and the convolutions' (conv_share)."""
    if family != "32" or "tf32" not in peaks:
        return {family: 1.0}
    share = conv_share or 0.0
    shares: dict[str, float] = {}
    for column, part in (("tf32" if matmul_tf32 else "32", 1.0 - share), ("tf32" if conv_tf32 else "32", share)):
        if part > 0.0:
            shares[column] = shares.get(column, 0.0) + part
    return shares


def peak(device_name: str, precision: str, matmul_tf32: bool = False, conv_tf32: bool = False,
         conv_share: float | None = None) -> tuple[float | None, str | None]:
    """A GPU's dense peak for this run's arithmetic and the column(s) it came from ('bf16', '16',
    '64', '32', 'tf32', or 'tf32+32' for a mix); (None, None) for a CPU, an unknown GPU or a
    precision its row lacks.

    For float32 on a GPU with TF32: matmuls at the TF32 peak when matmul_tf32, convolutions
    when conv_tf32; a model with both is held to the time its FLOPs would take at those peaks
    (conv_share of them in convolutions), i.e. the FLOP-weighted harmonic mean of the two.
    """
    peaks = device_peaks(device_name)
    if peaks is None:
        return None, None
    shares = _columns(peaks, precision_family(precision), matmul_tf32, conv_tf32, conv_share)
    if any(peaks.get(column) is None for column in shares):
        return None, None
    if len(shares) == 1:
        (column,) = shares
        return peaks[column], column
    return 1.0 / sum(part / peaks[column] for column, part in shares.items()), "+".join(sorted(shares, reverse=True))


def peak_tflops(*args, **kwargs) -> float | None:
    """peak()'s figure alone."""
    return peak(*args, **kwargs)[0]


def peak_name(*args, **kwargs) -> str | None:
    """peak()'s column alone, as metrics.json records it (peak_precision)."""
    return peak(*args, **kwargs)[1]
