"""State that heals, on the local workflow for real: a damaged run record makes its run rerun,
and a report job that fails keeps the previous report (issue 32, item 3)."""

from __future__ import annotations

import re

import pytest

from helpers.status import run_status
from helpers.workflow import job_counts, tiny_config

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


def test_a_report_job_that_fails_keeps_the_previous_report(workspace):
    config = tiny_config(topologies=["1x1"])
    workspace.write_config(config)
    first = workspace.snakemake()
    assert first.returncode == 0, first.stderr[-4000:]
    html = workspace.results / "report/report.html"
    before = html.read_text()
    figures = {name: (workspace.results / "report" / name).read_bytes() for name in ("speedup.pdf", "overview.svg")}

    # not a scaling.tsv at all: refused while the workflow parses, before any job
    garbage = workspace.path / "garbage.tsv"
    garbage.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    config["report"]["compare_with"] = "garbage.tsv"
    workspace.write_config(config)
    refused = workspace.snakemake()
    assert refused.returncode != 0 and "report.compare_with: garbage.tsv is not a ddpscale scaling.tsv" in \
        refused.stderr, refused.stderr[-4000:]
    assert html.read_text() == before

    # the report job itself fails, half way through a report.html (every table the report reads is
    # checked before any job now, so the workspace's report.py stands in for a crash or a kill)
    config["report"]["compare_with"] = None
    workspace.write_config(config)
    script = workspace.path / "scripts/report.py"
    original = script.read_text()
    script.write_text("import sys\nfrom pathlib import Path\n"
                      "Path(sys.argv[sys.argv.index('--out-dir') + 1], 'report.html').write_text('half')\n"
                      "sys.exit('the report crashed')\n")
    failed = workspace.snakemake()
    assert failed.returncode != 0 and "report_scaling" in failed.stderr, failed.stderr[-4000:]
    assert html.read_text() == before, "the previous report was lost with the failed job"
    assert "the report job did not finish: kept the previous" in failed.stderr
    assert (workspace.results / "report/scaling.tsv").exists()
    for name, content in figures.items():  # the figures for papers too: outputs Snakemake removed, put back
        assert re.search(rf"kept the previous \S*/report/{re.escape(name)}$", failed.stderr, re.M), name
        assert (workspace.results / "report" / name).read_bytes() == content, name

    script.write_text(original)  # fixed: the report is rebuilt
    again = workspace.snakemake()
    assert again.returncode == 0, again.stderr[-4000:]
    assert "report_scaling" in again.stderr and html.exists()
