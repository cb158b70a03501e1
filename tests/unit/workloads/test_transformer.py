"""The transformer workload: its FLOP formula against torch's counter, its size, its presets and
its optimizer (trained: tests/workflow/test_transformer.py; its token stream:
test_markov_data.py)."""
from __future__ import annotations

import copy

import pytest
import torch
import yaml
from snakemake.utils import validate
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from helpers.configs import TINY_PRESET, shapes
from helpers.workflow import ROOT
from ddpscale.job.device import flops
from ddpscale.workloads.transformer import TransformerLM, flops_per_sample, flops_per_token, n_params

GPU_PRESET = yaml.safe_load((ROOT / "config/transformer.yaml").read_text())


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
