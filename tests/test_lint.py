"""`snakemake --lint` finds nothing but the one lint we keep on purpose: no conda environment or
container per rule (the pinned stack is one venv shared by the login and compute nodes; the
Snakefile's header says why)."""

import re
import subprocess

from conftest import ROOT, SNAKEMAKE

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
