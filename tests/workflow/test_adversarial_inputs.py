"""Hostile inputs (tests/fixtures/adversarial/) are refused by a real dry run, in one line that names
the file, the entry and the fix, before Snakemake builds a job: nothing they carry runs."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from helpers.workflow import ROOT, SNAKEMAKE

ADVERSARIAL = ROOT / "tests/fixtures/adversarial"


def dry_run(*args, env=None, cwd=ROOT):
    cmd = [*SNAKEMAKE, "-n", "--forceall", *args]
    proc = subprocess.run(cmd, check=False, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=120, env={**os.environ, "CUDA_VISIBLE_DEVICES": "", **(env or {})})
    return proc.returncode, proc.stdout


@pytest.mark.parametrize("fixture", ["profile_python_in_resource", "profile_shell_in_resource"])
def test_a_profile_resource_that_is_not_a_literal_is_refused_and_never_runs(tmp_path, fixture):
    """Before: the Python one touched the marker during the dry run itself (Snakemake evaluates
    resources as it builds the jobs), and the shell one passed the dry run with
    mem_mb_per_cpu=1000 --comment=$(touch ...), which the SLURM plugin puts into sbatch's shell
    line unquoted."""
    marker = tmp_path / "marker"
    folder = f"tests/fixtures/adversarial/{fixture}"
    rc, output = dry_run("--profile", folder, "--config", f"topologies={json.dumps(['1x1', '2x4'])}", "repeats=1",
                         env={"DDPSCALE_TEST_MARKER": str(marker)})
    assert rc != 0, output
    refusals = [line for line in output.splitlines() if line.startswith(f"{folder}/config.yaml: ")]
    assert len(refusals) == 1, output
    assert refusals[0].startswith(f"{folder}/config.yaml: set-resources train_multi_node mem_mb_per_cpu must be "
                                  "a whole number from 0 to 2147483647, in MB")
    assert "rule train_" not in output
    assert not marker.exists()


@pytest.mark.parametrize("fixture, said", [
    ("input_compare_duplicate_topology", "line 4: topology '1x1' is listed twice (one row per topology)"),
    ("input_compare_text_in_number", "line 3: throughput_samples_s is 'fast', which is not a number")])
def test_an_earlier_table_the_comparison_cannot_read_is_refused_by_the_dry_run(fixture, said):
    """Before: only its header was read, so the report job failed on it after the runs, when
    Snakemake had already deleted the previous report."""
    overlay = f"tests/fixtures/adversarial/{fixture}.yaml"
    rc, output = dry_run("--configfile", overlay)
    assert rc != 0, output
    refusals = [line for line in output.splitlines() if line.startswith(f"{overlay}: report.compare_with: ")]
    assert len(refusals) == 1, output
    assert f"tests/fixtures/adversarial/{fixture}.tsv {said}; point it at a scaling.tsv" in refusals[0]
    assert "rule train_" not in output


@pytest.mark.parametrize("args, said", [
    # before: "write 0.8 without quotes", which the user never wrote
    (["--config", "report={efficiency_threshold: 0.8}"],
     "--config: report.efficiency_threshold arrives as the text '0.8': Snakemake reads a mapping or list"),
    # before: planned, into results/runs/, the folder of the layout before experiments
    (["--config", "experiment=runs"], "--config: experiment is 'runs', but results/runs/ is a folder of results/"),
    # before: planned, with /proc/self/status as an input of every run
    (["--configfile", "tests/fixtures/adversarial/input_data_from_proc.yaml"],
     "tests/fixtures/adversarial/input_data_from_proc.yaml: data.files lists '/proc/self/status', a file"),
])
def test_config_inputs_that_cannot_work_are_refused_by_the_dry_run(args, said):
    rc, output = dry_run(*args)
    assert rc != 0, output
    assert len([line for line in output.splitlines() if line.startswith(said)]) == 1, output
    assert "rule train_" not in output
