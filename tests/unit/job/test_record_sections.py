"""The record has one author: the job's recorder (ddpscale.job.record) assembles metrics.json
from sections each concept writes, and every key it can write is declared in core/record,
which refuses one that is not. Trains nothing: each section is built from its owner's state
before any training."""

from __future__ import annotations

import ast
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from helpers.records import make_run
from helpers.training import train_args
from helpers.workflow import ROOT
from ddpscale.core import record as run_record
from ddpscale.job import callbacks
from ddpscale.job import record as recorder
from ddpscale.run import runspec


def built(tmp_path, **changes) -> dict:
    """The record the recorder writes of a run built from its spec but never trained."""
    spec = replace(runspec.parse(train_args(tmp_path / "data.npz", tmp_path)), **changes)
    trainer = SimpleNamespace(strategy=SimpleNamespace(root_device=torch.device("cpu")),
                              lightning_module=torch.nn.Linear(2, 2), optimizers=[torch.optim.SGD([
                                  torch.nn.Parameter(torch.zeros(1))], lr=0.1)], loggers=[], callbacks=[])
    after = recorder.AfterFit(started=recorder.now(), fit_wall_s=1.0, identity={"digest": "d"}, early_stop=None,
                              module_callbacks=[], logged={"val_acc": 0.5}, backend=None, transports=None)
    measured = callbacks.build(spec)
    measured.windows.validates = True  # as training's start sets it
    return recorder.record(spec, trainer, measured, after)


def test_the_recorder_writes_exactly_the_declared_keys(tmp_path):
    """Every key a run can write (a probed repeat compiled with torch.compile writes them all) is
    declared in core/record, with its kind; and every declared key is one the job writes."""
    everything = built(tmp_path, probe=True, compile="default")
    assert set(everything) | {"schema_version"} == set(run_record.DECLARED)
    plain = built(tmp_path)
    assert set(plain) | {"schema_version"} == set(run_record.DECLARED) - {
        "probe", "compile_graphs", "compile_graph_breaks", "compile_recompiles", "compile_recompile_reasons"}
    for record in (everything, plain):  # of the kinds declared: the reader takes what the job writes
        assert run_record.problem(run_record.finite({**record, "schema_version": run_record.SCHEMA_VERSION})) is None


def test_each_section_is_declared_by_itself():
    """A section names its own keys only: the recorder refuses one declared elsewhere, or nowhere."""
    with pytest.raises(ValueError, match="undeclared key\\(s\\) backend"):
        run_record.section("probe", {"probe_s": 0.0, "backend": None})
    with pytest.raises(ValueError, match="missing key\\(s\\) probe_s"):
        run_record.section("probe", {})
    assert run_record.section("probe", {"probe_s": 1.5}) == {"probe_s": 1.5}


def test_a_key_with_a_unit_says_it():
    units = run_record.UNITS
    assert units["throughput_samples_s"] == "samples/s" and units["held_s"] == "s"
    assert units["achieved_tflops"] == "TFLOP/s" and units["gpu_peak_memory_mb"] == "MB"
    seconds = [key for key in run_record.DECLARED if key.endswith("_s") and not key.endswith("samples_s")]
    assert seconds and [key for key in seconds if units.get(key) != "s"] == []


def test_the_reader_refuses_an_undeclared_key(tmp_path):
    found = run_record.problem({**make_run(), "samples_per_second": 1.0})
    assert found is not None and found[0] == "undeclared key(s): samples_per_second"
    # a declared key only some runs write is checked for its kind where present
    found = run_record.problem({**make_run(), "compile_graphs": "3"})
    assert found is not None and "compile_graphs is text, not integer" in found[0]


def test_the_headline_throughput_is_written_in_one_place():
    """Only ddpscale.job.measure.windows.headline names throughput_samples_s as a key the job writes."""
    writers = []
    for path in sorted((ROOT / "scripts/ddpscale/job").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Dict) and any(isinstance(k, ast.Constant) and k.value == "throughput_samples_s"
                                                  for k in node.keys):
                writers.append(path.relative_to(ROOT).as_posix())
            if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store) and \
                    isinstance(node.slice, ast.Constant) and node.slice.value == "throughput_samples_s":
                writers.append(path.relative_to(ROOT).as_posix())
    assert writers == ["scripts/ddpscale/job/measure/windows.py"]
