"""A run's identity (data checksum, settings, training code, versions) and the checkpoint
fingerprint it keys, and checkpoints that cannot be loaded (in real runs, reports and
workflows: tests/workflow/test_identity.py)."""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest
import torch

import train  # noqa: F401  the job modules loaded, as train.py has them when it hashes its code
from helpers.records import make_run
from helpers.training import train_args
from helpers.workflow import ROOT
from ddpscale.run import identity, runspec
from ddpscale.report.load import records
from ddpscale.job import record as recorder
from ddpscale.job.resume import checkpoint, checksum


def keyed_settings(argv: list[str]) -> dict:
    """The settings train.py fingerprints: its flags plus the run's identity."""
    spec = runspec.parse(argv)
    return {**spec.measured(), "identity": recorder.run_identity(spec, torch.device("cpu"))}


def save_checkpoint(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"state_dict": {"w": torch.zeros(1000)}, "epoch": 0}, path)
    checksum.sign(path)  # as EpochCheckpoint signs each save: an unsigned one is never resumed


# --- the checkpoint fingerprint -----------------------------------------------------------------

def test_checkpoint_of_other_data_bytes_is_not_resumed(tmp_path, capsys):
    data = tmp_path / "data.npz"
    data.write_bytes(b"first dataset")
    argv = train_args(data, tmp_path)
    before = keyed_settings(argv)
    assert checkpoint.resume_path(str(tmp_path / "ckpt"), before, True) is None  # stamps the fingerprint
    save_checkpoint(tmp_path / "ckpt/last.ckpt")
    assert checkpoint.resume_path(str(tmp_path / "ckpt"), before, True) == str(tmp_path / "ckpt/last.ckpt")

    data.write_bytes(b"other dataset")  # same path and flags, other bytes
    after = keyed_settings(argv)
    assert {k: v for k, v in after.items() if k != "identity"} == {k: v for k, v in before.items() if k != "identity"}
    assert identity.digest(after) != identity.digest(before)
    assert checkpoint.resume_path(str(tmp_path / "ckpt"), after, True) is None
    assert not (tmp_path / "ckpt/last.ckpt").exists()
    assert f"changed: identity.data.{data}" in capsys.readouterr().out


def test_identity_parts_and_code_files():
    timing, spawner = "ddpscale/job/measure/timing.py", "ddpscale/job/launch/spawner.py"
    fake = {"ddpscale.job.measure.timing": types.SimpleNamespace(__file__=str(ROOT / "scripts" / timing)),
            "usermods.tiny": types.SimpleNamespace(__file__=str(ROOT / "tests/fixtures/usermods/tiny.py")),
            "numpy": types.SimpleNamespace(__file__="/elsewhere/numpy/__init__.py"),
            "builtin": types.SimpleNamespace()}
    files = identity.code_files(fake, ROOT / "scripts", [ROOT / "scripts/train.py", ROOT / "scripts" / spawner],
                                ["usermods.tiny"])
    assert sorted(files) == [spawner, timing, "train.py", "usermods.tiny"]
    # a forked rank of the local launcher has ddpscale.job.launch.spawner loaded; the same set results
    forked = {**fake, "ddpscale.job.launch.spawner": types.SimpleNamespace(__file__=str(ROOT / "scripts" / spawner))}
    assert identity.code_files(forked, ROOT / "scripts", [ROOT / "scripts/train.py", ROOT / "scripts" / spawner],
                               ["usermods.tiny"]) == files
    record = identity.identity({"d.npz": "ab"}, {"topology": "1x2", "seed": 1, "data_file": "d.npz"},
                               identity.code_hash(files), {"torch": "2"})
    # only settings every run of a report shares; the topology differs by design
    assert record["settings"] == {"seed": 1}
    assert record["digest"] == identity.digest({k: v for k, v in record.items() if k != "digest"})


# --- the report ---------------------------------------------------------------------------------

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
    assert checkpoint.unloadable(good) is None
    truncated = tmp_path / "truncated.ckpt"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    garbage = tmp_path / "garbage.ckpt"
    garbage.write_bytes(b"\x00garbage" * 100)
    for bad in (truncated, garbage):
        assert checkpoint.unloadable(bad), f"{bad.name} was taken as loadable"


def test_every_rank_holds_the_launchers_modules_whatever_started_it():
    """A forked rank has the local launcher's modules loaded, a 1x1 or srun rank only what
    the recorder imports: if the launcher imports a module the recorder does not, the code hash differs by
    topology and the report refuses to compare the runs."""
    import subprocess
    import sys

    def loaded(module: str) -> set[str]:
        out = subprocess.run([sys.executable, "-c", f"import sys, {module}; print(*sorted(sys.modules))"],
                             capture_output=True, text=True, check=True, cwd=ROOT / "scripts").stdout
        return {name for name in out.split() if name.startswith("ddpscale")}

    assert loaded("ddpscale.job.launch.spawner") <= loaded("ddpscale.job.record")
