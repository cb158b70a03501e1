"""A run's identity (data checksum, settings, training code, versions), and checkpoints that
cannot be loaded."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import types
from pathlib import Path

import pandas as pd
import pytest
import torch

import train  # noqa: F401  the job modules loaded, as train.py has them when it hashes its code
from conftest import ROOT, launched, tiny_config
from ddpscale.report import analysis, records, reportdata
from ddpscale.plan import identity, runspec
from ddpscale.job import runinfo
from test_analysis import make_run
from test_report_script import _assert_one_line_error, run_report, write_fixtures
from test_workflow_local import job_counts

SPIRAL = ["--model-class", "ddpscale.workloads.models.SpiralMLP", "--data-class", "ddpscale.workloads.spiral_datamodule.SpiralDataModule"]


def train_args(data_file: Path, tmp_path: Path, nodes: int = 1, devices: int = 1) -> list[str]:
    return ["--topology", f"{nodes}x{devices}", "--nodes", str(nodes), "--devices", str(devices),
            "--accelerator", "cpu", "--max-epochs", "2", "--scaling", "weak", "--batch-size", "32",
            *SPIRAL, "--data-file", str(data_file),
            "--ckpt-dir", str(tmp_path / "ckpt"), "--metrics", str(tmp_path / "metrics.json")]


def keyed_settings(argv: list[str]) -> dict:
    """The settings train.py fingerprints: its flags plus the run's identity."""
    spec = runspec.parse(argv)
    return {**spec.measured(), "identity": runinfo.run_identity(spec, torch.device("cpu"))}


def save_checkpoint(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"state_dict": {"w": torch.zeros(1000)}, "epoch": 0}, path)


# --- the checkpoint fingerprint -----------------------------------------------------------------

def test_checkpoint_of_other_data_bytes_is_not_resumed(tmp_path, capsys):
    data = tmp_path / "data.npz"
    data.write_bytes(b"first dataset")
    argv = train_args(data, tmp_path)
    before = keyed_settings(argv)
    assert runinfo.resume_path(str(tmp_path / "ckpt"), before, True) is None  # stamps the fingerprint
    save_checkpoint(tmp_path / "ckpt/last.ckpt")
    assert runinfo.resume_path(str(tmp_path / "ckpt"), before, True) == str(tmp_path / "ckpt/last.ckpt")

    data.write_bytes(b"other dataset")  # same path and flags, other bytes
    after = keyed_settings(argv)
    assert {k: v for k, v in after.items() if k != "identity"} == {k: v for k, v in before.items() if k != "identity"}
    assert identity.digest(after) != identity.digest(before)
    assert runinfo.resume_path(str(tmp_path / "ckpt"), after, True) is None
    assert not (tmp_path / "ckpt/last.ckpt").exists()
    assert f"changed: identity.data.{data}" in capsys.readouterr().out


def test_identity_parts_and_code_files():
    fake = {"ddpscale.job.timing": types.SimpleNamespace(__file__=str(ROOT / "scripts/ddpscale/job/timing.py")),
            "usermods.tiny": types.SimpleNamespace(__file__=str(ROOT / "tests/fixtures/usermods/tiny.py")),
            "numpy": types.SimpleNamespace(__file__="/elsewhere/numpy/__init__.py"),
            "builtin": types.SimpleNamespace()}
    files = identity.code_files(fake, ROOT / "scripts", [ROOT / "scripts/train.py", ROOT / "scripts/ddpscale/job/launch.py"],
                                ["usermods.tiny"])
    assert sorted(files) == ["ddpscale/job/launch.py", "ddpscale/job/timing.py", "train.py", "usermods.tiny"]
    # a forked rank of the local launcher has ddpscale.job.launch loaded; the same set results
    forked = {**fake, "ddpscale.job.launch": types.SimpleNamespace(__file__=str(ROOT / "scripts/ddpscale/job/launch.py"))}
    assert identity.code_files(forked, ROOT / "scripts", [ROOT / "scripts/train.py", ROOT / "scripts/ddpscale/job/launch.py"],
                               ["usermods.tiny"]) == files
    record = identity.identity({"d.npz": "ab"}, {"topology": "1x2", "seed": 1, "data_file": "d.npz"},
                               identity.code_hash(files), {"torch": "2"})
    # only settings every run of a report shares; the topology differs by design
    assert record["settings"] == {"seed": 1}
    assert record["digest"] == identity.digest({k: v for k, v in record.items() if k != "digest"})


# --- the report ---------------------------------------------------------------------------------

def ident(data="aaaa1111", code="c0de", torch_version="2.13.0", **settings) -> dict:
    return identity.identity({"results/data/spiral/data.npz": data}, {"seed": 42, **settings}, code,
                             {"torch": torch_version, "lightning": "2.6.6", "cuda": None, "nccl": None})


def summarize(runs):
    frame = pd.DataFrame(runs)
    return analysis.summarize(frame, analysis.compare(frame, "1x1", "test_acc", 0.02))


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


def test_a_record_without_identity_is_refused_before_the_report(tmp_path):
    """Every record of this schema version holds its identity: one without it cannot be checked
    against the others, and the reader names the file and the key."""
    run = make_run("1x1")
    del run["identity"]
    path = tmp_path / "metrics.json"
    path.write_text(json.dumps(run))
    with pytest.raises(ValueError, match="metrics.json: missing required key.*identity"):
        records.load_runs([path])


# --- checkpoints that cannot be loaded ----------------------------------------------------------

def test_unloadable_names_why_and_accepts_a_good_checkpoint(tmp_path):
    good = tmp_path / "good.ckpt"
    save_checkpoint(good)
    assert runinfo.unloadable(good) is None
    truncated = tmp_path / "truncated.ckpt"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    garbage = tmp_path / "garbage.ckpt"
    garbage.write_bytes(b"\x00garbage" * 100)
    for bad in (truncated, garbage):
        assert runinfo.unloadable(bad), f"{bad.name} was taken as loadable"


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
    result = run(command)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("cannot be loaded") == 1, "one line, from rank 0 only"
    assert "set aside as last.ckpt.unloadable, starting this run fresh" in result.stdout
    assert (tmp_path / "ckpt/last.ckpt.unloadable").read_bytes().startswith(b"PK\x03\x04 not really")
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
