"""torch.compile as a run setting, compiled for real: the methods Lightning compiles are the ones
restored for FLOP counting, recompilations are counted, and compiled runs train, DDP included
(the compiler checks, the collective timeout while compiling, and the one-line errors:
tests/unit/job/device/test_compiling.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from helpers import system_tools
from helpers.training import launched, run_user_module, throughput
from helpers.workflow import ROOT
from ddpscale.job.device import compiling
from ddpscale.workloads.models import SpiralMLP


def test_wrap_compiles_the_steps_in_place_and_unwrap_restores_them():
    model = SpiralMLP()
    assert compiling.wrap(model, "none") is model and compiling.unwrap(model) is model
    eager_forward = model.forward
    wrapped = compiling.wrap(model, "default")
    assert wrapped is model, "Lightning and the probe need the LightningModule itself"
    assert model._compiler_ctx is not None and model.forward != eager_forward
    assert compiling.unwrap(model).forward == eager_forward and model._compiler_ctx is None


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_compiled_two_rank_run_trains_and_counts_eager_flops(tmp_path, data_file):
    system_tools.require(("g++",), "g++")  # Inductor's CPU kernels are C++

    train = [sys.executable, str(ROOT / "scripts/train.py"), "--topology", "1x2", "--num-nodes", "1",
             "--devices-per-node", "2", *throughput(), "--accelerator", "cpu", "--threads", "1", "--max-epochs", "2",
             "--scaling", "weak", "--batch-size", "32", "--compile", "default",
             "--model-class", "ddpscale.workloads.models.SpiralMLP",
             "--data-class", "ddpscale.workloads.spiral_datamodule.SpiralDataModule", "--data-file", data_file,
             "--data-args", '{"resident": true}',
             "--ckpt-dir", str(tmp_path / "ckpt"), "--metrics", str(tmp_path / "metrics.json")]
    done = subprocess.run(launched(train, 1, 2), capture_output=True, text=True, timeout=280, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["compile"] == "default" and metrics["world_size"] == 2
    assert metrics["compile_graphs"] >= 1, "dynamo compiled nothing: the model ran eagerly"
    assert metrics["flops_per_sample"] == 16064  # counted on the restored eager methods
    # one training shape under compile: the partial last batch is dropped (13 x 32 per rank)
    assert metrics["steady_samples"] == 2 * 13 * 32 and metrics["test_acc"] > 0.5
    assert isinstance(metrics["compile_recompiles"], int)
    assert not any("expected 32, actual 4" in r for r in metrics["compile_recompile_reasons"])


def test_recompilations_are_counted_with_their_reason():
    system_tools.require(("g++",), "g++")
    import torch

    from ddpscale.job.device import compiling

    before = compiling.stats()["compile_recompiles"]
    step = torch.compile(lambda x: torch.relu(x) * 3)
    for rows in (8, 8, 5):  # a partial last batch: a new shape, compiled again
        step(torch.randn(rows, 4))
    after = compiling.stats()
    assert after["compile_recompiles"] == before + 1
    assert any("size mismatch" in reason for reason in after["compile_recompile_reasons"])


SLOW_RANK = '''
import time

from ddpscale.workloads.models import SpiralMLP


class SlowFirstStepOnRank1(SpiralMLP):
    """Rank 1 starts its first step {delay} s after rank 0, as a rank whose compilation (max-autotune
    tries many kernels) ends minutes after another's; rank 0 waits for it in DDP's all-reduce."""

    def on_train_batch_start(self, batch, batch_idx):
        if self.trainer.global_rank == 1 and self.trainer.global_step == 0:
            time.sleep({delay})
'''


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_rank_compiling_longer_than_the_collective_timeout_does_not_end_the_run(tmp_path, data_file):
    system_tools.require(("g++",), "g++")
    done = run_user_module(tmp_path, SLOW_RANK.format(delay=12), "slowrank.SlowFirstStepOnRank1", data_file,
                           "--threads", "1", "--compile", "default", "--collective-timeout-s", "5",
                           "--compile-timeout-s", "240", "--data-args", '{"resident": true}', devices=2)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((tmp_path / "metrics.json").read_text())["world_size"] == 2


def test_a_compiled_modules_logging_runs_eagerly_and_its_copy_logs_to_itself():
    import copy

    model = compiling.wrap(SpiralMLP(), "default")
    assert model.log.__self__ is model and model.log_dict.__self__ is model
    twin = copy.deepcopy(model)  # the probe trains a copy: its logs must not reach the original
    assert twin.log.__self__ is twin and twin.log_dict.__self__ is twin


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_logging_metric_names_in_compiled_steps_does_not_recompile(tmp_path):
    """The first H100 run: the transformer logged val_loss and val_acc inside its compiled
    validation_step, dynamo traced self.log, and each name was a guard: 3 recompilations."""
    system_tools.require(("g++",), "g++")
    model_args = {"vocab_size": 256, "seq_len": 64, "d_model": 64, "n_layers": 2, "n_heads": 2, "lr": 0.003}
    data_args = {"vocab_size": 256, "seq_len": 64, "steps_per_epoch": 10, "val_batches": 2, "test_batches": 2,
                 "branching": 4, "seed": 0}
    train = [sys.executable, str(ROOT / "scripts/train.py"), "--topology", "1x1", "--num-nodes", "1",
             "--devices-per-node", "1", *throughput(),
             "--accelerator", "cpu", "--max-epochs", "2", "--scaling", "weak", "--batch-size", "8",
             "--compile", "default", "--model-class", "ddpscale.workloads.transformer.TransformerLM",
             "--model-args", json.dumps(model_args), "--data-class", "ddpscale.workloads.markov_datamodule.MarkovTokens",
             "--data-args", json.dumps(data_args),
             "--ckpt-dir", str(tmp_path / "ckpt"), "--metrics", str(tmp_path / "metrics.json")]
    done = subprocess.run(train, capture_output=True, text=True, timeout=280, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["compile_recompiles"] == 0, metrics["compile_recompile_reasons"]
    assert metrics["test_acc"] > 0 and metrics["val_acc"] > 0, "the logged metrics still arrive"


MANUAL = '''
from ddpscale.workloads.models import SpiralMLP


class ManualSpiral(SpiralMLP):
    """Manual optimisation as Lightning's guide writes it, returning its loss."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        optimizer = self.optimizers()
        loss = super().training_step(batch, batch_idx)
        optimizer.zero_grad()
        self.manual_backward(loss)
        optimizer.step()
        return loss
'''


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_on_a_gpu_manual_optimisation_trains_under_cuda_graphs(tmp_path, data_file):
    """compile: reduce-overhead replays CUDA graphs whose outputs the next replay overwrites;
    Lightning's manual loop hands the loss on uncloned (the CPU twin: test_timing.py)."""
    from helpers.devices import require_cuda

    require_cuda()
    done = run_user_module(tmp_path, MANUAL, "manualmod.ManualSpiral", data_file, "--accelerator", "gpu",
                           "--max-epochs", "3", "--compile", "reduce-overhead", "--data-args", '{"resident": true}')
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["compile"] == "reduce-overhead" and metrics["device_kind"] == "cuda"
    assert metrics["steady_samples"] == 2 * 26 * 32 and metrics["throughput_samples_s"] > 0
    assert metrics["test_acc"] > 0.5


KEEPS_OUTPUT = '''
from ddpscale.workloads.models import SpiralMLP


class KeepsOutput(SpiralMLP):
    """Fails as a module keeping a CUDA-graph output does, where no GPU can replay one."""

    def validation_step(self, batch, batch_idx):
        raise RuntimeError("Error: accessing tensor output of CUDAGraphs that has been overwritten by a "
                           'subsequent run. Stack trace: File "/u/mine.py", line 7, in validation_step')
'''


def test_the_training_job_ends_with_that_line_not_a_traceback(tmp_path, data_file):
    done = run_user_module(tmp_path, KEEPS_OUTPUT, "keeps.KeepsOutput", data_file, timeout=200)
    assert done.returncode == 3, done.stderr[-3000:]
    assert done.stderr.strip().splitlines()[-1] == (
        "ddpscale train: compile: reduce-overhead replays CUDA graphs, and the next replay overwrote a tensor "
        "that the module kept from a compiled step (mine.py:7 in validation_step); keep a copy (.clone()) of "
        "what it holds across steps, or set compile: default in the config")


COMPILES_ITSELF = '''
import torch

from ddpscale.workloads.models import SpiralMLP


class CompilesItself(SpiralMLP):
    """Compiles a part of itself in configure_model, idempotent as Lightning's docs ask (the
    hook runs again for the test pass)."""

    def configure_model(self):
        if not getattr(self, "compiled", False):
            self.net = torch.compile(self.net)
            self.compiled = True
'''


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_module_that_compiles_itself_is_said_to_be_compiled(tmp_path, data_file):
    system_tools.require(("g++",), "g++")
    done = run_user_module(tmp_path, COMPILES_ITSELF, "selfcompiled.CompilesItself", data_file, "--max-epochs", "1")
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    # config compile is none, and the report would have said so
    assert metrics["compile"] == compiling.BY_THE_MODULE and metrics["compile_graphs"] >= 1
    assert compiling.said("none", SpiralMLP()) == "none" and compiling.said("default", SpiralMLP()) == "default"
