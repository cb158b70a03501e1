"""Dense peak TFLOP/s per GPU, and which peak a run's arithmetic could reach.

A 32-true run is not always FP32: on Ampere and later, cuBLAS runs float32 matmuls in TF32
when torch.set_float32_matmul_precision("high"/"medium") (or allow_tf32) says so, and cuDNN
runs float32 convolutions in TF32 by default (torch.backends.cudnn.allow_tf32). Dividing
such a run by the FP32 peak overstates MFU up to 7x on an H100 (494.5 / 67) and can pass
100%. So the peak follows the precision in effect, recorded at fit time
(ddpscale.job.callbacks.FlopsCount), and the counted FLOPs' share in convolutions.
Pure: no torch.
"""

from __future__ import annotations

import re

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
