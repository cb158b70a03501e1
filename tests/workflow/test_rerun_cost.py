"""A dry run's cost counts the training jobs Snakemake will run, finished runs it reruns included:
one workflow trained on the local profile, then dry runs only, each compared with Snakemake's own
job table (the arithmetic of the lines: tests/unit/plan/cost/test_reservation.py)."""
from __future__ import annotations

import re

import pytest

from helpers.workflow import Workspace, job_counts, tiny_config

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("rerun-cost"), pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Workspace:
    workspace = Workspace(tmp_path_factory.mktemp("rerun-cost") / "ws")
    workspace.write_config(tiny_config(topologies=["1x1", "1x2"]))
    done = workspace.snakemake("scaling")  # the runs, not the report
    assert done.returncode == 0, done.stderr[-4000:]
    return workspace


def dry_run(workspace: Workspace, *flags: str) -> tuple[int, int, str]:
    """(training jobs the cost line counts, training jobs in Snakemake's job table, the output)."""
    proc = workspace.snakemake("-n", *flags)
    said = proc.stderr + proc.stdout
    assert proc.returncode == 0, said[-4000:]
    total = re.search(r"ddpscale: this benchmark reserves no GPU-hours \((\d+) jobs? on this host's CPU", said)
    assert total, said[-4000:]
    table = job_counts(said) if "Job stats:" in said else {}
    return int(total[1]), sum(n for rule, n in table.items() if rule.startswith("train_")), said


def test_a_finished_workflow_counts_no_training_job(trained):
    counted, run, said = dry_run(trained)
    assert counted == run == 0
    assert "2 finished runs not counted: 1x1/r0, 1x2/r0" in said


def test_a_change_of_measure_counts_every_run_snakemake_reruns(trained):
    """The params of every run change with the measure: Snakemake reruns them all, and the cost
    counts them, each named with Snakemake's reason."""
    counted, run, said = dry_run(trained, "--config", "measure=throughput")
    assert counted == run == 2
    assert "ddpscale: cost: 1x2 r0 (train_single_node): finished, rerun by Snakemake (params changed): " in said
    assert "2 finished runs rerun: 1x1/r0, 1x2/r0 (params changed)" in said


def test_a_forced_rule_and_an_edited_train_script_are_counted(trained):
    counted, run, said = dry_run(trained, "--forcerun", "train_single_node")
    assert counted == run == 1
    assert "1 finished run rerun: 1x2/r0 (forced on the command line)" in said

    script = trained.path / "scripts/train.py"
    original = script.read_text()
    try:
        script.write_text(original + "\n# edited\n")
        counted, run, said = dry_run(trained)
    finally:
        script.write_text(original)
    assert counted == run == 2
    assert "(input updated: scripts/train.py)" in said
