"""The built-in model of seed 004: an MLP on 2-D points. Logs what the report needs."""

from __future__ import annotations

import pytorch_lightning as pl
import torch
from torch import nn


class SpiralMLP(pl.LightningModule):
    def __init__(self, hidden: list[int] = (64, 32, 16), dropout: float = 0.2, lr: float = 1e-3,
                 input_dim: int = 2, num_classes: int = 2):
        super().__init__()
        self.save_hyperparameters()
        layers, width = [], input_dim
        for size in hidden:
            layers += [nn.Linear(width, size), nn.ReLU(), nn.Dropout(dropout)]
            width = size
        layers.append(nn.Linear(width, num_classes))
        self.net = nn.Sequential(*layers)
        self.loss = nn.CrossEntropyLoss()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        # No per-step self.log: a logged value costs a host sync on GPU at every step.
        return self.loss(self(x), y)

    def _evaluate(self, batch, prefix: str) -> None:
        x, y = batch
        logits = self(x)
        acc = (logits.argmax(dim=1) == y).float().mean()
        # sync_dist: every rank reports the same, all-shard value
        self.log(f"{prefix}_loss", self.loss(logits, y), sync_dist=True)
        self.log(f"{prefix}_acc", acc, sync_dist=True)

    def validation_step(self, batch, batch_idx):
        self._evaluate(batch, "val")

    def test_step(self, batch, batch_idx):
        self._evaluate(batch, "test")

    def flops_per_sample(self) -> int:
        """Analytic training FLOPs per sample (matrix multiplies, 2 per multiply-add): forward
        and weight gradients for every layer, input gradients for all but the first (the data
        needs none). The pipeline checks torch's count against this."""
        weights = [layer.in_features * layer.out_features for layer in self.net if isinstance(layer, nn.Linear)]
        return 6 * sum(weights) - 2 * weights[0]

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
