"""metrics.json has one writer and one reader (ddpscale.core.record), and one schema version."""

from __future__ import annotations

import ast
import json

import pytest

from helpers.records import make_run
from helpers.workflow import ROOT
from ddpscale.core import record


def test_a_written_record_reads_back_stamped_with_this_version(tmp_path):
    path = tmp_path / "metrics.json"
    run = make_run()
    del run["schema_version"]
    record.write(path, run)
    assert record.read(path) == {**run, "schema_version": record.SCHEMA_VERSION}
    assert not list(tmp_path.glob("*.tmp*")), "written atomically, nothing left beside it"


@pytest.mark.parametrize("version", [record.SCHEMA_VERSION - 1, record.SCHEMA_VERSION + 1, None, "2"])
def test_another_version_is_refused_in_one_line_saying_how_to_regenerate_it(tmp_path, version):
    path = tmp_path / "metrics.json"
    path.write_text(json.dumps({**make_run(), "schema_version": version}))
    with pytest.raises(ValueError) as err:
        record.read(path)
    message = str(err.value)
    assert message.startswith(f"{path}: a run record of schema_version {version!r}")
    assert "run the workflow again: it sets that file aside and retrains that run" in message and "\n" not in message


def test_only_the_record_module_writes_metrics_json():
    """train.py hands the record over; no other code of ours writes the file."""
    writers = []
    for path in [*(ROOT / "scripts").glob("*.py"), *(ROOT / "scripts/ddpscale").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) in (
                    "write_json_atomic", "write_text", "dump") and "metrics" in ast.unparse(node.args[0] if node.args else node):
                writers.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert writers == [], writers


@pytest.mark.parametrize("key", ["held_devices", "measure", "logged_metrics", "val_history", "window_seconds"])
def test_a_record_without_a_key_the_report_reads_is_refused_naming_the_file_and_the_key(tmp_path, key):
    """No reader falls back to a default for a key train.py always writes: a record without it is
    not one of this ddpscale's, and the report says so instead of showing a guess."""
    assert key in record.REQUIRED_KEYS
    path = tmp_path / "metrics.json"
    path.write_text(json.dumps({k: v for k, v in make_run().items() if k != key}))
    with pytest.raises(ValueError) as err:
        record.read(path)
    assert str(err.value).startswith(f"{path}: missing required key(s): {key};")
    assert "run the workflow again" in str(err.value) and "\n" not in str(err.value)


def test_the_test_record_carries_every_required_key():
    assert [k for k in record.REQUIRED_KEYS if k not in make_run()] == []


@pytest.mark.parametrize("key, value, said", [
    ("world_size", "4", "world_size is text, not integer"),
    ("throughput_samples_s", True, "throughput_samples_s is true/false, not number or null"),
    ("hosts", {"a": 1}, "hosts is mapping, not list"),
    ("topology", None, "topology is null, not text"),
    ("identity", [], "identity is list, not mapping"),
    ("throughput", 0.02, "throughput is number, not mapping"),
    # the stopping rule's settings by their config names, read back into the rule's one validator
    ("throughput", {"precision": 0.02}, "throughput: throughput settings must be exactly precision, "),
    ("throughput", {"precision": 0.02, "window_steps": 0, "min_windows": 30, "max_steps": None, "max_minutes": 10},
     "throughput: throughput.window_steps must be an integer >= 1, got 0"),
])
def test_a_field_of_the_wrong_kind_is_refused_naming_the_field_and_both_kinds(tmp_path, key, value, said):
    """A record of the wrong shape stops the report in one line, not in an AttributeError deep in
    pandas."""
    path = tmp_path / "metrics.json"
    path.write_text(json.dumps({**make_run(), key: value}))
    with pytest.raises(ValueError) as err:
        record.read(path)
    assert str(err.value).startswith(f"{path}: {said}") and "\n" not in str(err.value)


def test_a_whole_number_is_a_number_and_the_test_record_has_every_kind_right():
    assert record.validate({**make_run(), "fit_time_s": 3}, "m.json")["fit_time_s"] == 3
    assert record.validate(make_run(), "m.json")
