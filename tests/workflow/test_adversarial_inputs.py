"""Hostile inputs (tests/fixtures/adversarial/) are refused by a real dry run, in one line that names
the file, the entry and the fix, before Snakemake builds a job: nothing they carry runs."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from conftest import ROOT, SNAKEMAKE

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
