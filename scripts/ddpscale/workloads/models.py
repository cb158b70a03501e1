"""The built-in model of the MPCDF Raven tutorial: an MLP on 2-D points. Logs what the report needs."""

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
        self._sums: dict[str, torch.Tensor] = {}  # per split: loss sum, correct, samples

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        # No per-step self.log: a logged value costs a host sync on GPU at every step.
        return self.loss(self(x), y)

    def _evaluate(self, batch, prefix: str) -> None:
        x, y = batch
        logits = self(x)
        sums = torch.stack([self.loss(logits, y).double() * len(y), (logits.argmax(dim=1) == y).sum().double(),
                            torch.tensor(len(y), dtype=torch.float64, device=logits.device)])
        self._accumulate(prefix, sums)

    @torch.compiler.disable
    def _accumulate(self, prefix: str, sums: torch.Tensor) -> None:
        """The running sums, kept across steps as tensors of their own, outside torch.compile:
        with compile: reduce-overhead a compiled step's outputs are CUDA-graph buffers that the
        next replay overwrites (the first H200 run's validation died on it)."""
        self._sums[prefix] = sums + self._sums[prefix] if prefix in self._sums else sums.clone()

    def _log_means(self, prefix: str) -> None:
        """Loss and accuracy over every sample of every rank, each once.

        Ranks evaluate unpadded shards that may differ by a sample (ddpscale.job.measure.samplecount), and
        Lightning 2.6's sync_dist mean divides its integer batch-size sum by the world size
        (truncating), so the sums are all-reduced here instead, once per epoch."""
        sums = self._sums.pop(prefix, None)
        if sums is None:  # a rank without a batch still joins the all-reduce
            sums = torch.zeros(3, dtype=torch.float64, device=self.device)
        sums = self.trainer.strategy.reduce(sums, reduce_op="sum")
        # the same value on every rank already: no sync_dist
        self.log(f"{prefix}_loss", (sums[0] / sums[2]).float())
        self.log(f"{prefix}_acc", (sums[1] / sums[2]).float())

    def validation_step(self, batch, batch_idx):
        self._evaluate(batch, "val")

    def test_step(self, batch, batch_idx):
        self._evaluate(batch, "test")

    def on_validation_epoch_end(self) -> None:
        self._log_means("val")

    def on_test_epoch_end(self) -> None:
        self._log_means("test")

    def flops_per_sample(self) -> int:
        """Analytic training FLOPs per sample (matrix multiplies, 2 per multiply-add): forward
        and weight gradients for every layer, input gradients for all but the first (the data
        needs none). The pipeline checks torch's count against this."""
        # modules(), not the Sequential itself: a module compiled in place (torch.compile) wraps it
        weights = [layer.in_features * layer.out_features for layer in self.net.modules() if isinstance(layer, nn.Linear)]
        return 6 * sum(weights) - 2 * weights[0]

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
