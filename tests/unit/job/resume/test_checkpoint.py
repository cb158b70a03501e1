"""EpochCheckpoint: the resume file written at each epoch end, with no per-step work."""

from __future__ import annotations

import json
import shutil
import struct
import zipfile

import pytest
import pytorch_lightning as pl
import torch
from helpers.configs import rule
from helpers.workflow import ROOT
from ddpscale.core import record as run_record
from ddpscale.run.runspec import RunSpec
from ddpscale.job import build
from ddpscale.job.resume import checkpoint, checksum
from ddpscale.job.resume.checkpoint import EpochCheckpoint, epoch_checkpoint
from ddpscale.workloads.models import SpiralMLP
from ddpscale.workloads.resident import ResidentBatches


class TinyData(pl.LightningDataModule):
    def __init__(self):
        super().__init__()
        self.x, self.y = torch.randn(64, 2), torch.randint(0, 2, (64,))

    def train_dataloader(self):
        return ResidentBatches((self.x, self.y), 16, shuffle=True)


def test_state_key_is_formatted_once_and_names_the_settings(tmp_path):
    ckpt = epoch_checkpoint(str(tmp_path))
    first = ckpt.state_key
    assert ckpt.state_key is first, "formatted again: the cache is not used"
    assert first.startswith("EpochCheckpoint{") and "'every_n_epochs': 1" in first


def test_each_epoch_end_rewrites_one_file_and_steps_write_nothing(tmp_path):
    ckpt = epoch_checkpoint(str(tmp_path / "ckpt"))
    seen = []

    class Watch(pl.Callback):
        def on_train_batch_end(self, trainer, *args):
            seen.append(sorted(p.name for p in (tmp_path / "ckpt").glob("*")) if (tmp_path / "ckpt").exists() else [])

    spec = RunSpec(topology="1x1", num_nodes=1, devices_per_node=1, throughput=rule(),
                   model_class="m.M", data_class="d.D", scaling="weak",
                   batch_size=16, max_epochs=2, accelerator="cpu")
    trainer = build.build_trainer(spec, [Watch(), ckpt])
    trainer.fit(SpiralMLP(), datamodule=TinyData())
    assert seen[:4] == [[]] * 4, "a checkpoint appeared during the first epoch"
    assert seen[4:] == [["last.ckpt", "last.ckpt.sha256"]] * 4, "epoch 1 did not leave exactly last.ckpt, signed"
    saved = torch.load(tmp_path / "ckpt/last.ckpt", weights_only=False)
    assert saved["epoch"] == 1 and ckpt.state_key in saved["callbacks"]
    assert isinstance(ckpt, EpochCheckpoint)


SETTINGS = {"seed": 0}


def trained(ckpt_dir, epochs: int) -> EpochCheckpoint:
    """A spiral MLP trained `epochs` epochs with the epoch checkpoint in ckpt_dir, stamped as a
    run's first attempt stamps it (resume_path), so a later resume_path looks at its files."""
    assert checkpoint.resume_path(str(ckpt_dir), SETTINGS, True) is None
    ckpt = epoch_checkpoint(str(ckpt_dir))
    spec = RunSpec(topology="1x1", num_nodes=1, devices_per_node=1, throughput=rule(),
                   model_class="m.M", data_class="d.D", scaling="weak",
                   batch_size=16, max_epochs=epochs, accelerator="cpu")
    build.build_trainer(spec, [ckpt]).fit(SpiralMLP(), datamodule=TinyData())
    return ckpt


def damage_tensor_bytes(path) -> None:
    """Flip bytes in the middle of the largest tensor's data, the file's size unchanged: torch's
    mmap load, which reads the zip's directory and the pickle, still takes it."""
    with zipfile.ZipFile(path) as archive:
        member = max((i for i in archive.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
    data = bytearray(path.read_bytes())
    name_len, extra_len = struct.unpack("<HH", data[member.header_offset + 26:member.header_offset + 30])
    start = member.header_offset + 30 + name_len + extra_len
    middle = start + member.file_size // 2
    data[middle:middle + 8] = bytes(b ^ 0xFF for b in data[middle:middle + 8])
    path.write_bytes(bytes(data))


def test_each_save_keeps_the_one_it_replaces_and_signs_itself_in_its_timed_seconds(tmp_path, monkeypatch):
    signed = []
    sign = checksum.sign
    monkeypatch.setattr(checksum, "sign", lambda path: signed.append(path) or sign(path))
    ckpt = trained(tmp_path, epochs=3)
    names = sorted(p.name for p in tmp_path.iterdir() if p.suffix != ".json")
    assert names == ["last.ckpt", "last.ckpt.sha256", "previous.ckpt", "previous.ckpt.sha256"]
    assert torch.load(tmp_path / "last.ckpt", weights_only=False)["epoch"] == 2
    assert torch.load(tmp_path / "previous.ckpt", weights_only=False)["epoch"] == 1
    assert checksum.mismatch(tmp_path / "last.ckpt") is None and checksum.mismatch(tmp_path / "previous.ckpt") is None
    assert len(signed) == len(ckpt.save_seconds) == 3


@pytest.mark.parametrize("rank_zero_first", [True, False])
def test_a_checkpoint_with_damaged_tensor_bytes_is_set_aside_and_the_previous_one_resumed(tmp_path, capsys,
                                                                                           rank_zero_first):
    trained(tmp_path, epochs=3)
    last = tmp_path / "last.ckpt"
    damage_tensor_bytes(last)
    assert checkpoint.unloadable(last) is None, "the damage was found without the checksum: not the case at issue"
    previous = str(tmp_path / "previous.ckpt")
    ranks = [True, False] if rank_zero_first else [False, True]
    # every rank reaches the same answer, whether rank 0 has set the damaged one aside yet or not
    assert [checkpoint.resume_path(str(tmp_path), SETTINGS, zero) for zero in ranks] == [previous, previous]
    assert not last.exists() and (tmp_path / "last.ckpt.damaged").exists()
    assert (f"ddpscale: {last} is damaged (its bytes differ from those written (sha256 mismatch)); set aside "
            "as last.ckpt.damaged") in capsys.readouterr().out
    restored = torch.load(previous, weights_only=False)["state_dict"]
    assert all(torch.isfinite(t).all() for t in restored.values() if t.is_floating_point())

    damage_tensor_bytes(tmp_path / "previous.ckpt")  # neither is whole: fresh
    assert checkpoint.resume_path(str(tmp_path), SETTINGS, True) is None
    assert "no whole checkpoint left; starting this run fresh" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.glob("*.damaged*")) == [
        "last.ckpt.damaged", "last.ckpt.sha256.damaged", "previous.ckpt.damaged", "previous.ckpt.sha256.damaged"]


def test_a_save_cut_short_after_the_rotation_resumes_the_previous_one(tmp_path):
    trained(tmp_path, epochs=2)
    last = tmp_path / "last.ckpt"
    checksum.rotate(last, tmp_path / "previous.ckpt")  # the next save began, and was killed mid-write
    shutil.copyfile(tmp_path / "previous.ckpt", last)  # a whole file even, but no checksum written
    assert checkpoint.resume_path(str(tmp_path), SETTINGS, True) == str(tmp_path / "previous.ckpt")


def test_a_checkpoint_without_a_checksum_is_set_aside_not_resumed(tmp_path, capsys):
    """One ddpscale did not sign (copied in, planted, or from before checksums) is kept under
    another name and the run starts fresh: a run resumes only what it wrote."""
    trained(tmp_path, epochs=1)
    (tmp_path / "last.ckpt.sha256").unlink()
    assert checkpoint.resume_path(str(tmp_path), SETTINGS, True) is None
    assert not (tmp_path / "last.ckpt").exists() and (tmp_path / "last.ckpt.damaged").exists()
    assert (f"ddpscale: {tmp_path / 'last.ckpt'} is not resumed (it has no checksum, last.ckpt.sha256: ddpscale "
            "resumes only checkpoints it wrote and signed); set aside as last.ckpt.damaged") in capsys.readouterr().out


def test_a_resume_loads_lightnings_whole_state_as_data(tmp_path):
    """weights_only=True, as train.py resumes: hyper-parameters, loops, callbacks and optimizer
    states all load, and training goes on from the saved epoch."""
    trained(tmp_path, epochs=1)
    path = checkpoint.resume_path(str(tmp_path), SETTINGS, True)
    assert path == str(tmp_path / "last.ckpt")
    saved = torch.load(path, weights_only=True)
    assert saved["hyper_parameters"] and saved["optimizer_states"] and saved["loops"] and saved["callbacks"]
    spec = RunSpec(topology="1x1", num_nodes=1, devices_per_node=1, throughput=rule(),
                   model_class="m.M", data_class="d.D", scaling="weak",
                   batch_size=16, max_epochs=2, accelerator="cpu")
    trainer = build.build_trainer(spec, [epoch_checkpoint(str(tmp_path))])
    trainer.fit(SpiralMLP(), datamodule=TinyData(), ckpt_path=path, weights_only=True)
    assert trainer.current_epoch == 2 and trainer.global_step == 8  # 4 steps an epoch, one epoch trained here


PLANTED = ROOT / "tests/fixtures/adversarial/ckpt_runs_code.ckpt"
MARKER = "ckpt_pickle_ran_code"  # what the planted pickle creates in the working folder when unpickled


@pytest.mark.parametrize("signed", [False, True])
def test_a_checkpoint_whose_pickle_runs_code_is_neither_run_nor_resumed(tmp_path, monkeypatch, capsys, signed):
    """A last.ckpt planted in a run's folder (its pickle's __reduce__ calls open()), with and
    without a checksum that matches it: inspecting it runs nothing, the run starts fresh, and
    the file is kept under another name."""
    monkeypatch.chdir(tmp_path)
    ckpt_dir = tmp_path / "ckpt"
    ckpt_dir.mkdir()
    assert checkpoint.resume_path(str(ckpt_dir), SETTINGS, True) is None  # the run's own stamp
    last = ckpt_dir / "last.ckpt"
    shutil.copyfile(PLANTED, last)
    if signed:
        checksum.sign(last)
    other_rank = checkpoint.resume_path(str(ckpt_dir), SETTINGS, False)
    assert not (tmp_path / MARKER).exists(), "inspecting the checkpoint ran its code"
    assert other_rank is None and checkpoint.resume_path(str(ckpt_dir), SETTINGS, True) is None
    assert not last.exists() and (ckpt_dir / "last.ckpt.damaged").read_bytes() == PLANTED.read_bytes()
    said = capsys.readouterr().out
    assert f"ddpscale: {last} is not resumed (" in said and "no whole checkpoint left; starting this run fresh" in said
    if signed:
        assert "it holds io.open, which torch would load only by running code" in said
        assert "torch.serialization.add_safe_globals (docs/your-model.md)" in said
    aside = ckpt_dir / "last.ckpt.damaged"
    assert "io.open" in checkpoint.unloadable(aside)
    assert checkpoint.problem(aside, interrupted=False).startswith("is not resumed (")
    assert not (tmp_path / MARKER).exists(), "inspecting the checkpoint ran its code"


@pytest.mark.parametrize("content", ["[1, 2]", '"text"', "{cut", '{"fingerprint": "F", "record": [1]}',
                                     '{"fingerprint": "F", "record": {"topology": "1x1"}}', '{"record": null}'])
def test_a_finished_record_of_another_shape_is_as_good_as_none(tmp_path, content):
    """final.json, kept for a retry of a finished run: one that is not what finish() writes
    makes the run train (or resume) as if there were none, never an AttributeError."""
    from helpers.records import make_run

    (tmp_path / checkpoint.FINAL).write_text(content.replace('"F"', f'"{checkpoint.identity.digest(SETTINGS)}"'))
    assert checkpoint.finished_record(str(tmp_path), SETTINGS, attempt=2, is_rank_zero=False) is None
    assert checkpoint.finished_record(str(tmp_path), SETTINGS, attempt=2, is_rank_zero=True) is None
    assert not (tmp_path / checkpoint.FINAL).exists()
    record = {k: v for k, v in make_run().items() if k != "schema_version"}
    checkpoint.finish(str(tmp_path), SETTINGS, record)
    # core/record writes it, stamped with the schema version as metrics.json is
    stamped = {**record, "schema_version": run_record.SCHEMA_VERSION}
    assert checkpoint.finished_record(str(tmp_path), SETTINGS, attempt=2, is_rank_zero=True) == stamped


def test_a_finished_record_of_another_schema_version_is_as_good_as_none(tmp_path):
    from helpers.records import make_run

    older = {**make_run(), "schema_version": run_record.SCHEMA_VERSION - 1}
    (tmp_path / checkpoint.FINAL).write_text(json.dumps({"fingerprint": checkpoint.identity.digest(SETTINGS),
                                                         "record": older}))
    assert checkpoint.finished_record(str(tmp_path), SETTINGS, attempt=2, is_rank_zero=True) is None
    assert not (tmp_path / checkpoint.FINAL).exists()
