"""FLOPs per sample, peaks and MFU (ddpscale.job.flops), checked against hand-counted MLPs (the
float32 settings read in fresh processes, and on a GPU: tests/workflow/test_flops.py)."""
import pytest
import torch

from ddpscale.job import flops, peaks
from ddpscale.workloads.models import SpiralMLP


def test_training_flops_of_an_mlp_match_the_matmuls():
    # Linear(8,16) and Linear(16,4), per sample: forward 2*8*16 + 2*16*4 = 384; backward: the
    # second layer's weight and input gradients (128 + 128), the first layer's weight only
    # (its input needs no gradient): 256. Total 896.
    model = SpiralMLP(hidden=[16], dropout=0.0, input_dim=8, num_classes=4)
    batch = (torch.randn(5, 8), torch.randint(0, 4, (5,)))
    assert flops.training_flops_per_sample(model, batch, 5) == 896
    assert all(p.grad is None for p in model.parameters()), "counting must leave no gradients behind"


class LogsInTrainingStep(SpiralMLP):
    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        self.log("train_loss", loss)
        return {"loss": loss}


def test_count_runs_outside_the_trainer_even_when_the_module_logs():
    batch = (torch.randn(4, 2), torch.randint(0, 2, (4,)))
    args = {"hidden": [4], "dropout": 0.0}
    assert flops.count(LogsInTrainingStep, args, batch, len(batch[0]), "32-true") == (2 * 2 * 4 + 2 * 4 * 2) + (2 * 4 * 2) * 2 + 2 * 2 * 4


SPIRAL = {"hidden": [64, 32, 16], "dropout": 0.2}


def test_the_reference_workload_counts_its_analytic_flops():
    batch = (torch.randn(32, 2), torch.randint(0, 2, (32,)))
    assert flops.count(SpiralMLP, SPIRAL, batch, len(batch[0]), "32-true") == 16064 == SpiralMLP(**SPIRAL).flops_per_sample()


def test_a_batch_on_another_device_than_the_trained_module_is_still_counted():
    # The first GPU run: after fit Lightning had moved the module to the CPU while resident
    # batches stayed on cuda:0 ("Expected all tensors to be on the same device"). The meta
    # device reproduces that on a CPU: module here, batch elsewhere.
    trained = SpiralMLP(**SPIRAL)
    batch = (torch.empty(32, 2, device="meta"), torch.empty(32, dtype=torch.long, device="meta"))
    with pytest.raises(RuntimeError):
        trained(batch[0])  # what the old count did
    assert flops.count(SpiralMLP, SPIRAL, batch, len(batch[0]), "32-true", trained=trained) == 16064


@pytest.mark.parametrize("precision", ["bf16-true", "16-true", "bf16-mixed", "64-true"])
def test_weights_and_inputs_of_other_dtypes_are_counted(precision):
    # bf16-true with a DataLoader failed with "mat1 and mat2 must have the same dtype"
    batch = (torch.randn(32, 2), torch.randint(0, 2, (32,)))
    assert flops.count(SpiralMLP, SPIRAL, batch, len(batch[0]), precision) == 16064


class NotOnMeta(SpiralMLP):
    """A module that cannot be built on the meta device (it reads a value in __init__)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.scale = float(torch.ones(1).sum().item())


def test_a_module_that_cannot_be_built_on_meta_is_counted_on_the_trained_copy():
    trained = NotOnMeta(**SPIRAL)
    batch = (torch.randn(8, 2), torch.randint(0, 2, (8,)))
    assert flops.count(NotOnMeta, SPIRAL, batch, len(batch[0]), "32-true", trained=trained) == 16064
    assert all(p.grad is None for p in trained.parameters())


def test_a_module_that_cannot_be_counted_gives_none_and_says_why(capsys):
    class Broken(SpiralMLP):
        def training_step(self, batch, batch_idx):
            raise RuntimeError("needs the trainer")

    assert flops.count(Broken, SPIRAL, (torch.randn(4, 2), torch.zeros(4, dtype=torch.long)), 4, "32-true") is None
    assert "could not count FLOPs (RuntimeError: needs the trainer); MFU will be n/a" in capsys.readouterr().out


def test_the_analytic_check_flags_a_disagreement():
    assert flops.check_analytic(16064, 16064) is None
    assert flops.check_analytic(None, 16064) is None and flops.check_analytic(16064, None) is None
    assert "says 20,000" in flops.check_analytic(16064, 20000)


@pytest.mark.parametrize("name, precision, peak", [
    ("NVIDIA A100-SXM4-80GB", "bf16-mixed", 312.0),
    ("NVIDIA A100-SXM4-80GB", "32-true", 19.5),
    ("NVIDIA H100 80GB HBM3", "16-mixed", 989.5),  # the SXM5 card, as the driver names it
    ("NVIDIA H100 80GB HBM3", "bf16-mixed", 989.5),  # dense: half the datasheet's 1,979 sparse figure
    ("NVIDIA H100 PCIe", "bf16-mixed", 756.5),
    ("NVIDIA H100 NVL", "bf16-mixed", 835.5),
    ("NVIDIA H200", "bf16-mixed", 989.5),
    ("NVIDIA H200 NVL", "bf16-mixed", 835.5),  # a 600 W card: not the SXM's 989.5
    ("NVIDIA H200 NVL", "32-true", 60.0),
    ("NVIDIA GH200 480GB", "bf16-mixed", 989.5),
    ("NVIDIA L4", "bf16-mixed", 121.0),
    ("NVIDIA L40S", "bf16-mixed", 362.05),  # not the L4's row
    ("NVIDIA A100 80GB PCIe", "32-true", 19.5),
    ("Tesla V100-SXM2-32GB", "16-mixed", 125.0),
    ("Tesla V100-SXM2-32GB", "bf16-mixed", None),  # no bf16 on V100
    ("Tesla V100-PCIE-16GB", "16-mixed", 112.0),  # not the SXM2's 125
    ("Tesla V100-PCIE-16GB", "32-true", 14.0),
    ("Tesla V100S-PCIE-32GB", "32-true", 16.4),
    ("Tesla V100-FHHL-16GB", "32-true", None),  # its own clocks: unknown, not the SXM2's
    # 64-true: the FP64 (Tensor Core) peak, not FP32's; n/a where the datasheet states none
    ("NVIDIA A100-SXM4-80GB", "64-true", 19.5),
    ("NVIDIA H100 PCIe", "64-true", 51.0),
    ("Tesla V100-SXM2-32GB", "64-true", 7.8),
    ("NVIDIA L4", "64-true", None),
    ("cpu, simulated", "32-true", None),
])
def test_peak_by_device_and_precision(name, precision, peak):
    assert peaks.peak_tflops(name, precision) == peak


HIGHEST = {"float32_matmul_precision": "highest", "cuda_matmul_allow_tf32": False, "cudnn_allow_tf32": True}
HIGH = {**HIGHEST, "float32_matmul_precision": "high", "cuda_matmul_allow_tf32": True}
H100 = "NVIDIA H100 80GB HBM3"


def test_float32_under_tf32_is_held_to_the_tf32_peak():
    # the transformer's step at 100 TFLOP/s on one H100: 149% of FP32's 67, 20% of TF32's 494.5
    strict = flops.utilisation(1e9, 100_000.0, 1, H100, "32-true", float32=HIGHEST, conv_share=0.0)
    assert strict["peak_tflops_per_device"] == 67.0 and strict["peak_precision"] == "32"
    tf32 = flops.utilisation(1e9, 100_000.0, 1, H100, "32-true", float32=HIGH, conv_share=0.0)
    assert tf32["peak_tflops_per_device"] == 494.5 and tf32["peak_precision"] == "tf32"
    assert tf32["mfu"] == pytest.approx(100.0 / 494.5)
    medium = {**HIGHEST, "float32_matmul_precision": "medium"}  # allow_tf32 not read back: still TF32
    assert flops.utilisation(1e9, 1e5, 1, H100, "32-true", float32=medium)["peak_precision"] == "tf32"
    # cuDNN's TF32 (on by default) speeds convolutions only
    convnet = flops.utilisation(1e9, 1e5, 1, H100, "32-true", float32=HIGHEST, conv_share=1.0)
    assert convnet["peak_tflops_per_device"] == 494.5 and convnet["peak_precision"] == "tf32"
    half = peaks.peak_tflops(H100, "32-true", matmul_tf32=False, conv_tf32=True, conv_share=0.5)
    assert half == pytest.approx(1 / (0.5 / 67.0 + 0.5 / 494.5))  # the time both halves take at peak
    assert peaks.peak_name(H100, "32-true", False, True, 0.5) == "tf32+32"
    # Volta has no TF32: FP32 whatever torch allows; bf16 is bf16 whatever the float32 settings
    assert peaks.peak_tflops("Tesla V100-SXM2-32GB", "32-true", True, True, 0.5) == 15.7
    assert flops.utilisation(1e9, 1e5, 1, H100, "bf16-mixed", float32=HIGH)["peak_precision"] == "bf16"


def test_the_float32_settings_are_read_from_torch():
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("high")
        record = flops.float32_record()
        assert record["float32_matmul_precision"] == "high" and record["cuda_matmul_allow_tf32"] is True
        torch.set_float32_matmul_precision("highest")
        assert flops.float32_record()["cuda_matmul_allow_tf32"] is False
        assert flops.float32_record()["cudnn_allow_tf32"] == torch.backends.cudnn.allow_tf32
    finally:
        torch.set_float32_matmul_precision(before)


def test_the_flops_callback_records_the_float32_settings_training_ran_under():
    from types import SimpleNamespace

    from ddpscale.job.callbacks import FlopsCount, RunCallbacks

    counter = FlopsCount("{}", "32-true")
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("high")  # as a user's module does in __init__ or setup
        counter.on_train_epoch_end(SimpleNamespace(global_rank=0), None)
    finally:
        torch.set_float32_matmul_precision(before)
    counter.record.update(flops_per_sample=1e9, flops_conv_share=0.0)
    run = RunCallbacks(timing=None, stop=None, placement=SimpleNamespace(summary=dict),
                       gpu=SimpleNamespace(record={}), flops=counter, probe=None,
                       checkpoint=SimpleNamespace(record=dict), windows=None)
    out = run.record(1, 100_000.0, H100, "32-true")
    assert out["float32_matmul_precision"] == "high" and out["cuda_matmul_allow_tf32"] is True
    assert out["peak_precision"] == "tf32" and out["mfu"] == pytest.approx(100.0 / 494.5)


class TinyConvNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 2, 3)
        self.head = torch.nn.Linear(2 * 4 * 4, 2)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.head(self.conv(x).flatten(1)), y)


def test_the_count_splits_out_convolutions():
    batch = (torch.randn(3, 1, 6, 6), torch.zeros(3, dtype=torch.long))
    per_sample, conv_share = flops.training_flops(TinyConvNet(), batch, 3)
    # conv forward 2*(2*4*4)*(1*3*3) = 576 per sample, its weight gradient the same (input needs none)
    conv = 2 * 576
    linear = 2 * 32 * 2 * 2  # forward and weight gradient; the input gradient goes to the conv
    linear += 2 * 32 * 2
    assert per_sample == conv + linear and conv_share == pytest.approx(conv / (conv + linear))
    mlp = SpiralMLP(hidden=[16], dropout=0.0, input_dim=8, num_classes=4)
    assert flops.training_flops(mlp, (torch.randn(5, 8), torch.randint(0, 4, (5,))), 5)[1] == 0.0


def test_utilisation_over_all_devices():
    out = flops.utilisation(1e9, 100_000.0, 4, "NVIDIA A100-SXM4-80GB", "bf16-mixed")
    assert out["achieved_tflops"] == pytest.approx(100.0)
    assert out["mfu"] == pytest.approx(100.0 / (312.0 * 4)) and out["peak_precision"] == "bf16"
    cpu = flops.utilisation(1e9, 100_000.0, 1, "cpu, simulated", "32-true")
    assert cpu == {"achieved_tflops": pytest.approx(100.0), "peak_tflops_per_device": None,
                   "peak_precision": None, "mfu": None}
    assert flops.utilisation(None, 100.0, 1, "x", "32")["achieved_tflops"] is None


def test_an_mfu_above_one_is_named_as_a_figure_not_to_trust():
    import pandas as pd

    from ddpscale.report.html_tables import _mfu
    from ddpscale.report.verdict import mfu_over_one_note

    runs = pd.DataFrame([
        {"topology": "1x1", "repeat": 0, "world_size": 1, "mfu": 1.49, "peak_tflops_per_device": 67.0,
         "peak_precision": "32", "device_name": H100, "precision": "32-true"},
        {"topology": "1x2", "repeat": 0, "world_size": 2, "mfu": 0.4, "peak_tflops_per_device": 989.5,
         "peak_precision": "bf16", "device_name": H100, "precision": "bf16-mixed"}])
    note = mfu_over_one_note(runs)
    assert note.startswith("MFU above 100% (1x1 repeat 0 at 149% of 67 TFLOP/s per device (32 peak) on "
                           "NVIDIA H100 80GB HBM3, 32-true)") and "Do not trust" in note and "1x2" not in note
    assert mfu_over_one_note(runs[runs["topology"] == "1x2"]) is None
    assert _mfu(1.49, "32") == '<span class="failed">149.0% (32): over 100%, see caveats</span>'
    assert _mfu(0.4, "bf16") == "40.0% (bf16)" and _mfu(None, None) == "n/a"
