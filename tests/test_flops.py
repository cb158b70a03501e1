"""FLOPs per sample, peaks and MFU (ddpscale.flops), checked against hand-counted MLPs."""
import pytest
import torch

from ddpscale import flops
from ddpscale.models import SpiralMLP


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
    class Data:
        def train_dataloader(self):
            return [(torch.randn(4, 2), torch.randint(0, 2, (4,)))]

    model = LogsInTrainingStep(hidden=[4], dropout=0.0)
    assert flops.count(model, Data()) == (2 * 2 * 4 + 2 * 4 * 2) + (2 * 4 * 2) * 2 + 2 * 2 * 4


@pytest.mark.parametrize("name, precision, peak", [
    ("NVIDIA A100-SXM4-80GB", "bf16-mixed", 312.0),
    ("NVIDIA A100-SXM4-80GB", "32-true", 19.5),
    ("NVIDIA H100 80GB HBM3 SXM", "16-mixed", 989.0),
    ("NVIDIA H100 PCIe", "bf16-mixed", 756.0),
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
