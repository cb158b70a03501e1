"""A run's identity in real runs and reports: the report refusing runs whose identity differs,
train.py recording it on one and two ranks, a checkpoint that cannot be loaded set aside, and
the workflow rerunning what a change affects (the identity itself, the checkpoint fingerprint
and the check of a checkpoint: tests/unit/run/test_identity.py)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from helpers.records import make_run
from helpers.report import _assert_one_line_error, run_report, write_fixtures
from helpers.training import launched, train_args
from helpers.workflow import ROOT, job_counts, tiny_config
from ddpscale.report.figures import scaling
from ddpscale.report.load import records
from ddpscale.run import identity
from ddpscale.job.resume import checksum


# --- the report ---------------------------------------------------------------------------------

def ident(data="aaaa1111", code="c0de", torch_version="2.13.0", **settings) -> dict:
    return identity.identity({"results/data/spiral/data.npz": data}, {"seed": 42, **settings}, code,
                             {"torch": torch_version, "lightning": "2.6.6", "cuda": None, "nccl": None})


def summarize(runs):
    frame = pd.DataFrame(runs)
    return scaling.summarize(frame, scaling.compare(frame, "1x1", "test_acc", 0.02))


def test_report_refuses_runs_whose_identity_differs(tmp_path):
    runs = [make_run("1x1", identity=ident()), make_run("2x1", identity=ident()),
            make_run("1x2", identity=ident(data="bbbb2222"))]
    with pytest.raises(ValueError) as err:
        summarize(runs)
    message = str(err.value)
    assert "data (1x1/r0, 2x1/r0: data.npz aaaa1111; 1x2/r0: data.npz bbbb2222)" in message
    assert records.RERUN_ALL in message and "code" not in message.split(";")[0]

    other = [make_run("1x1", identity=ident()),
             make_run("1x2", identity=ident(code="beef", torch_version="2.12.0", seed=7))]
    message = str(pytest.raises(ValueError, summarize, other).value)
    for part in ("settings.seed (1x1/r0: 42; 1x2/r0: 7)", "code (", "versions.torch (1x1/r0: 2.13.0; 1x2/r0: 2.12.0)"):
        assert part in message

    # the report script (full and partial report alike) says it in one line and writes nothing
    proc = run_report(write_fixtures(tmp_path, runs), tmp_path / "out")
    _assert_one_line_error(proc, "1x2/r0", "data", records.RERUN_ALL)
    assert not (tmp_path / "out/report.html").exists()


# --- checkpoints that cannot be loaded ----------------------------------------------------------


def run(command) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, timeout=170, cwd=ROOT)


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize("devices", [1, 2])
def test_unloadable_checkpoint_is_set_aside_and_the_run_starts_fresh(tmp_path, data_file, devices):
    command = launched([sys.executable, str(ROOT / "scripts/train.py"), *train_args(data_file, tmp_path, 1, devices)],
                       1, devices)
    assert run(command).returncode == 0  # leaves the fingerprint of exactly this run
    last = tmp_path / "ckpt/last.ckpt"
    last.write_bytes(b"PK\x03\x04 not really a checkpoint" * 50)
    checksum.sign(last)  # whole as written, yet not a checkpoint torch can load
    result = run(command)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("is not resumed") == 1, "one line, from rank 0 only"
    assert "last.ckpt is not resumed (" in result.stdout and "set aside as last.ckpt.damaged" in result.stdout
    assert "no whole checkpoint left; starting this run fresh" in result.stdout
    assert (tmp_path / "ckpt/last.ckpt.damaged").read_bytes().startswith(b"PK\x03\x04 not really")
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["attempts"] == 1 and metrics["resumed_from_epoch"] is None
    assert metrics["world_size"] == devices


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_metrics_record_the_identity_with_the_data_checksum(tmp_path, data_file):
    result = run([sys.executable, str(ROOT / "scripts/train.py"), *train_args(data_file, tmp_path)])
    assert result.returncode == 0, result.stderr[-3000:]
    record = json.loads((tmp_path / "metrics.json").read_text())["identity"]
    assert record["data"] == {data_file: hashlib.sha256(Path(data_file).read_bytes()).hexdigest()}
    assert record["settings"]["model_class"] == "ddpscale.workloads.models.SpiralMLP" and "topology" not in record["settings"]
    assert len(record["code"]) == 64
    assert record["versions"] == {"torch": torch.__version__, "lightning": __import__("pytorch_lightning").__version__,
                                  "cuda": None, "nccl": None}
    assert record["digest"] == identity.digest({k: v for k, v in record.items() if k != "digest"})

    # a 2-rank run (forked by the local launcher) of the same config has the same identity
    two = tmp_path / "two"
    two.mkdir()
    command = launched([sys.executable, str(ROOT / "scripts/train.py"), *train_args(data_file, two, 1, 2)], 1, 2)
    result = run(command)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads((two / "metrics.json").read_text())["identity"] == record


# --- the workflow reruns what a change affects ----------------------------------------------------

@pytest.mark.slow
@pytest.mark.timeout(600)
def test_changed_dataset_reruns_the_runs(workspace):
    workspace.write_config(tiny_config(topologies=["1x1"]))
    first = workspace.snakemake()
    assert first.returncode == 0, first.stderr[-4000:]
    unchanged = workspace.snakemake("-n")
    assert unchanged.returncode == 0 and "Nothing to be done" in unchanged.stdout + unchanged.stderr

    config = tiny_config(topologies=["1x1"])
    config["dataset"]["samples"] = 2400
    workspace.write_config(config)
    dry = workspace.snakemake("-n")
    assert dry.returncode == 0, dry.stderr[-4000:]
    assert job_counts(dry.stdout + dry.stderr) == {"all": 1, "prepare_data": 1, "train_baseline": 1,
                                                   "report_scaling": 1}

    # the data regenerated alone (say, by its target): the runs made from the old data still rerun
    data = workspace.snakemake(str((workspace.results / "data/spiral/data.npz").relative_to(workspace.path)))
    assert data.returncode == 0, data.stderr[-4000:]
    dry = workspace.snakemake("-n")
    assert job_counts(dry.stdout + dry.stderr) == {"all": 1, "train_baseline": 1, "report_scaling": 1}
    assert "Params have changed" in dry.stdout + dry.stderr
