"""Dense peaks by the name the driver reports (ddpscale.job.device.flops): every real name, the
export cards (H800, A800), names that cannot be told apart, and MIG instances."""

from __future__ import annotations

import pytest

from ddpscale.job.device import flops

# (torch.cuda.get_device_name(), the 16-bit tensor peak, the FP64 peak); None where MFU is n/a
DRIVER_NAMES = [
    ("NVIDIA H100 80GB HBM3", 989.5, 67.0),  # SXM5
    ("NVIDIA H100 PCIe", 756.5, 51.0),
    ("NVIDIA H100 NVL", 835.5, 60.0),
    ("NVIDIA H200", 989.5, 67.0),  # SXM
    ("NVIDIA H200 NVL", 835.5, 60.0),
    ("NVIDIA GH200 480GB", 989.5, 67.0),
    ("NVIDIA H800", 989.5, None),  # SXM; FP64 cut and not stated exactly: n/a
    ("NVIDIA H800 PCIe", 756.5, None),
    ("NVIDIA H800 NVL", None, None),  # the 94GB card: no figures, not the 80GB cards'
    ("NVIDIA H800 PCIe 94GB", None, None),
    ("NVIDIA A100-SXM4-80GB", 312.0, 19.5),
    ("NVIDIA A100-SXM4-40GB", 312.0, 19.5),
    ("NVIDIA A100-PCIE-40GB", 312.0, 19.5),
    ("NVIDIA A100 80GB PCIe", 312.0, 19.5),
    ("NVIDIA A800-SXM4-80GB", 312.0, 19.5),
    ("NVIDIA A800-SXM4-40GB", 312.0, 19.5),
    ("NVIDIA A800 80GB PCIe", 312.0, 19.5),
    ("Tesla V100-SXM2-32GB", 125.0, 7.8),
    ("Tesla V100-PCIE-16GB", 112.0, 7.0),
    ("Tesla V100S-PCIE-32GB", 130.0, 8.2),
    ("NVIDIA L40S", 362.05, None),
    ("NVIDIA A40", 149.7, None),
    ("NVIDIA L4", 121.0, None),
    # SXM or not cannot be told from the name (96GB HBM2e SXM cards report it): n/a, not a guess
    ("NVIDIA H100", None, None),
    ("NVIDIA H100 SXM5 64GB", None, None),
]


@pytest.mark.parametrize("name, half, fp64", DRIVER_NAMES)
def test_peak_by_the_name_the_driver_reports(name, half, fp64):
    assert flops.peak_tflops(name, "16-mixed") == half
    assert flops.peak_tflops(name, "64-true") == fp64


def test_every_row_is_reached_by_a_name_the_driver_reports(monkeypatch):
    # a row no real name reaches (the old ("H100", "SXM")) is dead: dropping it changes nothing
    table = dict(flops.PEAK_TFLOPS)
    names = [name for name, _, _ in DRIVER_NAMES]
    before = [flops.device_peaks(name) for name in names]
    for key in table:
        monkeypatch.setattr(flops, "PEAK_TFLOPS", {k: v for k, v in table.items() if k != key})
        assert [flops.device_peaks(name) for name in names] != before, f"no driver name reaches {key}"


# A MIG instance: the full GPU's peak times its share of the SMs (nvidia-smi mig -lgip)
@pytest.mark.parametrize("name, half", [
    ("NVIDIA A100-SXM4-40GB MIG 3g.20gb", 312.0 * 42 / 108),  # not the whole A100's 312
    ("NVIDIA A100-SXM4-40GB MIG 1g.5gb", 312.0 * 14 / 108),
    ("NVIDIA A100-SXM4-80GB MIG 1g.10gb+me", 312.0 * 14 / 108),
    ("NVIDIA A100-SXM4-80GB MIG 7g.80gb", 312.0 * 98 / 108),  # 7g holds 98 of the 108 SMs
    ("NVIDIA A100 80GB PCIe MIG 2g.20gb", 312.0 * 28 / 108),
    ("NVIDIA H100 80GB HBM3 MIG 1g.10gb", 989.5 * 16 / 132),
    ("NVIDIA H100 80GB HBM3 MIG 1g.20gb", 989.5 * 26 / 132),  # twice the memory, more SMs
    ("NVIDIA H100 80GB HBM3 MIG 3g.40gb", 989.5 * 60 / 132),  # not 3/7 of the GPU
    ("NVIDIA H100 80GB HBM3 MIG 7g.80gb", 989.5),  # every one of the 132 SMs
    ("NVIDIA H200 MIG 1g.18gb", 989.5 * 16 / 132),
    ("NVIDIA H100 NVL MIG 1g.12gb", 835.5 * 16 / 132),
    ("NVIDIA A100-SXM4-40GB MIG 3G.20GB", 312.0 * 42 / 108),  # case ignored
])
def test_a_mig_instance_gets_its_share_of_the_gpus_peak(name, half):
    assert flops.peak_tflops(name, "bf16-mixed") == pytest.approx(half)


@pytest.mark.parametrize("name", [
    "NVIDIA H100 PCIe MIG 1g.10gb",  # the PCIe card's SMs per profile are not documented here
    "NVIDIA H200 NVL MIG 1g.18gb",
    "NVIDIA A800-SXM4-80GB MIG 3g.40gb",
    "NVIDIA A100-SXM4-40GB MIG 1c.3g.20gb",  # a compute instance smaller than its GPU instance
    "NVIDIA A100-SXM4-40GB MIG",  # no profile to read
    "NVIDIA A100-SXM4-40GB MIG 5g.30gb",  # no such profile
])
def test_a_mig_instance_of_unknown_share_gets_no_peak_never_the_whole_gpus(name):
    assert flops.device_peaks(name) is None
    assert flops.peak(name, "bf16-mixed") == (None, None)


def test_a_mig_instance_keeps_the_precision_columns():
    name = "NVIDIA A100-SXM4-40GB MIG 3g.20gb"
    assert flops.peak(name, "32-true", matmul_tf32=True) == (pytest.approx(156.0 * 42 / 108), "tf32")
    assert flops.peak(name, "64-true") == (pytest.approx(19.5 * 42 / 108), "64")
