"""make gpu-check (benchmarks/gpu_check.py) for real: its plain training loop, and a GPU node's
own Python without a venv or console script; a training job imports without jsonschema (what
it runs where, its table, and its refusal without a GPU: tests/unit/test_gpu_check.py)."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.devices import gpu_check
from helpers.workflow import ROOT


@pytest.mark.slow
def test_the_plain_loop_trains_the_preset_it_is_compared_with():
    samples_s = gpu_check.plain_throughput("config/transformer_tiny.yaml", steps=4, warmup=1, device="cpu")
    assert samples_s > 0


# -- a GPU node's own Python: the stack importable, no venv, no console script --------------

def python_without_console_scripts(folder: Path) -> str:
    """An interpreter with this one's packages and a bin/ that holds only itself, as on a GPU
    node whose image has torch, Lightning and snakemake's wheels but no `make setup` venv."""
    if sys.prefix == sys.base_prefix:
        pytest.skip("builds its interpreter from this venv's packages; run the suite from .venv (make test)")
    (folder / "bin").mkdir(parents=True)
    shutil.copy(Path(sys.prefix) / "pyvenv.cfg", folder / "pyvenv.cfg")
    (folder / "lib").symlink_to(Path(sys.prefix) / "lib")
    (folder / "bin/python").symlink_to(os.path.realpath(sys.executable))
    return str(folder / "bin/python")


def test_without_a_venv_the_gpu_tests_still_collect(tmp_path):
    python = python_without_console_scripts(tmp_path / "py")
    done = subprocess.run([python, "-m", "pytest", "--collect-only", "-q", "-m", "gpu", "-p", "no:cacheprovider"],
                          cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "test_on_one_gpu_the_transformer_reports_its_mfu" in done.stdout


@pytest.mark.slow
def test_without_a_console_script_the_check_starts_the_workflow_with_python_m(tmp_path):
    python = python_without_console_scripts(tmp_path / "py")
    tiny = {"topologies": ["1x1"], "accelerator": "cpu", "max_epochs": 2, "experiment": "tiny",
            "dataset": {"samples": 600}}
    script = f"""
import json, pathlib, sys
sys.path.insert(0, {str(ROOT / "benchmarks")!r})
import gpu_check
gpu_check.CHECK = pathlib.Path({str(tmp_path / "check")!r})
gpu_check.WORKLOADS = {{"tiny": ("config/config.yaml", {tiny!r})}}
command = gpu_check.snakemake_command()
code, runs = gpu_check.run_workload(command, "tiny", ["1x1"])
print(json.dumps({{"command": command, "code": code, "topologies": [r["topology"] for r in runs]}}))
"""
    done = subprocess.run([python, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    assert outcome["command"] == [python, "-m", "snakemake"]
    assert outcome["code"] == 0 and outcome["topologies"] == ["1x1"], done.stdout[-3000:] + done.stderr[-3000:]


def test_the_training_job_imports_without_jsonschema():
    """jsonschema checks the config while the workflow is parsed; a job never needs it."""
    script = ("import runpy, sys; sys.modules['jsonschema'] = None; sys.argv = ['train.py', '--help']; "
              f"sys.path.insert(0, {str(ROOT / 'scripts')!r}); runpy.run_path({str(ROOT / 'scripts/train.py')!r}, "
              "run_name='__main__')")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "--max-epochs" in done.stdout
