"""`snakemake --lint` finds nothing but the one lint we keep on purpose: no conda environment or
container per rule (the pinned stack is one venv shared by the login and compute nodes; the
Snakefile's header says why)."""

import re
import subprocess
from pathlib import Path

from helpers.workflow import ROOT, SNAKEMAKE

KEPT = "Specify a conda environment or container for each rule."


def test_lint_finds_only_the_kept_lint():
    proc = subprocess.run([*SNAKEMAKE, "--lint"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    output = proc.stdout + proc.stderr
    titles = re.findall(r"^    \* (.+?):?$", output, flags=re.M)
    assert titles, f"no lint was reported at all; did the output format change?\n{output[-2000:]}"
    assert set(titles) == {KEPT}, output[-4000:]
    # one per rule that runs a job: the stage rules are linted under their own names
    linted = set(re.findall(r"^Lints for rule (\w+)", output, flags=re.M))
    assert linted == {"prepare_data", "train_baseline", "train_single_node", "train_multi_node",
                      "report_scaling", "partial_report"}


SNAKEFMT = str(Path(SNAKEMAKE[0]).parent / "snakefmt")


def test_workflow_files_are_formatted_as_snakefmt_formats_them():
    """Every .smk and the Snakefile as snakefmt writes them, at this project's width (pyproject.toml):
    `snakefmt workflow/` rewrites whatever this test finds."""
    proc = subprocess.run([SNAKEFMT, "--check", "workflow/"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"run `.venv/bin/snakefmt workflow/`:\n{(proc.stdout + proc.stderr)[-3000:]}"


def test_snakefmt_check_fails_on_a_file_it_would_change(tmp_path):
    """The check above can fail: a rule written with its directives out of snakefmt's order."""
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    rule = tmp_path / "bad.smk"
    rule.write_text('rule a:\n    shell:\n        "true"\n    log:\n        "a.log"\n')
    proc = subprocess.run([SNAKEFMT, "--check", str(rule)], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0, proc.stdout + proc.stderr
