"""The float32 settings ddpscale.job.device.flops reads, each set in a fresh process (torch keeps them
process-wide), and on a GPU the TF32 peak of a module on torch's fp32_precision API (the
counts, peaks and MFU: tests/unit/job/device/test_flops.py)."""
import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch
from helpers.training import run_user_module, throughput
from helpers.workflow import ROOT

FP32_SETTINGS = [
    # (what a module sets, torch's fp32_precision API or the legacy one, and what is in effect)
    ('torch.backends.fp32_precision = "tf32"', "high", True, True),
    ('torch.backends.fp32_precision = "ieee"', "highest", False, False),
    ('torch.backends.cuda.matmul.fp32_precision = "tf32"', "high", True, True),
    ('torch.backends.cudnn.conv.fp32_precision = "ieee"', "highest", False, False),
    ('torch.backends.cuda.matmul.fp32_precision = "tf32"; torch.backends.cudnn.conv.fp32_precision = "ieee"',
     "high", True, False),
    ('torch.set_float32_matmul_precision("high")', "high", True, True),
    ("pass", "highest", False, True),
]


@pytest.mark.parametrize("setting, matmul_precision, matmul_tf32, conv_tf32", FP32_SETTINGS)
def test_the_float32_record_reads_torchs_fp32_precision_api_too(setting, matmul_precision, matmul_tf32, conv_tf32):
    # In a fresh process: torch keeps these settings process-wide, and once the new API is
    # used the legacy getters raise (rank 0 died in FlopsCount, the others hung in a collective)
    script = (f"import json, torch; {setting}\n"
              "from ddpscale.job.device import flops; print(json.dumps(flops.float32_record()))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "scripts")})
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout) == {"float32_matmul_precision": matmul_precision,
                                       "cuda_matmul_allow_tf32": matmul_tf32, "cudnn_allow_tf32": conv_tf32}


TF32_MODULE = '''
import torch

from ddpscale.workloads.models import SpiralMLP


class Tf32Spiral(SpiralMLP):
    """Opts into TF32 through torch's fp32_precision API, as torch's CUDA notes now teach."""

    def setup(self, stage):
        torch.backends.fp32_precision = "tf32"
'''


@pytest.mark.gpu
@pytest.mark.slow
def test_on_a_gpu_a_module_on_the_fp32_precision_api_gets_its_tf32_peak(tmp_path, data_file):
    """Rank 0 died in FlopsCount once a module used the new API (the CPU twin reads the record)."""
    from helpers.devices import require_cuda

    require_cuda()
    done = run_user_module(tmp_path, TF32_MODULE, "tf32mod.Tf32Spiral", data_file, "--accelerator", "gpu",
                           "--precision", "32-true", "--data-args", '{"resident": true}')
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["cuda_matmul_allow_tf32"] is True and metrics["peak_precision"] == "tf32"
    assert 0 < metrics["mfu"] < 1


# -- counted inside the fit, on the real module (issue 45, item 5) -------------------------------

USERMODS = ROOT / "tests/fixtures/usermods"


def trained(tmp_path, name: str, model: str, data_file: str, *flags: str, devices: int = 1) -> dict:
    """A fixture module of tests/fixtures/usermods trained by train.py (full mode, 2 epochs,
    windows of 8 steps: the first 8 batches are counted), its metrics.json and what it printed."""
    done = run_user_module(tmp_path, (USERMODS / f"{name}.py").read_text(), f"{name}.{model}", data_file,
                           "--measure", "full", *throughput(window_steps=8), *flags, devices=devices)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((tmp_path / "metrics.json").read_text()) | {"_out": done.stdout + done.stderr}


def fixture(name: str):
    """A usermods fixture, imported from its file (for the truth, computed here from it)."""
    spec = importlib.util.spec_from_file_location(name, USERMODS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("devices", [1, 2])
def test_a_step_that_reads_its_trainer_and_gathers_is_counted(tmp_path, data_file, devices):
    # The count ran on a copy without a trainer and gave up: TFLOP/s n/a. Per sample, for
    # batch B on W ranks (hidden 32, dim 16): each view's encoder 2(2*32 + 32*16) forward,
    # 2*32*16 + 2*32*16 + 2*2*32 backward (the views need no gradient); the logits z1 @ z2_all.T
    # (B x 16 by 16 x W*B) 2*16*W*B per sample forward and twice that backward.
    m = trained(tmp_path, "contrastive", "ContrastiveSpiral", data_file, devices=devices)
    encoder = 2 * (2 * (2 * 32 + 32 * 16) + 2 * 32 * 16 * 2 + 2 * 2 * 32)
    assert m["flops_per_sample"] == encoder + 3 * 2 * 16 * devices * 32
    assert m["flops_batches"] == 8 and m["flops_reason"] is None and m["flops_recomputed_per_sample"] == 0
    assert m["achieved_tflops"] == pytest.approx(m["flops_per_sample"] * m["throughput_samples_s"] / 1e12)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("use_reentrant", [False, True])
def test_activation_recomputation_is_told_apart_from_model_flops(tmp_path, data_file, use_reentrant):
    from ddpscale.job.device import flops

    m = trained(tmp_path, "recompute", "CheckpointedMLP", data_file, "--model-args",
                json.dumps({"use_reentrant": use_reentrant}))
    namespace = vars(fixture("recompute"))
    batch = (torch.randn(32, 2), torch.randint(0, 2, (32,)))
    plain = flops.training_flops_per_sample(namespace["CheckpointedMLP"](checkpointing=False), batch, 32)
    assert m["flops_per_sample"] == plain == 50432  # model FLOPs: as if nothing were recomputed
    assert m["flops_recomputed_per_sample"] == 2 * (2 * 64 * 64)  # both blocks' forward, once more


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_flops_per_sample_cover_the_batches_of_varying_length(tmp_path, data_file):
    # One batch's figure (the loader's first) was the run's: 1.19e6 on one topology and 3.54e6 on
    # another for the same model. Now a ratio of sums over the first 8 batches training saw,
    # with the smallest and largest batch's figure.
    from ddpscale.job.device import flops

    m = trained(tmp_path, "bucketed_flops", "BucketedModel", data_file, "--data-class",
                "bucketed_flops.BucketedData", "--batch-size", "16")
    namespace = vars(fixture("bucketed_flops"))
    batches = list(namespace["BucketedData"](batch_size=16).train_dataloader())[:8]
    model = namespace["BucketedModel"]()
    each = [flops.training_flops_per_sample(model, b, len(b[1])) for b in batches]
    truth = sum(f * len(b[1]) for f, b in zip(each, batches)) / sum(len(b[1]) for b in batches)
    assert m["flops_batches"] == 8 and m["flops_per_sample"] == pytest.approx(truth, rel=1e-9)
    assert m["flops_per_sample_min"] == min(each) and m["flops_per_sample_max"] == max(each) > 1.5 * min(each)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_dict_batch_of_two_loaders_is_counted_per_sample_as_the_run_counts(tmp_path, data_file):
    # The count took the dict's first key for a batch and gave up. FLOPs per sample now divide
    # a step's FLOPs by the samples the run counted for it, as its throughput does.
    from ddpscale.job.device import flops

    m = trained(tmp_path, "twoloaders_flops", "SemiSupervised", data_file, "--data-class",
                "twoloaders_flops.TwoLoaders", "--batch-size", "32")
    namespace = vars(fixture("twoloaders_flops"))
    step = flops.training_flops(namespace["SemiSupervised"](), {"labeled": (torch.randn(32, 2), torch.zeros(
        32, dtype=torch.long)), "unlabeled": [torch.randn(32, 2)]}, 1)[0]
    per_batch = m["samples_trained"] / (2 * 256 // 32)  # 2 epochs of 8 full steps
    assert m["flops_per_sample"] == pytest.approx(step / per_batch, rel=1e-12)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("precision", ["bf16-mixed", "bf16-true"])
def test_the_count_runs_in_the_trainers_precision(tmp_path, data_file, precision):
    # The GPU failure class on a CPU: a count apart from the fit met weights and inputs of other
    # dtypes or devices; inside the fit the precision plugin has converted both.
    done = run_user_module(tmp_path, "from ddpscale.workloads.models import SpiralMLP\n", "spiral.SpiralMLP",
                           data_file, "--precision", precision, *throughput(window_steps=4))
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["flops_per_sample"] == 16064 and metrics["flops_batches"] == 4
