"""Samples counted from what the loader yields (ddpscale.job.measure.samplecount), end to end:
a user's module whose batches are sequence-first trains on 1x1 and 1x2, and every figure per
sample rests on the true number of samples, or is n/a with the reason, never a wrong one.

The data: 100 samples, batch 16 per device, each batch (time 7, batch, features) with its
targets (time 7, batch): dimension 0 of every tensor is time, so a count by structure says 7.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pandas as pd
import pytest

from helpers.training import (assert_counted, epoch_truth, launched, loader_sizes, run_user_module, shard_flags,
                              throughput)
from helpers.workflow import ROOT

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
    from ddpscale.job.device import flops

    namespace: dict = {}
    exec(SEQUENCE_FIRST, namespace)
    one = namespace["time_first"]([namespace["SeqData"]().data[0]])
    return flops.training_flops_per_sample(namespace["SeqModel"](), one, 1)


@pytest.mark.parametrize("measure", ["full", "throughput"])
def test_an_undeclared_sequence_first_batch_is_na_with_the_reason(tmp_path, data_file, measure):
    from helpers.records import build

    m = train(tmp_path, data_file, 1, "--measure", measure, *throughput(window_steps=2, min_windows=2))
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


# -- several training loaders, and a batch sampler of the user's own (tests/fixtures/usermods) --

def train_usermod(tmp_path, devices: int, model: str, data: str, data_args: str = "{}") -> dict:
    """train.py on a usermods fixture (full mode, 2 epochs, batch 16 per device)."""
    command = [sys.executable, str(ROOT / "scripts/train.py"), "--topology", f"1x{devices}", "--num-nodes", "1",
               "--devices-per-node", str(devices),
               *throughput(), "--accelerator", "cpu", "--max-epochs", "2", "--warmup-epochs", "0",
               "--scaling", "weak", "--batch-size", "16", "--seed", "0", "--measure", "full",
               "--model-class", f"usermods.{model}", "--data-class", f"usermods.{data}", "--data-args", data_args,
               "--ckpt-dir", str(tmp_path / "ckpt"), "--metrics", str(tmp_path / "metrics.json")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests/fixtures"), str(ROOT / "scripts")])}
    done = subprocess.run(launched(command, 1, devices), capture_output=True, text=True, timeout=240, cwd=ROOT,
                          env=env, check=False)
    out = done.stdout + done.stderr
    if not (tmp_path / "metrics.json").exists():
        return {"_rc": done.returncode, "_out": out}
    return json.loads((tmp_path / "metrics.json").read_text()) | {"_rc": done.returncode, "_out": out}


@pytest.mark.parametrize("devices, mode", [(1, None), (2, None), (2, "min_size"), (2, "max_size")])
def test_every_training_loader_is_counted_as_lightning_combines_them(tmp_path, devices, mode):
    """A dict of a labeled and an unlabeled loader (Lightning combines it, max_size_cycle), or the
    data module's own CombinedLoader: every loader's samples are counted, a cycling loader's again
    each time it starts again, a padding repeat apart, and the throughput is all of them."""
    m = train_usermod(tmp_path, devices, "multiloader.SemiSupervised", "multiloader.LabeledAndUnlabeled",
                      json.dumps({"mode": mode}))
    assert m["_rc"] == 0, m["_out"][-3000:]
    real, padding = epoch_truth(loader_sizes(), devices, mode or "max_size_cycle")
    assert_counted(m, m["_out"], per_epoch=real)
    assert m["samples_per_epoch"] == real and m["padding_per_epoch"] == padding
    assert m["train_loaders_mode"] == (mode or "max_size_cycle")
    assert [each["name"] for each in m["train_loaders"]] == ["labeled", "unlabeled"]
    assert sum(each["samples_per_epoch"] for each in m["train_loaders"]) == real
    assert "ddpscale: samples: every training loader's samples count" in m["_out"]


def test_fit_refuses_a_sequential_combined_loader_in_one_line(tmp_path):
    m = train_usermod(tmp_path, 1, "multiloader.SemiSupervised", "multiloader.LabeledAndUnlabeled",
                      '{"mode": "sequential"}')
    assert m["_rc"] != 0 and "schema_version" not in m
    lines = [line for line in m["_out"].splitlines() if line.startswith("ddpscale train:")]
    assert lines and 'does not support the `CombinedLoader(mode="sequential")` mode' in lines[0]


@pytest.mark.parametrize("devices", [1, 2])
def test_a_bucketing_batch_sampler_counts_each_sample_once_and_padding_apart(tmp_path, devices):
    """A length-bucketing BatchSampler around a DistributedSampler, a padding collate returning
    (padded, lengths, y): 303 samples an epoch on any world size; on two ranks one padding repeat."""
    from fixtures.usermods.bucketing import BucketedSequences

    n = BucketedSequences(batch_size=16).train_samples
    m = train_usermod(tmp_path, devices, "bucketing.SequenceClassifier", "bucketing.BucketedSequences")
    assert m["_rc"] == 0, m["_out"][-3000:]
    assert_counted(m, m["_out"], per_epoch=n)
    assert m["samples_per_epoch"] == n
    assert m["padding_per_epoch"] == sum(not flag for r in range(devices) for flag in shard_flags(n, devices, r))
