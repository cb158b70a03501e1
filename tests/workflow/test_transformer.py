"""The transformer workload trained: through a real Trainer, through scripts/train.py on 2 ranks,
and its presets through the workflow (its FLOP formula against torch's counter, its size and
its presets: tests/unit/workloads/test_transformer.py; its token stream: test_markov_data.py)."""
from __future__ import annotations

import os
import json
import re
import subprocess
import sys

import pytest
import pytorch_lightning as pl

from helpers.configs import TINY_PRESET, shapes
from helpers.training import launched, throughput
from helpers.workflow import ROOT, SNAKEMAKE, Workspace
from ddpscale.workloads.markov_datamodule import MarkovTokens
from ddpscale.workloads.transformer import TransformerLM, flops_per_sample


# --- (4) the tiny preset learns through a real Trainer ----------------------------------------

class ValHistory(pl.Callback):
    def __init__(self):
        self.history = []

    def on_validation_epoch_end(self, trainer, pl_module):
        self.history.append({k: float(v) for k, v in trainer.callback_metrics.items()})


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_tiny_preset_learns_the_chain_towards_its_floor():
    pl.seed_everything(0, verbose=False)
    data = MarkovTokens(batch_size=TINY_PRESET["batch"]["size"], **TINY_PRESET["data"]["init_args"])
    model = TransformerLM(**TINY_PRESET["model"]["init_args"])
    history = ValHistory()
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=TINY_PRESET["max_epochs"], logger=False,
                         enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                         num_sanity_val_steps=0, callbacks=[history])
    trainer.fit(model, datamodule=data)
    trainer.test(model, datamodule=data, verbose=False)
    first, last = history.history[0], history.history[-1]
    chance = 1 / 256
    assert last["val_acc"] > 0.4 > 50 * chance
    assert last["val_acc"] < data.accuracy_ceiling + 0.02
    assert data.loss_floor - 0.05 < last["val_loss"] < data.loss_floor + 0.2
    assert last["val_loss"] < first["val_loss"]
    assert trainer.callback_metrics["test_acc"] > 0.4


# --- (5) through scripts/train.py on 2 ranks ----------------------------------------------------

@pytest.mark.slow
@pytest.mark.timeout(180)
def test_two_rank_run_of_the_tiny_preset_records_the_analytic_flops(tmp_path):
    model_args = TINY_PRESET["model"]["init_args"]
    data_args = {**TINY_PRESET["data"]["init_args"], "steps_per_epoch": 10}
    train = [sys.executable, str(ROOT / "scripts/train.py"), "--topology", "1x2", "--num-nodes", "1",
             "--devices-per-node", "2", *throughput(),
             "--accelerator", "cpu", "--max-epochs", "2", "--scaling", "strong", "--batch-size", "32",
             "--model-class", "ddpscale.workloads.transformer.TransformerLM", "--model-args", json.dumps(model_args),
             "--data-class", "ddpscale.workloads.markov_datamodule.MarkovTokens", "--data-args", json.dumps(data_args),
             "--ckpt-dir", str(tmp_path / "ckpt"), "--metrics", str(tmp_path / "metrics.json")]
    result = subprocess.run(launched(train, 1, 2), capture_output=True, text=True, timeout=170, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["world_size"] == 2 and metrics["effective_batch"] == 32
    assert metrics["steady_samples"] == 10 * 32  # epoch 2: 10 steps of 16 sequences on each rank
    assert metrics["throughput_samples_s"] > 0
    assert metrics["flops_per_sample"] == flops_per_sample(**shapes(model_args)) == 50_331_648
    assert 0.0 <= metrics["val_acc"] <= 1.0 and 0.0 <= metrics["test_acc"] <= 1.0


# --- the presets as the README says to use them ---------------------------------------------------

def test_preset_on_top_of_config_yaml_passes_only_its_own_init_args(tmp_path):
    # Snakemake merges --configfile into config/config.yaml key by key: the SpiralMLP's `hidden`
    # and the spiral data's `resident` must not leak into the preset's model and data.
    workspace = Workspace(tmp_path / "ws")
    result = subprocess.run([*SNAKEMAKE, "--profile", "profiles/local", "--configfile",
                             "config/transformer_tiny.yaml", "-n", "-p"],
                            cwd=workspace.path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    model_args = re.search(r"'--model-args=([^']*)'", result.stdout + result.stderr).group(1)
    data_args = re.search(r"'--data-args=([^']*)'", result.stdout + result.stderr).group(1)
    assert json.loads(model_args) == TINY_PRESET["model"]["init_args"]
    assert json.loads(data_args) == TINY_PRESET["data"]["init_args"]


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_the_tiny_preset_runs_the_whole_workflow_and_the_report_compares_its_accuracy(tmp_path):
    workspace = Workspace(tmp_path / "ws")
    result = subprocess.run([*SNAKEMAKE, "--profile", "profiles/local", "--configfile",
                             "config/transformer_tiny.yaml", "--config", "topologies=[\"1x1\",\"1x2\"]"],
                            cwd=workspace.path, capture_output=True, text=True, timeout=380,
                            env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert result.returncode == 0, result.stderr[-4000:]
    results = workspace.path / "results/transformer_tiny"  # the preset's own experiment folder
    runs = {t: json.loads((results / f"runs/{t}/r0/metrics.json").read_text()) for t in ("1x1", "1x2")}
    for metrics in runs.values():
        assert metrics["model_class"] == "ddpscale.workloads.transformer.TransformerLM"
        assert metrics["flops_per_sample"] == metrics["flops_per_sample_analytic"]
        assert metrics["test_acc"] > 0.2  # chance is 1/256: the chain was learnt
    assert runs["1x2"]["world_size"] == 2
    scaling = (results / "report/scaling.tsv").read_text()
    assert "1x2" in scaling and "test_acc" in scaling.splitlines()[0]


# --- on a GPU ---------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("compile_mode", ["none", "default"])
def test_on_one_gpu_the_transformer_reports_its_mfu(tmp_path, compile_mode):
    from helpers.devices import require_cuda

    torch_ = require_cuda()
    model_args = {"vocab_size": 8192, "seq_len": 512, "d_model": 512, "n_layers": 4, "n_heads": 8, "lr": 6e-4}
    data_args = {"vocab_size": 8192, "seq_len": 512, "steps_per_epoch": 40, "val_batches": 4, "test_batches": 4,
                 "branching": 4, "seed": 0}
    command = [sys.executable, str(ROOT / "scripts/train.py"), "--topology", "1x1", "--num-nodes", "1",
               "--devices-per-node", "1", *throughput(),
               "--accelerator", "gpu", "--max-epochs", "3", "--scaling", "weak", "--batch-size", "16",
               "--precision", "bf16-mixed", "--compile", compile_mode,
               "--model-class", "ddpscale.workloads.transformer.TransformerLM", "--model-args", json.dumps(model_args),
               "--data-class", "ddpscale.workloads.markov_datamodule.MarkovTokens", "--data-args", json.dumps(data_args),
               "--ckpt-dir", str(tmp_path / "ckpt"), "--metrics", str(tmp_path / "metrics.json")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=290, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["device_kind"] == "cuda" and metrics["world_size"] == 1
    assert metrics["device_name"] == torch_.cuda.get_device_name(0)
    assert metrics["flops_per_sample"] == metrics["flops_per_sample_analytic"] == flops_per_sample(
        **shapes(model_args))
    assert 0 < metrics["mfu"] < 1
    if compile_mode != "none":
        assert metrics["compile_recompiles"] <= 1, metrics["compile_recompile_reasons"]
