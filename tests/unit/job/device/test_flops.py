"""FLOPs per sample, peaks and MFU (ddpscale.job.device.flops), checked against hand-counted MLPs (the
float32 settings read in fresh processes, and on a GPU: tests/workflow/test_flops.py)."""
import pytest
import torch

from ddpscale.job.device import flops
from ddpscale.workloads.models import SpiralMLP


def test_training_flops_of_an_mlp_match_the_matmuls():
    # Linear(8,16) and Linear(16,4), per sample: forward 2*8*16 + 2*16*4 = 384; backward: the
    # second layer's weight and input gradients (128 + 128), the first layer's weight only
    # (its input needs no gradient): 256. Total 896.
    model = SpiralMLP(hidden=[16], dropout=0.0, input_dim=8, num_classes=4)
    batch = (torch.randn(5, 8), torch.randint(0, 4, (5,)))
    assert flops.training_flops_per_sample(model, batch, 5) == 896
    assert all(p.grad is None for p in model.parameters()), "counting must leave no gradients behind"


class Checkpointed(torch.nn.Module):
    """Linear(8,16), a checkpointed Linear(16,16) + ReLU (whose output backward needs: a Linear
    alone saves only the segment's input, and torch then recomputes nothing), Linear(16,4)."""

    def __init__(self, use_reentrant: bool):
        super().__init__()
        self.a, self.c = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)
        self.b = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU())
        self.use_reentrant = use_reentrant

    def forward(self, x):
        from torch.utils.checkpoint import checkpoint

        return self.c(checkpoint(self.b, self.a(x), use_reentrant=self.use_reentrant))


def counted_step(module, x, backward_hooks: bool = True) -> flops.Counted:
    """One step as FlopsCount counts it in the fit: the counter entered at the batch's start, the
    backward phase marked as Lightning's on_before_backward and on_after_backward mark it."""
    counter = flops.StepCounter()
    counter.start()
    loss = module(x).sum()
    counter.in_backward = backward_hooks
    loss.backward()
    counter.in_backward = False
    return counter.stop(len(x))


@pytest.mark.parametrize("use_reentrant", [False, True])
def test_recomputed_flops_are_told_apart(use_reentrant):
    # per sample: forward 2*(8*16 + 16*16 + 16*4) = 896; backward the weight gradients (896)
    # and the input gradients of b and c (2*(16*16 + 16*4) = 640); b's forward again: 512
    counted = counted_step(Checkpointed(use_reentrant), torch.randn(5, 8))
    assert counted == flops.Counted(flops=5 * (896 + 896 + 640 + 512), recomputed=5 * 512, conv=0, samples=5)
    plain = counted_step(Checkpointed(use_reentrant), torch.randn(5, 8), backward_hooks=False)
    assert plain.recomputed == 0, "outside the backward phase nothing is recomputation"


def test_a_step_without_recomputation_has_none():
    mlp = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))
    assert counted_step(mlp, torch.randn(3, 8)) == flops.Counted(3 * (384 + 384 + 128), 0, 0, 3)


def test_a_formula_that_fails_spoils_the_count_not_the_step():
    counter = flops.StepCounter()
    counter._formulas[torch.ops.aten.mm] = counter._tallying(lambda *a, **k: 1 / 0)
    counter.start()
    out = torch.randn(2, 3) @ torch.randn(3, 4)  # the step goes on
    counter.stop(2)
    assert out.shape == (2, 4) and counter.error == "ZeroDivisionError: division by zero"


def test_per_sample_is_a_ratio_of_sums_with_the_spread():
    # a batch of 10 short sequences and one of 30 long ones: per sample 100 and 400
    counted = [flops.Counted(10 * 100, 0, 0, 10), flops.Counted(30 * 400 + 30 * 50, 30 * 50, 30 * 400, 30)]
    out = flops.summarise(counted)
    assert out["flops_per_sample"] == (1000 + 12000) / 40 and out["flops_recomputed_per_sample"] == 1500 / 40
    assert out["flops_per_sample_min"] == 100 and out["flops_per_sample_max"] == 400 and out["flops_batches"] == 2
    assert out["flops_conv_share"] == 12000 / 14500
    assert flops.summarise([])["flops_per_sample"] is None and flops.summarise([])["flops_batches"] == 0


def test_hfu_counts_the_recomputation_mfu_does_not():
    out = flops.utilisation(1e9, 100_000.0, 1, H100, "bf16-mixed", recomputed_per_sample=5e8)
    assert out["mfu"] == pytest.approx(100.0 / 989.5) and out["hfu"] == pytest.approx(150.0 / 989.5)
    assert flops.utilisation(1e9, 100_000.0, 1, H100, "bf16-mixed", recomputed_per_sample=0.0)["hfu"] is None


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
    assert flops.peak_tflops(name, precision) == peak


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
    half = flops.peak_tflops(H100, "32-true", matmul_tf32=False, conv_tf32=True, conv_share=0.5)
    assert half == pytest.approx(1 / (0.5 / 67.0 + 0.5 / 494.5))  # the time both halves take at peak
    assert flops.peak_name(H100, "32-true", False, True, 0.5) == "tf32+32"
    # Volta has no TF32: FP32 whatever torch allows; bf16 is bf16 whatever the float32 settings
    assert flops.peak_tflops("Tesla V100-SXM2-32GB", "32-true", True, True, 0.5) == 15.7
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

    from ddpscale.job.callbacks import FlopsCount
    from ddpscale.job.measure.samplecount import BatchCounter

    counter = FlopsCount(BatchCounter(), window_steps=10)
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("high")  # as a user's module does in __init__ or setup
        counter.on_train_epoch_end(SimpleNamespace(global_rank=0), None)
    finally:
        torch.set_float32_matmul_precision(before)
    counter.record.update(flops_per_sample=1e9, flops_conv_share=0.0)
    out = counter.section(1, 100_000.0, H100, "32-true")
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
                   "peak_precision": None, "mfu": None, "hfu": None}
    assert flops.utilisation(None, 100.0, 1, "x", "32")["achieved_tflops"] is None


def test_an_mfu_above_one_is_named_as_a_figure_not_to_trust():
    import pandas as pd

    from ddpscale.report.render.html_tables import _mfu
    from ddpscale.report.verdict.caveats import mfu_over_one_note

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


def test_the_report_names_recomputation_varying_flops_and_why_none_were_counted():
    import pandas as pd

    from ddpscale.report.render.html_tables import _mfu
    from ddpscale.report.verdict.caveats import flops_notes

    base = {"world_size": 1, "repeat": 0, "flops_per_sample": 1e6, "flops_recomputed_per_sample": 0.0,
            "flops_per_sample_min": 1e6, "flops_per_sample_max": 1e6, "flops_batches": 8, "flops_reason": None}
    runs = pd.DataFrame([
        {**base, "topology": "1x1"},
        {**base, "topology": "1x2", "world_size": 2, "flops_per_sample_min": 1.19e6, "flops_per_sample_max": 3.54e6},
        {**base, "topology": "2x1", "world_size": 2, "flops_recomputed_per_sample": 2.5e5},
        {**base, "topology": "2x2", "world_size": 4, "flops_per_sample": None, "flops_batches": 0,
         "flops_reason": "samples not counted: the module's samples_in_batch() returned -1"}])
    varying, recomputed, uncounted = flops_notes(runs)
    assert varying.startswith("FLOPs per sample vary from batch to batch (1x2 repeat 0: 1.19e+06 to 3.54e+06 "
                              "over 8 batches)") and "1x1" not in varying
    assert recomputed.startswith("Activation checkpointing recomputed forward work in backward (2x1 repeat 0: "
                                 "2.5e+05 per sample, 25% of the model's)") and "HFU" in recomputed
    assert uncounted == ("FLOPs not counted in 2x2 repeat 0 (samples not counted: the module's samples_in_batch() "
                         "returned -1): TFLOP/s and MFU are n/a there.")
    assert flops_notes(runs.iloc[:1]) == []
    assert _mfu(0.3, "bf16", 0.4) == "30.0% (bf16); HFU 40.0% with recomputation"
    assert _mfu(0.3, "bf16", float("nan")) == "30.0% (bf16)"
