"""The epoch metric after every validation (ddpscale.job.measure.accuracy) recorded by train.py end to
end (on a real tiny CPU fit in this process, crossing the time-to-accuracy target at a known
epoch, and resumed: tests/unit/job/measure/test_valhistory.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest

from ddpscale.run import runspec

from helpers.training import train_args
from helpers.workflow import ROOT


def test_train_py_records_the_history_of_the_epoch_metric_it_is_given(tmp_path, data_file):
    """train.py end to end on one process: --epoch-metric names the metric, and metrics.json
    pairs every epoch's value with the running epoch time."""
    argv = [*train_args(data_file, tmp_path), "--epoch-metric", "val_acc"]
    spec = runspec.parse(argv)
    assert spec.epoch_metric == "val_acc"
    assert "epoch_metric" not in spec.measured(), "naming another metric must not retrain a run"
    assert "--epoch-metric" not in spec.command(rerun=True), "nor make Snakemake rerun it"
    done = subprocess.run([sys.executable, str(ROOT / "scripts/train.py"), *argv],
                          capture_output=True, text=True, timeout=150, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["val_history_metric"] == "val_acc" and metrics["val_history_reason"] is None
    assert [e["epoch"] for e in metrics["val_history"]] == [0, 1]
    assert metrics["val_history"][-1]["value"] == pytest.approx(metrics["val_acc"])
    assert [e["elapsed_s"] for e in metrics["val_history"]] == pytest.approx(
        pd.Series(metrics["epoch_times_s"]).cumsum().tolist())
