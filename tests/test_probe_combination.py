"""Probes combined with runs (issue 20, item 9): the comm term is the gradient all-reduced in
DDP's buckets, and a probe file given with report.py --probes must describe the runs it joins."""
from __future__ import annotations

import pytest

from ddpscale.report import breakdown
from test_breakdown import probe


def test_the_comm_term_is_the_gradient_in_ddp_s_buckets():
    record = probe("1x2", 2, 0.0005, 0.003, 0.001, 0.002)
    # 20 buckets of GPT-2 small take longer than one message of the whole gradient
    record["allreduce_ddp"] = {"bucket_bytes": [1, 2], "buckets": 2, "bytes": 3, "time_s": 0.005, "iters": 3}
    assert breakdown.allreduce_s(record) == pytest.approx(0.005)
    assert breakdown.comm_per_batch_s({**record, "step": {**record["step"], "accumulate_grad_batches": 5}}) \
        == pytest.approx(0.001)
    del record["allreduce_ddp"]  # a probe made before: the sweep's largest message
    assert breakdown.allreduce_s(record) == pytest.approx(0.002)


def test_the_probe_reads_the_bucket_cap_the_run_s_ddp_was_given():
    from pytorch_lightning.strategies import DDPStrategy

    from ddpscale.training import probing

    assert probing.bucket_cap_mb(DDPStrategy(bucket_cap_mb=50)) == 50
    assert probing.bucket_cap_mb(DDPStrategy()) is None
    assert probing.bucket_cap_mb(object()) is None  # one device: no DDP strategy


# -- report.py --probes: a probe file must describe the runs it joins ------------------

def probe_file_record(topology="1x2", **changes):
    """What scripts/probe.py writes for make_run's 1x2 (the fields the check reads)."""
    from test_breakdown import probe as probe_record

    record = probe_record(topology, 2, 0.0005, 0.003, 0.001, 0.002)
    record.update({"num_nodes": 1, "devices_per_node": 2, "precision": "32-true", "device_kind": "cpu",
                   "device_name": "cpu, simulated", "gradient_numel": 1000,
                   "model": {"class": "M", "args": {"hidden": 8}}})
    record["step"]["batch_per_device"] = 32
    step = changes.pop("step", {})
    record["step"].update(step)
    record.update(changes)
    return record


def runs_of(*runs):
    import pandas as pd

    return pd.DataFrame([{**r, "source": f"runs/{r['topology']}/metrics.json"} for r in runs])


def matching_run(topology="1x2", **changes):
    from test_analysis import make_run

    run = make_run(topology, model_trainable_parameters=1000)
    run["identity"]["settings"]["model_args"] = '{"hidden": 8}'
    return {**run, **changes}


@pytest.mark.parametrize("changes, named", [
    ({"precision": "bf16-mixed"}, "precision 'bf16-mixed' (run: '32-true')"),
    ({"step": {"batch_per_device": 64}}, "batch_per_device 64 (run: 32)"),
    ({"device_kind": "cuda", "device_name": "NVIDIA H100 80GB HBM3"}, "device_kind 'cuda' (run: 'cpu')"),
    ({"device_name": "cpu, other"}, "device_name 'cpu, other'"),
    ({"num_nodes": 2, "devices_per_node": 1}, "num_nodes 2 (run: 1)"),
    ({"model": {"class": "Other", "args": {"hidden": 8}}}, "model_class 'Other' (run: 'M')"),
    ({"model": {"class": "M", "args": {"hidden": 16}}}, "model_args {'hidden': 16} (run: {'hidden': 8})"),
    ({"gradient_numel": 999}, "model_trainable_parameters 999 (run: 1000)"),
])
def test_a_probe_unlike_its_runs_is_refused_naming_the_file_and_the_fix(tmp_path, changes, named):
    import json

    path = tmp_path / "probe.json"
    path.write_text(json.dumps(probe_file_record(**changes)))
    with pytest.raises(ValueError) as err:
        breakdown.load_probes([path], runs_of(matching_run()))
    message = str(err.value)
    assert message.startswith(f"{path}: this probe does not describe run runs/1x2/metrics.json")
    assert named in message and "rerun scripts/probe.py" in message and "\n" not in message


def test_a_probe_of_a_topology_without_runs_is_refused(tmp_path):
    import json

    path = tmp_path / "probe.json"
    path.write_text(json.dumps(probe_file_record("2x4", world_size=8)))
    with pytest.raises(ValueError, match=r"probe.json: a probe of topology '2x4', but no run of it was given"):
        breakdown.load_probes([path], runs_of(matching_run()))


def test_a_probe_like_its_runs_is_taken(tmp_path):
    import json

    path = tmp_path / "probe.json"
    path.write_text(json.dumps(probe_file_record()))
    assert set(breakdown.load_probes([path], runs_of(matching_run("1x1"), matching_run()))) == {"1x2"}


def test_report_py_refuses_a_mismatched_probe_file_in_one_line(tmp_path):
    import json

    from test_report_script import run_report, write_fixtures

    path = tmp_path / "probe.json"
    path.write_text(json.dumps(probe_file_record(precision="16-mixed")))
    proc = run_report(write_fixtures(tmp_path, [matching_run("1x1"), matching_run()]), tmp_path / "out",
                      "--probes", str(path))
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith(f"ddpscale report: {path}: this probe does not describe run ")
    assert "precision '16-mixed' (run: '32-true')" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
