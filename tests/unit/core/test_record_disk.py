"""Run records on disk are read safely or named, never hang, crash or fool a reader: what is not
a regular file, numbers that are not finite, lists of the wrong elements, a record copied into
another run's folder, and one that cannot be set aside in a read-only folder."""

from __future__ import annotations

import json
import os
import re
import threading
from pathlib import Path

import pytest
from helpers.configs import plan, source
from helpers.records import make_run
from helpers.status import run_status, write_tree
from helpers.workflow import ROOT
from ddpscale.core import io, record
from ddpscale.plan import runplan
from ddpscale.plan.cost import timelimit
from ddpscale.report.load import records as report_records
from ddpscale.status import rows as status
from ddpscale.status import sources

NONFINITE = json.loads((ROOT / "tests/fixtures/adversarial/record_nonfinite.json.txt").read_text())


def finishes(call, timeout: float = 10.0):
    """call() run in a thread, and its outcome; fails (instead of hanging the suite) when it is
    still blocked after timeout: a wait for a state, not a sleep."""
    outcome = {}

    def run():
        try:
            outcome["value"] = call()
        except Exception as err:  # noqa: BLE001 - handed to the test
            outcome["error"] = err

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), "the read blocked"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def write_record(path: Path, run: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(run))
    return path


@pytest.mark.parametrize("make", [os.mkfifo, os.mkdir], ids=["fifo", "directory"])
def test_a_record_that_is_not_a_regular_file_is_named_not_waited_on(tmp_path, make):
    path = tmp_path / "runs/1x1/r0/metrics.json"
    path.parent.mkdir(parents=True)
    make(path)
    found, why = finishes(lambda: record.load(path))
    assert found is None and why.startswith("cannot read: ") and "not a regular file" in why
    with pytest.raises(ValueError, match="not a regular file"):
        finishes(lambda: record.read(path))


def test_a_device_in_place_of_a_record_is_named():
    found, why = finishes(lambda: record.load("/dev/zero"))
    assert found is None and "a character device, not a regular file" in why


def test_make_status_names_a_fifo_record_and_does_not_hang(tmp_path):
    path = tmp_path / status.metrics_path("1x1", 0)
    path.parent.mkdir(parents=True)
    os.mkfifo(path)
    runs = finishes(lambda: sources.read_runs(tmp_path, [("1x1", 0)]))
    row = status.run_row("1x1", 0, runs[("1x1", 0)], None, False, 0.0, "1x1", None)
    assert row.state == "unreadable" and "a FIFO" in row.detail


@pytest.mark.parametrize("key, value, said", [
    ("fit_time_s", float("inf"), "fit_time_s is not a finite number"),
    ("mfu", float("nan"), "mfu is not a finite number"),
    ("epoch_times_s", [1.0, float("-inf")], "epoch_times_s[1] is not a finite number"),
    ("logged_metrics", {"val_loss": float("nan")}, "logged_metrics.val_loss is not a finite number"),
    ("val_history", [{"epoch": 0, "value": float("inf")}], "val_history[0].value is not a finite number"),
])
def test_a_number_that_is_not_finite_is_refused_naming_where(tmp_path, key, value, said):
    path = write_record(tmp_path / "metrics.json", {**make_run(), key: value})  # json writes NaN, Infinity
    found, why = record.load(path)
    assert found is None and said in why


def test_the_fixtures_infinity_and_nan_are_refused(tmp_path):
    assert NONFINITE["fit_time_s"] == float("inf")
    path = tmp_path / "metrics.json"
    path.write_text(json.dumps({**make_run(), **{k: v for k, v in NONFINITE.items() if k != "note"}}))
    _, why = record.load(path)
    assert "fit_time_s is not a finite number" in why


def test_the_writer_writes_no_number_a_reader_refuses(tmp_path):
    """A metric the module logged as inf is written as null: its record is read back, not set
    aside and retrained at every run of the workflow."""
    path = tmp_path / "metrics.json"
    record.write(path, {**make_run(), "logged_metrics": {"val_loss": float("inf"), "val_acc": 0.5}})
    assert "Infinity" not in path.read_text()
    assert record.read(path)["logged_metrics"] == {"val_loss": None, "val_acc": 0.5}


@pytest.mark.parametrize("key, value, said", [
    ("epoch_times_s", ["a"], "epoch_times_s holds text, not number"),
    ("window_seconds", [[1]], "window_seconds holds list, not number"),
    ("window_samples", [1.5], "window_samples holds number, not integer"),
    ("hosts", [1], "hosts holds integer, not text"),
    ("validation_s", [[0, 1.0], [1]], "validation_s holds list, not [epoch, seconds]"),
    ("checkpoint_save_s", [["0", 1.0]], "checkpoint_save_s holds list, not [epoch, seconds]"),
    ("val_history", [None], "val_history holds null, not mapping"),
])
def test_a_list_of_the_wrong_elements_is_refused_naming_the_field(tmp_path, key, value, said):
    path = write_record(tmp_path / "metrics.json", {**make_run(), key: value})
    found, why = record.load(path)
    assert found is None and said in why


def test_every_list_field_says_what_its_elements_are():
    lists = {key for key, field in record.DECLARED.items() if record.LIST in field.kinds}
    assert lists == set(record.ELEMENTS)
    assert record.problem(make_run()) is None, "the test record's lists hold what train.py writes"


def test_wrong_elements_no_longer_crash_the_time_limits_of_a_cluster_dry_run(in_tmp):  # noqa: F811
    """The workflow sizes throughput mode's limits from the finished records (measured_setups):
    window_seconds [[1]] made sum() raise in every dry run."""
    p = plan()
    write_record(in_tmp / p.layout.metrics("1x1", 0),
                 {**make_run("1x1"), "measure": "throughput", "window_seconds": [[1]], "held_s": 9.0})
    good = make_run("1x2", measure="throughput", window_seconds=[1.0, 2.0], held_s=10.0)
    write_record(in_tmp / p.layout.metrics("1x2", 0), good)
    assert timelimit.measured_setups(runplan.finished_records(p.layout)) == {"1x2": 7.0}


def test_a_record_copied_into_another_runs_folder_is_refused_there(tmp_path):
    run = make_run("1x2", repeat=1)
    right = write_record(tmp_path / "runs/1x2/r1/metrics.json", run)
    assert record.load(right) == (run, None)
    for folder in ("runs/1x1/r1", "runs/1x2/r0"):
        found, why = record.load(write_record(tmp_path / folder / "metrics.json", run))
        assert found is None and "the record of 1x2 repeat 1 in the folder of" in why
    with pytest.raises(ValueError, match="copied there"):
        report_records.load_runs([tmp_path / "runs/1x1/r1/metrics.json"])
    # a path of no run's shape (a test's, a user's copy to report) names no run to check
    assert record.load(write_record(tmp_path / "elsewhere.json", run)) == (run, None)


def test_the_workflow_sets_a_copied_record_aside_and_keeps_the_right_ones(in_tmp):  # noqa: F811
    p = plan(topologies=["1x1", "1x2"])
    write_record(in_tmp / p.layout.metrics("1x1", 0), make_run("1x1"))
    copied = write_record(in_tmp / p.layout.metrics("1x2", 0), make_run("1x1"))
    (line,) = runplan.set_aside_unreadable(p)
    assert line.startswith(f"{p.layout.metrics('1x2', 0)} is unreadable (the record of 1x1 repeat 0")
    assert not copied.exists() and copied.with_name("metrics.json.unreadable").exists()
    assert [r["topology"] for r in runplan.finished_records(p.layout)] == ["1x1"]


def test_a_damaged_record_in_a_read_only_folder_is_named_with_its_fix(in_tmp, monkeypatch):  # noqa: F811
    """A read-only folder makes the rename raise PermissionError. Simulated: these tests may run
    as root, whom chmod does not stop, and a read-only mount needs privileges; so os.replace
    refuses exactly where the folder would."""
    p = plan()
    damaged = write_record(in_tmp / p.layout.metrics("1x1", 0), {"cut": "short"})
    real_replace = os.replace

    def read_only_replace(src, dst):
        if Path(src).resolve().parent == damaged.resolve().parent:
            raise PermissionError(13, "Permission denied", str(src))
        return real_replace(src, dst)

    monkeypatch.setattr(io.os, "replace", read_only_replace)
    assert runplan.set_aside_unreadable(p) == []
    problems = [line for line in runplan.disk_problems(p, source) if str(damaged.relative_to(in_tmp)) in line]
    (line,) = problems
    assert "could not be set aside" in line and f"make {damaged.parent.relative_to(in_tmp)} writable" in line
    assert "\n" not in line and damaged.read_text() == '{"cut": "short"}', "nothing lost"
    # a cluster job's own parse leaves another run's record to the snakemake that scheduled it
    assert not [line for line in runplan.disk_problems(p, source, set_aside_here=False)
                if str(damaged.relative_to(in_tmp)) in line]


@pytest.mark.parametrize("planted, said", [
    ("runs/1x2/r0/metrics.json", r"^1x2 +r0 +unreadable +metrics.json unreadable: will rerun \(cannot read: a FIFO"),
    # a log was read with read_text, which waits for a FIFO's writer for ever
    ("logs/train/2x1/r0.log", r"^2x1 +r0 .*cannot read the log .*r0\.log: a FIFO, not a regular file"),
])
def test_the_status_command_names_a_fifo_record_or_log_and_ends(tmp_path, planted, said):
    """scripts/status.py as make status runs it, over a results folder holding a FIFO: it ends
    (run_status's timeout fails the test otherwise) and names it as the run's cause."""
    write_tree(tmp_path, lock=False)
    fifo = tmp_path / "out" / planted
    fifo.unlink()
    os.mkfifo(fifo)
    done = run_status(tmp_path, "--results", "out")
    assert done.returncode == 0, done.stderr
    assert re.search(said, done.stdout, re.MULTILINE), done.stdout
