"""Dense peak TFLOP/s per GPU, and which peak a run's arithmetic could reach.

A 32-true run is not always FP32: on Ampere and later, cuBLAS runs float32 matmuls in TF32
when torch.set_float32_matmul_precision("high"/"medium") (or allow_tf32) says so, and cuDNN
runs float32 convolutions in TF32 by default (torch.backends.cudnn.allow_tf32). Dividing
such a run by the FP32 peak overstates MFU up to 7x on an H100 (494.5 / 67) and can pass
100%. So the peak follows the precision in effect, recorded at fit time
(ddpscale.training.callbacks.FlopsCount), and the counted FLOPs' share in convolutions.
Pure: no torch.
"""

from __future__ import annotations

# Dense figures (the datasheets mark sparse ones with *; dense is half of those). Columns:
# "bf16"/"16" tensor-core half precision, "tf32" tensor-core TF32, "32" FP32 on CUDA cores,
# "64" FP64 where the datasheet states it: the FP64 Tensor Core figure where there is one
# (cuBLAS runs float64 GEMMs on them from Ampere on), absent (so MFU n/a) where the datasheet
# gives none, rather than a guess.
# A name matches when every word of the key is a word of torch.cuda.get_device_name() (dashes
# read as spaces, case ignored). Names as the driver reports them: "NVIDIA H100 80GB HBM3"
# (SXM5), "NVIDIA H100 PCIe", "NVIDIA H100 NVL", "NVIDIA H200" (SXM), "NVIDIA H200 NVL",
# "NVIDIA GH200 480GB", "NVIDIA A100-SXM4-80GB", "Tesla V100-SXM2-32GB", "Tesla V100-PCIE-16GB".
# More specific rows come first. The search corpus held no NVIDIA page itself; the figures
# below are the datasheets' (URLs given), and the secondary pages named agree with them.
_HOPPER_SXM = {"bf16": 989.5, "16": 989.5, "tf32": 494.5, "32": 67.0, "64": 67.0}
_HOPPER_NVL = {"bf16": 835.5, "16": 835.5, "tf32": 417.5, "32": 60.0, "64": 60.0}
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
    ("H100", "SXM"): _HOPPER_SXM,
    # A100 datasheet (nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf), SXM and PCIe alike:
    # TF32 156 (312*), BF16/FP16 312 (624*), FP32 19.5, FP64 Tensor Core 19.5
    ("A100",): {"bf16": 312.0, "16": 312.0, "tf32": 156.0, "32": 19.5, "64": 19.5},
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


def device_peaks(device_name: str) -> dict | None:
    """The table row for this GPU, or None (CPU, unknown GPU)."""
    names = device_name.replace("-", " ").upper().split()
    for words, peaks in PEAK_TFLOPS.items():
        if all(word.upper() in names for word in words):
            return peaks
    return None


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
