"""self.logger is what plain Lightning gives the same module (ddpscale.job.build.default_logger_kind):
a TensorBoardLogger where tensorboard or tensorboardX is installed (tensorboardX is, for the
tests), else a CSVLogger, written in the run's own folder. A module written against the
TensorBoard logger, as Lightning's guide shows (tests/fixtures/usermods/tblogging.py), trains and
its histograms are there; where the packages are hidden, the run has the CSVLogger instead."""
from __future__ import annotations

import json
import struct

import pytest
from helpers.training import assert_counted, run_user_module
from helpers.workflow import ROOT
from ddpscale.core.spiral import split_sizes

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

SOURCE = (ROOT / "tests/fixtures/usermods/tblogging.py").read_text()
# the conftest data_file: 1200 spiral points, split 0.7/0.15/0.15
TRAIN_SAMPLES = split_sizes(1200, [0.7, 0.15, 0.15])["train"]
# Python's startup hook, put first on PYTHONPATH: tensorboard and tensorboardX neither import nor
# show as installed (importlib.metadata), as on a machine without them
HIDDEN = '''
import importlib.machinery
import sys

HIDDEN = {"tensorboard", "tensorboardX"}


class HidingPathFinder(importlib.machinery.PathFinder):
    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        if fullname.partition(".")[0] in HIDDEN:
            return None
        return super().find_spec(fullname, path, target)

    @classmethod
    def find_distributions(cls, *args, **kwargs):
        return (d for d in super().find_distributions(*args, **kwargs) if d.metadata["Name"] not in HIDDEN)


sys.meta_path[:] = [HidingPathFinder if f is importlib.machinery.PathFinder else f for f in sys.meta_path]
'''


def events(folder) -> list:
    """Every Event in the TensorBoard event files of folder (TFRecord: length, its CRC, the
    record, its CRC)."""
    from tensorboardX.proto.event_pb2 import Event

    found = []
    for path in sorted(folder.glob("events.out.tfevents.*")):
        data = path.read_bytes()
        at = 0
        while at < len(data):
            (length,) = struct.unpack("<Q", data[at:at + 8])
            found.append(Event.FromString(data[at + 12:at + 12 + length]))
            at += 12 + length + 4
    return found


def parameter_names() -> list[str]:
    """The parameters of the module the run imports, by their names."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("tblogging", ROOT / "tests/fixtures/usermods/tblogging.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return [name for name, _ in module.HistogramNet().named_parameters()]


@pytest.mark.parametrize("devices", [1, 2])
def test_a_module_written_for_the_tensorboard_logger_trains_and_logs_in_the_run_s_folder(tmp_path, data_file,
                                                                                       devices):
    done = run_user_module(tmp_path, SOURCE, "tblogging.HistogramNet", data_file, "--measure", "full",
                           devices=devices)
    assert done.returncode == 0, done.stderr[-3000:]
    m = json.loads((tmp_path / "metrics.json").read_text())
    assert m["loggers"] == ["TensorBoardLogger"]
    assert_counted(m, done.stdout + done.stderr, per_epoch=TRAIN_SAMPLES)
    logs = tmp_path / "logs" / "attempt-1"  # beside metrics.json, one folder per attempt
    written = events(logs)
    histograms = {(v.tag, e.step) for e in written for v in e.summary.value if v.HasField("histo")}
    epochs = range(m["epochs_completed"])
    assert histograms == {(name, epoch) for name in parameter_names() for epoch in epochs}
    tags = {v.tag for e in written for v in e.summary.value}
    assert {"_hparams_/experiment", "hp/val_loss", "hp/val_acc"} <= tags  # log_hyperparams(params, metrics)
    assert "width: 16" in (logs / "hparams.yaml").read_text()


def test_without_tensorboard_the_run_has_lightning_s_csv_logger(tmp_path, data_file):
    (tmp_path / "sitecustomize.py").write_text(HIDDEN)
    done = run_user_module(tmp_path, SOURCE, "tblogging.AnyLoggerNet", data_file, "--measure", "full")
    assert done.returncode == 0, done.stderr[-3000:]
    m = json.loads((tmp_path / "metrics.json").read_text())
    assert m["loggers"] == ["CSVLogger"]
    assert_counted(m, done.stdout + done.stderr, per_epoch=TRAIN_SAMPLES)
    logs = tmp_path / "logs" / "attempt-1"
    assert not list(logs.glob("events.out.tfevents.*"))
    header, *rows = (logs / "metrics.csv").read_text().splitlines()
    assert "weight_norm" in header.split(",") and len(rows) >= m["epochs_completed"]
    assert "width: 16" in (logs / "hparams.yaml").read_text()


def test_a_test_pass_in_fit_s_last_second_keeps_fit_s_events(tmp_path, monkeypatch):
    """tensorboardX names an event file by the second it opens and truncates one of that name:
    the test pass's writer, reopened after fit closed it, erased fit's events whenever both fell
    in one second (the clock is held still here, so that is every time)."""
    from types import SimpleNamespace

    from pytorch_lightning.loggers import TensorBoardLogger
    from tensorboardX import event_file_writer

    from ddpscale.job.build import keep_fit_events

    monkeypatch.setattr(event_file_writer.time, "time", lambda: 1795884630.25)
    logger = TensorBoardLogger(save_dir=str(tmp_path), name="", version="attempt-1")
    logger.log_metrics({"train_loss": 1.0}, step=1)
    logger.finalize("success")  # as fit ends
    keep_fit_events(SimpleNamespace(loggers=[logger]))
    logger.log_metrics({"test_acc": 0.5}, step=2)  # the test pass
    logger.finalize("success")
    tags = {v.tag for e in events(tmp_path / "attempt-1") for v in e.summary.value}
    assert {"train_loss", "test_acc"} <= tags
