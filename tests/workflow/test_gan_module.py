"""A GAN as Lightning's tutorial writes it: manual optimisation (two optimizers, toggled),
`training_step(self, batch)` without batch_idx, a discriminator step whose generator is
detached, so under DDP some parameters get no gradient in a backward and DDP needs
config ddp.find_unused_parameters. It trains on 1x1 and 1x2, and the figures count its real
samples: 96 an epoch, every epoch, whatever the module's own steps do.
"""
from __future__ import annotations

import json

import pytest

from helpers.training import assert_counted, assert_speedup_of, trained_on_one_and_two

# on one xdist worker: each worker would run the module's fixture (real training) again
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("gan-module"), pytest.mark.timeout(300)]

GAN = '''
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

N, LATENT = 96, 4


class Points(pl.LightningDataModule):
    def __init__(self, batch_size: int = 16, **_):
        super().__init__()
        self.batch_size = batch_size
        g = torch.Generator().manual_seed(0)
        angle = torch.rand(N, generator=g) * 6.28
        self.data = TensorDataset(torch.stack([angle.cos(), angle.sin()], dim=1))

    def train_dataloader(self):
        return DataLoader(self.data, batch_size=self.batch_size, shuffle=True)


class GAN(pl.LightningModule):
    def __init__(self, lr: float = 2e-3):
        super().__init__()
        self.save_hyperparameters()
        self.automatic_optimization = False
        self.generator = torch.nn.Sequential(torch.nn.Linear(LATENT, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
        self.discriminator = torch.nn.Sequential(torch.nn.Linear(2, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))

    def training_step(self, batch):
        (real,) = batch
        opt_g, opt_d = self.optimizers()
        z = torch.randn(real.shape[0], LATENT, device=self.device)
        ones = torch.ones(real.shape[0], 1, device=self.device)

        self.toggle_optimizer(opt_g)
        g_loss = F.binary_cross_entropy_with_logits(self.discriminator(self.generator(z)), ones)
        self.manual_backward(g_loss)
        opt_g.step()
        opt_g.zero_grad()
        self.untoggle_optimizer(opt_g)

        self.toggle_optimizer(opt_d)
        fake = self.generator(z).detach()
        d_loss = (F.binary_cross_entropy_with_logits(self.discriminator(real), ones)
                  + F.binary_cross_entropy_with_logits(self.discriminator(fake), torch.zeros_like(ones))) / 2
        self.manual_backward(d_loss)
        opt_d.step()
        opt_d.zero_grad()
        self.untoggle_optimizer(opt_d)
        self.log_dict({"g_loss": g_loss, "d_loss": d_loss})

    def configure_optimizers(self):
        return (torch.optim.Adam(self.generator.parameters(), lr=self.hparams.lr),
                torch.optim.Adam(self.discriminator.parameters(), lr=self.hparams.lr))
'''


@pytest.fixture(scope="module")
def runs(tmp_path_factory, data_file) -> dict:
    return trained_on_one_and_two(tmp_path_factory, GAN, "gan.GAN", data_file, "--data-class", "gan.Points",
                                  "--batch-size", "16", "--accuracy-metric", "",
                                  "--ddp", json.dumps({"find_unused_parameters": True}))


@pytest.mark.parametrize("devices", [1, 2])
def test_a_manual_optimisation_gan_counts_its_real_samples(runs, devices):
    assert_counted(*runs[devices], per_epoch=96)
    m = runs[devices][0]
    assert m["epochs_completed"] == 3 and m["ddp"]["find_unused_parameters"] is True
    assert m["ddp"]["used"] == (devices == 2)


def test_the_report_compares_the_gans_samples(runs):
    assert_speedup_of(runs)
