"""State that heals, on the local workflow for real: a damaged run record makes its run rerun,
and a report job that fails keeps the previous report (issue 32, item 3)."""

from __future__ import annotations

import re

import pytest

from conftest import tiny_config
from test_status import run_status
from test_workflow_local import job_counts

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]


def test_a_truncated_record_is_set_aside_and_its_run_retrained(workspace):
    workspace.write_config(tiny_config(topologies=["1x1", "1x2"]))
    first = workspace.snakemake()
    assert first.returncode == 0, first.stderr[-4000:]
    metrics = workspace.metrics("1x2")
    whole = metrics.read_text()
    metrics.write_text(whole[: len(whole) // 2])  # a record cut short

    status = run_status(workspace.path).stdout
    assert re.search(r"^1x2 +r0 +unreadable +metrics\.json unreadable: will rerun \(not valid JSON", status, re.M), \
        status

    dry = workspace.snakemake("-n")
    assert dry.returncode == 0, dry.stderr[-4000:]
    said = f"{metrics.relative_to(workspace.path)} is unreadable (not valid JSON"
    assert f"ddpscale: {said}" in dry.stderr and "set aside as metrics.json.unreadable: this run will rerun" \
        in dry.stderr, dry.stderr[-4000:]
    assert job_counts(dry.stdout + dry.stderr).get("train_single_node") == 1
    assert "train_baseline" not in job_counts(dry.stdout + dry.stderr)
    assert (metrics.parent / "metrics.json.unreadable").read_text() == whole[: len(whole) // 2]  # kept

    again = workspace.snakemake()
    assert again.returncode == 0, again.stderr[-4000:]
    assert metrics.read_text() != whole[: len(whole) // 2] and "done" in run_status(workspace.path).stdout
