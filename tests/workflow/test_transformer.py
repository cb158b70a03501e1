"""The transformer workload: its FLOP formula against torch's counter, its size, and training
through a real Trainer and through scripts/train.py on 2 ranks (its token stream:
test_markov_data.py)."""
from __future__ import annotations

import copy
import os
import json
import re
import subprocess
import sys

import pytest
import pytorch_lightning as pl
import torch
import yaml
from snakemake.utils import validate
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from conftest import ROOT, SNAKEMAKE, Workspace, launched
from ddpscale.job import flops
from ddpscale.workloads.markov_datamodule import MarkovTokens
from ddpscale.workloads.transformer import TransformerLM, flops_per_sample, flops_per_token, n_params

GPU_PRESET = yaml.safe_load((ROOT / "config/transformer.yaml").read_text())
TINY_PRESET = yaml.safe_load((ROOT / "config/transformer_tiny.yaml").read_text())
SHAPES = ("vocab_size", "seq_len", "d_model", "n_layers", "mlp_ratio", "tie_weights")


def shapes(init_args: dict) -> dict:
    return {k: init_args[k] for k in SHAPES if k in init_args}


def small_model(tie_weights: bool) -> TransformerLM:
    # odd sizes on purpose, so a d/vocab/seq mix-up in the formula cannot cancel out
    return TransformerLM(vocab_size=37, seq_len=11, d_model=24, n_layers=3, n_heads=3, mlp_ratio=3,
                         lr=1e-3, tie_weights=tie_weights)


def token_batch(vocab: int, batch: int, seq: int) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = torch.randint(0, vocab, (batch, seq + 1), generator=torch.Generator().manual_seed(0))
    return tokens[:, :-1], tokens[:, 1:]


# --- (1) FLOPs: the formula is what torch counts --------------------------------------------

@pytest.mark.parametrize("tie_weights", [True, False])
@pytest.mark.parametrize("backend", [SDPBackend.FLASH_ATTENTION, SDPBackend.MATH])
def test_flops_per_token_is_what_flop_counter_mode_counts(tie_weights, backend):
    """FLASH_ATTENTION: the CPU flash kernel (what runs by default), counted by the formula that
    ddpscale.workloads.transformer registers; MATH: torch's own decomposition into matmuls, which
    FlopCounterMode counts unaided."""
    model = small_model(tie_weights)
    x, y = token_batch(37, 5, 11)
    with sdpa_kernel(backend), FlopCounterMode(display=False) as counter:
        model.training_step((x, y), 0).backward()
    per_token = counter.get_total_flops() / x.numel()
    expected = flops_per_token(37, 11, 24, 3, mlp_ratio=3, tie_weights=tie_weights)
    # by hand: matmul weights 3 x (4 + 2 x 3) x 24^2 + 24 x 37 = 18,168 -> 6 x that = 109,008;
    # attention 12 x 3 x 11 x 24 = 9,504
    assert expected == 109_008 + 9_504
    assert per_token == expected


def test_the_pipelines_count_is_the_analytic_one():
    model = small_model(tie_weights=True)
    batch = token_batch(37, 4, 11)
    assert flops.training_flops_per_sample(model, batch, 4) == flops_per_sample(37, 11, 24, 3, 3) == model.flops_per_sample()
    assert all(p.grad is None for p in model.parameters())


# --- (2) the GPU preset: GPT-2 small --------------------------------------------------------

def test_gpu_preset_is_gpt2_small_with_about_124m_parameters():
    args = GPU_PRESET["model"]["init_args"]
    assert shapes(args) == {"vocab_size": 50304, "seq_len": 1024, "d_model": 768, "n_layers": 12,
                            "mlp_ratio": 4, "tie_weights": True}
    with torch.device("meta"):
        model = TransformerLM(**args)
    assert model.n_params() == n_params(**shapes(args)) == 124_475_904
    assert model.lm_head.weight is model.tok_emb.weight
    with torch.device("meta"):
        untied = TransformerLM(**{**args, "tie_weights": False})
    assert untied.n_params() == 124_475_904 + 768 * 50304
    # 6 x (12 x 12 x 768^2 + 768 x 50304) + 12 x 12 x 1024 x 768
    assert flops_per_token(**shapes(args)) == 6 * 123_568_128 + 113_246_208 == 854_654_976
    assert model.flops_per_sample() == 1024 * 854_654_976


def test_presets_agree_with_their_data_and_pass_the_schema():
    shipped = yaml.safe_load((ROOT / "config/config.yaml").read_text())
    for preset in (GPU_PRESET, TINY_PRESET):
        model, data = preset["model"]["init_args"], preset["data"]["init_args"]
        assert model["vocab_size"] == data["vocab_size"] and model["seq_len"] == data["seq_len"]
        config = {**copy.deepcopy(shipped), **copy.deepcopy(preset)}  # model/data replaced whole
        for key in ("batch", "accuracy"):
            config[key] = {**shipped[key], **preset[key]}
        validate(config, str(ROOT / "workflow/schemas/config.schema.yaml"))
        assert config["dataset"]["generator"] == "none" and config["accuracy"]["metric"] == "test_acc"
    assert GPU_PRESET["precision"] == "bf16-mixed" and GPU_PRESET["batch"] == {"scaling": "weak", "size": 16}


def test_weight_decay_only_on_matmul_weights_and_fused_only_on_cuda():
    for tie in (True, False):
        model = small_model(tie)
        optimizer = model.configure_optimizers()
        decay, no_decay = (group["params"] for group in optimizer.param_groups)
        assert [g["weight_decay"] for g in optimizer.param_groups] == [0.1, 0.0]
        assert len({id(p) for p in decay + no_decay}) == len(decay + no_decay) == len(list(model.parameters()))
        matmuls = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]
        assert {id(p) for p in decay} == {id(w) for w in matmuls if w is not model.tok_emb.weight}
        assert id(model.lm_head.weight) in {id(p) for p in (no_decay if tie else decay)}
        assert not optimizer.defaults["fused"]
        assert optimizer.defaults["betas"] == (0.9, 0.95)


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
    train = [sys.executable, str(ROOT / "scripts/train.py"), "--topology", "1x2", "--nodes", "1", "--devices", "2",
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
    model_args = re.search(r"--model-args '([^']*)'", result.stdout + result.stderr).group(1)
    data_args = re.search(r"--data-args '([^']*)'", result.stdout + result.stderr).group(1)
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
    from conftest import require_cuda

    torch_ = require_cuda()
    model_args = {"vocab_size": 8192, "seq_len": 512, "d_model": 512, "n_layers": 4, "n_heads": 8, "lr": 6e-4}
    data_args = {"vocab_size": 8192, "seq_len": 512, "steps_per_epoch": 40, "val_batches": 4, "test_batches": 4,
                 "branching": 4, "seed": 0}
    command = [sys.executable, str(ROOT / "scripts/train.py"), "--topology", "1x1", "--nodes", "1", "--devices", "1",
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
