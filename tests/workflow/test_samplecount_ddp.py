"""Every sample counted once by real DDP training on CPU (tests/unit/job/measure/test_samplecount.py has the
counting itself): three ranks read splits they cannot divide, DistributedSampler pads each with
repeats, and the throughput and accuracy count every sample once."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import pytorch_lightning as pl
import torch

from ddpscale.core.spiral import split_sizes, write_dataset
from ddpscale.workloads.models import SpiralMLP

from helpers.training import launched, throughput
from helpers.workflow import ROOT

SPLIT = [0.7, 0.15, 0.15]


@pytest.fixture(scope="module")
def odd_data(tmp_path_factory) -> tuple[str, dict]:
    """Splits that three ranks cannot divide: DistributedSampler pads each with 2 repeats."""
    folder = tmp_path_factory.mktemp("odd")
    samples = 1008
    sizes = split_sizes(samples, SPLIT)
    assert all(size % 3 == 1 for size in sizes.values()), sizes
    write_dataset(str(folder / "data.npz"), str(folder / "manifest.json"), samples, 0.2, 7, SPLIT)
    return str(folder / "data.npz"), sizes


def train(tmp_path: Path, data_file: str, devices: int, data_args: str) -> dict:
    # lr 0: the weights stay those seed 0 gives SpiralMLP, so this test can rebuild them
    command = [sys.executable, str(ROOT / "scripts/train.py"), "--topology", f"1x{devices}", "--num-nodes", "1",
               "--devices-per-node", str(devices),
               *throughput(), "--accelerator", "cpu", "--max-epochs", "2", "--warmup-epochs", "0",
               "--scaling", "weak", "--batch-size", "16", "--seed", "0",
               "--model-class", "ddpscale.workloads.models.SpiralMLP", "--model-args", '{"lr": 0.0}',
               "--data-class", "ddpscale.workloads.spiral_datamodule.SpiralDataModule", "--data-file", data_file,
               "--data-args", data_args,
               "--ckpt-dir", str(tmp_path / "ckpt"), "--metrics", str(tmp_path / "metrics.json")]
    result = subprocess.run(launched(command, 1, devices), capture_output=True, text=True, timeout=200, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads((tmp_path / "metrics.json").read_text())


def one_process_accuracy(data_file: str, split: str) -> float:
    """The accuracy of the run's weights, every sample once, in this one process."""
    pl.seed_everything(0, verbose=False)
    model = SpiralMLP(lr=0.0).eval()
    arrays = np.load(data_file)
    with torch.no_grad():
        predicted = model(torch.from_numpy(arrays[f"x_{split}"])).argmax(dim=1)
    return (predicted == torch.from_numpy(arrays[f"y_{split}"])).double().mean().item()


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("data_args", ["{}", '{"resident": true}'])
def test_three_ranks_count_every_sample_once(tmp_path, odd_data, data_args):
    data_file, sizes = odd_data
    expected = {split: one_process_accuracy(data_file, split) for split in ("val", "test")}
    started = time.perf_counter()
    single = train(tmp_path / "1x1", data_file, 1, data_args)
    three = train(tmp_path / "1x3", data_file, 3, data_args)
    print(f"1x1 and 1x3 trained in {time.perf_counter() - started:.1f} s")
    # the rebuilt weights are the run's: the one-process run agrees with them
    assert single["test_acc"] == pytest.approx(expected["test"], abs=1e-6)
    assert three["world_size"] == 3
    for run in (single, three):
        assert run["steady_samples"] == 2 * sizes["train"]  # two epochs, no repeat counted
        assert run["throughput_samples_s"] == pytest.approx(run["steady_samples"] / run["steady_time_s"])
    # 1x3 pads test and val by 2 repeats each; each sample once gives the one-process accuracy
    assert three["test_acc"] == pytest.approx(expected["test"], abs=1e-6)
    assert three["val_acc"] == pytest.approx(expected["val"], abs=1e-6)
