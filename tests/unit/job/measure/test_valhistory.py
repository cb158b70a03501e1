"""The epoch metric after every validation (ddpscale.job.measure.accuracy) on a real tiny CPU
fit, whose module logs a scripted value the ordinary Lightning way, so the metric crosses the
time-to-accuracy target at a known epoch; a resumed fit keeps the epochs validated before
(train.py recording it: tests/workflow/test_valhistory.py)."""

from __future__ import annotations

import pandas as pd
import pytest
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from ddpscale.report.figures import timetoacc
from ddpscale.job.measure.timing import EpochTiming
from ddpscale.job.measure.accuracy import ValHistory, with_elapsed

SCRIPTED = [0.50, 0.70, 0.86, 0.90, 0.91]  # a target of 0.88: first reached at epoch 3 (0-based)


class Scripted(pl.LightningModule):
    def __init__(self, values=SCRIPTED):
        super().__init__()
        self.values = values
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        (x,) = batch
        return self.layer(x).pow(2).mean()

    def validation_step(self, batch, batch_idx):
        self.log("val_acc", self.values[self.current_epoch])
        self.log("val_loss", 1.0 - self.values[self.current_epoch])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self):
        return DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=4)

    def val_dataloader(self):
        return DataLoader(TensorDataset(torch.randn(4, 2)), batch_size=4)


def fit(epochs: int, callbacks: list, ckpt_path=None, tmp_path=None, **kwargs) -> pl.Trainer:
    # num_sanity_val_steps=2 (the default): the sanity check's validation must not be recorded
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=epochs, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=tmp_path, callbacks=callbacks, **kwargs)
    trainer.fit(Scripted(), ckpt_path=ckpt_path)
    return trainer


def test_each_epoch_is_recorded_and_the_target_is_timed_at_the_crossing_epoch(tmp_path):
    timing, history = EpochTiming(warmup_epochs=0), ValHistory("val_acc")
    fit(len(SCRIPTED), [timing, history], tmp_path=tmp_path, enable_checkpointing=False)
    assert history.history == [{"epoch": i, "value": pytest.approx(v)} for i, v in enumerate(SCRIPTED)]
    entries = with_elapsed(history.history, timing.epoch_times)
    assert [e["elapsed_s"] for e in entries] == pytest.approx(pd.Series(timing.epoch_times).cumsum().tolist())
    section = history.section({"val_acc": 0.9}, timing.epoch_times)
    assert section["val_history_metric"] == "val_acc" and section["val_history_reason"] is None
    assert section["val_history"] == entries and section["val_acc"] == 0.9 and section["val_loss"] is None

    # the baseline's record as train.py writes it, and a topology that trained the same way
    record = {"topology": "1x1", "world_size": 1, "measure": "full", "val_history": entries,
              "val_history_metric": "val_acc"}
    runs = pd.DataFrame([record])
    out = timetoacc.table(runs, pd.DataFrame([{"topology": "1x1", "world_size": 1, "speedup": 1.0}]),
                          "1x1", timetoacc.target(runs, "1x1", 0.02, fixed=0.88))
    assert out.loc[0, "epochs_to_target"] == 4
    assert out.loc[0, "time_to_accuracy_s"] == pytest.approx(sum(timing.epoch_times[:4]))


def test_a_resumed_fit_keeps_the_epochs_validated_before(tmp_path):
    checkpoint = pl.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)
    fit(2, [ValHistory("val_acc"), checkpoint], tmp_path=tmp_path)
    resumed = ValHistory("val_acc")  # a new process: its state comes from the checkpoint only
    fit(4, [resumed, pl.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)],
        ckpt_path=str(tmp_path / "ckpt/last.ckpt"), tmp_path=tmp_path)
    assert [e["epoch"] for e in resumed.history] == [0, 1, 2, 3]
    assert [e["value"] for e in resumed.history] == pytest.approx(SCRIPTED[:4])


def test_a_metric_never_logged_says_what_was(tmp_path):
    history = ValHistory("val_accuracy")
    fit(1, [history], tmp_path=tmp_path, enable_checkpointing=False)
    section = history.section({}, [])
    assert {k: section[k] for k in ("val_history", "val_history_metric", "val_history_reason")} == {
        "val_history": [], "val_history_metric": "val_accuracy",
        "val_history_reason": "val_accuracy was not logged at validation; logged: val_acc, val_loss"}


def test_elapsed_is_the_running_sum_and_an_unfinished_epoch_gets_none():
    history = [{"epoch": 0, "value": 0.1}, {"epoch": 1, "value": 0.2}, {"epoch": 2, "value": 0.3}]
    out = with_elapsed(history, [2.0, 3.0])
    assert [e["elapsed_s"] for e in out] == [2.0, 5.0, None]
    assert out[0] == {"epoch": 0, "value": 0.1, "elapsed_s": 2.0}


def test_the_sanity_check_validation_is_not_an_epoch(tmp_path):
    # no epoch validates (every 2nd, 1 epoch), but the sanity check does, before training
    history = ValHistory("val_acc")
    fit(1, [history], tmp_path=tmp_path, enable_checkpointing=False, check_val_every_n_epoch=2)
    assert history.history == [] and history.reason() == "no validation ran"
