"""Samples counted from what the loader yields (ddpscale.job.samplecount), end to end:
a user's module whose batches are sequence-first trains on 1x1 and 1x2, and every figure per
sample rests on the true number of samples, or is n/a with the reason, never a wrong one.

The data: 100 samples, batch 16 per device, each batch (time 7, batch, features) with its
targets (time 7, batch): dimension 0 of every tensor is time, so a count by structure says 7.
"""
from __future__ import annotations

import json

import pandas as pd
import pytest

from conftest import assert_counted, run_user_module

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

SEQUENCE_FIRST = '''
import torch
import pytorch_lightning as pl
from torch.utils.data import DataLoader, TensorDataset

N, T, F = 100, 7, 3


def time_first(samples):
    x = torch.stack([s[0] for s in samples], dim=1)  # (T, B, F)
    y = torch.stack([s[1] for s in samples], dim=1)  # (T, B)
    return x, y


class SeqData(pl.LightningDataModule):
    def __init__(self, batch_size: int = 16, **_):
        super().__init__()
        self.batch_size = batch_size
        g = torch.Generator().manual_seed(0)
        self.data = TensorDataset(torch.randn(N, T, F, generator=g), torch.randn(N, T, generator=g))

    def train_dataloader(self):
        return DataLoader(self.data, batch_size=self.batch_size, shuffle=True, collate_fn=time_first)

    def val_dataloader(self):
        return DataLoader(self.data, batch_size=self.batch_size, collate_fn=time_first)


class SeqModel(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.rnn = torch.nn.GRU(F, 8)  # sequence-first, as torch's RNNs are by default
        self.head = torch.nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        out, _ = self.rnn(x)
        return torch.nn.functional.mse_loss(self.head(out).squeeze(-1), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        out, _ = self.rnn(x)
        self.log("val_loss", torch.nn.functional.mse_loss(self.head(out).squeeze(-1), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)
'''


def train(tmp_path, data_file, devices: int, *flags: str) -> dict:
    done = run_user_module(tmp_path, SEQUENCE_FIRST, "seqfirst.SeqModel", data_file, "--data-class",
                           "seqfirst.SeqData", "--batch-size", "16", "--max-epochs", "3", "--measure", "full",
                           *flags, devices=devices)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((tmp_path / "metrics.json").read_text()) | {"_out": done.stdout + done.stderr}


@pytest.mark.parametrize("devices", [1, 2])
def test_a_declared_batch_dimension_counts_every_sample_once(tmp_path, data_file, devices):
    m = train(tmp_path, data_file, devices, "--batch-dim", "1")
    assert_counted(m, m["_out"], per_epoch=100)
    assert m["samples_trained"] == 300
    # FLOPs per sample on the loader's first batch of 16 sequences: those of one sequence
    assert m["flops_per_sample"] == pytest.approx(one_sequence_flops(), rel=0.01)


def one_sequence_flops() -> float:
    from ddpscale.job import flops

    namespace: dict = {}
    exec(SEQUENCE_FIRST, namespace)
    one = namespace["time_first"]([namespace["SeqData"]().data[0]])
    return flops.training_flops_per_sample(namespace["SeqModel"](), one, 1)


@pytest.mark.parametrize("measure", ["full", "throughput"])
def test_an_undeclared_sequence_first_batch_is_na_with_the_reason(tmp_path, data_file, measure):
    from test_projection import build

    m = train(tmp_path, data_file, 1, "--measure", measure, "--window-steps", "2", "--min-windows", "2")
    assert "samples not counted" in m["_out"] and "batch.dim" in m["_out"]
    assert m["samples_uncounted"] and "7 along dimension 0" in m["samples_uncounted"]
    assert m["throughput_samples_s"] is None and m["samples_trained"] is None and m["mfu"] is None
    assert m["window_throughput_samples_s"] is None and m["throughput_half_width"] is None
    data = build([m | {"_out": None}])
    row = data.summary.iloc[0]
    assert pd.isna(row["throughput_samples_s"])
    assert "samples not counted: the train loader gives batch 0 of this rank 16 samples" in row["caveats"]


IGNORES_BATCH_SIZE = SEQUENCE_FIRST.replace(
    "return DataLoader(self.data, batch_size=self.batch_size, shuffle=True, collate_fn=time_first)",
    "return DataLoader(self.data, batch_size=10, shuffle=True, collate_fn=time_first)")


@pytest.mark.parametrize("devices", [1, 2])
def test_a_data_module_that_ignores_its_batch_size_stops_before_the_probe(tmp_path, data_file, devices):
    """Its loader batches 10 where ddpscale set 16 per device: every figure about the batch
    (scaling, the probe's prediction) would be of another batch. One line, before any step."""
    assert IGNORES_BATCH_SIZE != SEQUENCE_FIRST
    done = run_user_module(tmp_path, IGNORES_BATCH_SIZE, "seqfirst.SeqModel", data_file, "--data-class",
                           "seqfirst.SeqData", "--batch-size", "16", "--batch-dim", "1", "--probe", devices=devices)
    assert done.returncode == 3, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if line.startswith("ddpscale train:")]
    assert lines and "the train dataloader's batch_size is 10, but ddpscale gave the data module a batch per " \
                     "device of 16" in lines[0] and "self.batch_size" in lines[0]
    assert "ddpscale probe:" not in done.stdout and not (tmp_path / "metrics.json").exists()
