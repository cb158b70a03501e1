"""Validations and checkpoint saves as real runs make them, against what the projection counts
(ddpscale.report.figures.projection.events): Lightning decides when they happen, so the count the
projection multiplies by is checked against Lightning itself, not against our reading of it;
and a module's own callbacks (configure_callbacks) ending a training early, as the report says it.

The data: 840 training samples, batch 32, one device: 27 steps an epoch.
"""
from __future__ import annotations

import json

import pandas as pd
import pytest

from helpers.training import measured

from ddpscale.report.load import description
from ddpscale.report.figures import projection

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def full(tmp_path, data_file, epochs: int, trainer_args: dict) -> dict:
    return measured(tmp_path, data_file, 1, 1, "--measure", "full", "--max-epochs", str(epochs),
                    "--trainer-args", json.dumps(trainer_args))


@pytest.mark.parametrize("trainer_args,validated,saved", [
    ({}, [0, 1, 2, 3], [0, 1, 2, 3]),
    ({"check_val_every_n_epoch": 2}, [1, 3], [1, 3]),  # Lightning then saves after validation only
    ({"limit_val_batches": 0}, [], [0, 1, 2, 3]),  # no validation: a save at every epoch's end
    ({"check_val_every_n_epoch": 3, "limit_val_batches": 0}, [], []),
])
def test_the_projection_counts_the_validations_and_saves_lightning_makes(tmp_path, data_file, trainer_args,
                                                                         validated, saved):
    m = full(tmp_path, data_file, 4, trainer_args)
    assert [e for e, _ in m["validation_s"]] == validated
    assert [e for e, _ in m["checkpoint_save_s"]] == saved
    assert all(s > 0 for _, s in m["validation_s"] + m["checkpoint_save_s"])
    assert projection.events(4, m["check_val_every_n_epoch"], m["validates"]) == (len(validated), len(saved))
    # full mode times nothing after its training
    assert m["after_stop_validation_s"] == [] and m["after_stop_checkpoint_s"] == []


def test_a_throughput_run_that_stopped_before_any_validation_times_two_of_each(tmp_path, data_file):
    """check_val_every_n_epoch 2 and a stop in the first epoch: the run validated and saved
    nothing while training, so after its stop it validates and saves twice (the first cold, the
    second warm), and the projection counts 25 validations and saves in 50 epochs, not 50 or 0."""
    m = measured(tmp_path, data_file, 1, 1, "--measure", "throughput", "--max-epochs", "50",
                 "--trainer-args", json.dumps({"check_val_every_n_epoch": 2}), "--epoch-metric", "val_acc",
                 max_steps=25)
    assert m["epochs_completed"] == 1 and m["validation_s"] == [] and m["checkpoint_save_s"] == []
    assert len(m["after_stop_validation_s"]) == 2 and len(m["after_stop_checkpoint_s"]) == 2
    assert projection.events(50, m["check_val_every_n_epoch"], m["validates"]) == (25, 25)
    assert not (tmp_path / "ckpt" / "warm-save.ckpt").exists()  # the timed saves are scratch
    assert m["val_history"] == []  # the validations after the stop trained nothing: no epoch's value
    projected, why = projection.project_run(m)
    assert why is None and projected > 50 * m["samples_per_epoch"] / m["window_throughput_samples_s"]


def test_a_throughput_run_that_validated_at_its_stop_times_one_more(tmp_path, data_file):
    m = measured(tmp_path, data_file, 1, 1, "--measure", "throughput", "--max-epochs", "50", max_steps=25)
    fit_validations = len(m["validation_s"])
    assert fit_validations == m["epochs_completed"] == m["checkpoint_saves"] == 1  # at the stop, cold
    assert len(m["after_stop_validation_s"]) == len(m["after_stop_checkpoint_s"]) == 1


EARLY_STOPPING = '''
from pytorch_lightning.callbacks import EarlyStopping, ModelCheckpoint

from ddpscale.workloads.models import SpiralMLP


class StopsEarly(SpiralMLP):
    """configure_callbacks as Lightning's docs write it: an EarlyStopping (here one that stops
    at the first epoch that does not raise val_loss: the second) and a ModelCheckpoint of its
    own, with no folder named."""

    def configure_callbacks(self):
        return [EarlyStopping(monitor="val_loss", mode="max", patience=0), ModelCheckpoint(monitor="val_loss")]
'''


@pytest.mark.parametrize("devices", [1, 2])
def test_a_module_s_early_stop_is_recorded_said_and_compared_like_for_like(tmp_path, data_file, devices):
    from helpers.training import run_user_module
    from helpers.workflow import ROOT
    from helpers.records import build

    before = set(ROOT.iterdir())
    done = run_user_module(tmp_path, EARLY_STOPPING, "stopsearly.StopsEarly", data_file, "--max-epochs", "4",
                           "--measure", "full", devices=devices)
    assert done.returncode == 0, done.stderr[-3000:]
    m = json.loads((tmp_path / "metrics.json").read_text())
    assert m["early_stop"] == {"by": "EarlyStopping", "epochs_trained": 2, "configured_epochs": 4}
    assert m["epochs_completed"] == 2 and m["module_callbacks"] == ["EarlyStopping", "ModelCheckpoint"]
    # the module's own checkpoint lands in the run's folder (under its logger), not where it ran
    assert list((tmp_path / "logs" / "attempt-1" / "checkpoints").glob("*.ckpt"))
    assert set(ROOT.iterdir()) == before
    # the report marks the row, and checks the projection of the 2 epochs it trained, not of 4
    data = build([m], baseline=m["topology"])
    assert "stopped early: 2 of 4 epochs (EarlyStopping)" in data.summary.loc[0, "caveats"]
    assert description.describe(pd.DataFrame([m]))["module_callbacks"] == "EarlyStopping, ModelCheckpoint"
    row = data.projection.iloc[0]
    two = projection.project_run({**m, "configured_epochs": 2})[0]
    assert row["epochs"] == 4 and row["error"] == pytest.approx(two / row["measured_s"] - 1)
