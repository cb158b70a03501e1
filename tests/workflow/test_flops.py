"""The float32 settings ddpscale.job.flops reads, each set in a fresh process (torch keeps them
process-wide), and on a GPU the TF32 peak of a module on torch's fp32_precision API (the
counts, peaks and MFU: tests/unit/test_flops.py)."""
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT, run_user_module


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
              "from ddpscale.job import flops; print(json.dumps(flops.float32_record()))")
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
    from conftest import require_cuda

    require_cuda()
    done = run_user_module(tmp_path, TF32_MODULE, "tf32mod.Tf32Spiral", data_file, "--accelerator", "gpu",
                           "--precision", "32-true", "--data-args", '{"resident": true}')
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["cuda_matmul_allow_tf32"] is True and metrics["peak_precision"] == "tf32"
    assert 0 < metrics["mfu"] < 1
