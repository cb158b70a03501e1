"""FLOPs per sample, peaks and MFU (ddpscale.measurement.flops), checked against hand-counted MLPs."""
import pytest
import torch

from ddpscale.measurement import flops
from ddpscale.workloads.models import SpiralMLP


def test_training_flops_of_an_mlp_match_the_matmuls():
    # Linear(8,16) and Linear(16,4), per sample: forward 2*8*16 + 2*16*4 = 384; backward: the
    # second layer's weight and input gradients (128 + 128), the first layer's weight only
    # (its input needs no gradient): 256. Total 896.
    model = SpiralMLP(hidden=[16], dropout=0.0, input_dim=8, num_classes=4)
    batch = (torch.randn(5, 8), torch.randint(0, 4, (5,)))
    assert flops.training_flops_per_sample(model, batch) == 896
    assert all(p.grad is None for p in model.parameters()), "counting must leave no gradients behind"


class LogsInTrainingStep(SpiralMLP):
    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        self.log("train_loss", loss)
        return {"loss": loss}


def test_count_runs_outside_the_trainer_even_when_the_module_logs():
    batch = (torch.randn(4, 2), torch.randint(0, 2, (4,)))
    args = {"hidden": [4], "dropout": 0.0}
    assert flops.count(LogsInTrainingStep, args, batch, "32-true") == (2 * 2 * 4 + 2 * 4 * 2) + (2 * 4 * 2) * 2 + 2 * 2 * 4


SPIRAL = {"hidden": [64, 32, 16], "dropout": 0.2}


def test_the_reference_workload_counts_its_analytic_flops():
    batch = (torch.randn(32, 2), torch.randint(0, 2, (32,)))
    assert flops.count(SpiralMLP, SPIRAL, batch, "32-true") == 16064 == SpiralMLP(**SPIRAL).flops_per_sample()


def test_a_batch_on_another_device_than_the_trained_module_is_still_counted():
    # The first GPU run: after fit Lightning had moved the module to the CPU while resident
    # batches stayed on cuda:0 ("Expected all tensors to be on the same device"). The meta
    # device reproduces that on a CPU: module here, batch elsewhere.
    trained = SpiralMLP(**SPIRAL)
    batch = (torch.empty(32, 2, device="meta"), torch.empty(32, dtype=torch.long, device="meta"))
    with pytest.raises(RuntimeError):
        trained(batch[0])  # what the old count did
    assert flops.count(SpiralMLP, SPIRAL, batch, "32-true", trained=trained) == 16064


@pytest.mark.parametrize("precision", ["bf16-true", "16-true", "bf16-mixed", "64-true"])
def test_weights_and_inputs_of_other_dtypes_are_counted(precision):
    # bf16-true with a DataLoader failed with "mat1 and mat2 must have the same dtype"
    batch = (torch.randn(32, 2), torch.randint(0, 2, (32,)))
    assert flops.count(SpiralMLP, SPIRAL, batch, precision) == 16064


class NotOnMeta(SpiralMLP):
    """A module that cannot be built on the meta device (it reads a value in __init__)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.scale = float(torch.ones(1).sum().item())


def test_a_module_that_cannot_be_built_on_meta_is_counted_on_the_trained_copy():
    trained = NotOnMeta(**SPIRAL)
    batch = (torch.randn(8, 2), torch.randint(0, 2, (8,)))
    assert flops.count(NotOnMeta, SPIRAL, batch, "32-true", trained=trained) == 16064
    assert all(p.grad is None for p in trained.parameters())


def test_a_module_that_cannot_be_counted_gives_none_and_says_why(capsys):
    class Broken(SpiralMLP):
        def training_step(self, batch, batch_idx):
            raise RuntimeError("needs the trainer")

    assert flops.count(Broken, SPIRAL, (torch.randn(4, 2), torch.zeros(4, dtype=torch.long)), "32-true") is None
    assert "could not count FLOPs (RuntimeError: needs the trainer); MFU will be n/a" in capsys.readouterr().out


def test_the_analytic_check_flags_a_disagreement():
    assert flops.check_analytic(16064, 16064) is None
    assert flops.check_analytic(None, 16064) is None and flops.check_analytic(16064, None) is None
    assert "says 20,000" in flops.check_analytic(16064, 20000)


@pytest.mark.parametrize("name, precision, peak", [
    ("NVIDIA A100-SXM4-80GB", "bf16-mixed", 312.0),
    ("NVIDIA A100-SXM4-80GB", "32-true", 19.5),
    ("NVIDIA H100 80GB HBM3", "16-mixed", 989.0),  # the SXM5 card, as the driver names it
    ("NVIDIA H100 80GB HBM3", "bf16-mixed", 989.0),  # dense, not the 1,979 sparse figure
    ("NVIDIA H100 PCIe", "bf16-mixed", 756.0),
    ("NVIDIA H100 NVL", "bf16-mixed", 835.0),
    ("NVIDIA H200", "bf16-mixed", 989.0),
    ("NVIDIA GH200 480GB", "bf16-mixed", 989.0),
    ("NVIDIA L4", "bf16-mixed", 121.0),
    ("NVIDIA L40S", "bf16-mixed", 362.0),  # not the L4's row
    ("NVIDIA A100 80GB PCIe", "32-true", 19.5),
    ("Tesla V100-SXM2-32GB", "bf16-mixed", None),  # no bf16 on V100
    ("cpu, simulated", "32-true", None),
])
def test_peak_by_device_and_precision(name, precision, peak):
    assert flops.peak_tflops(name, precision) == peak


def test_utilisation_over_all_devices():
    out = flops.utilisation(1e9, 100_000.0, 4, "NVIDIA A100-SXM4-80GB", "bf16-mixed")
    assert out["achieved_tflops"] == pytest.approx(100.0)
    assert out["mfu"] == pytest.approx(100.0 / (312.0 * 4))
    cpu = flops.utilisation(1e9, 100_000.0, 1, "cpu, simulated", "32-true")
    assert cpu == {"achieved_tflops": pytest.approx(100.0), "peak_tflops_per_device": None, "mfu": None}
    assert flops.utilisation(None, 100.0, 1, "x", "32")["achieved_tflops"] is None
