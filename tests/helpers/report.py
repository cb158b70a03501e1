"""scripts/report.py run on made-up records: the files it writes, the records laid out as the
workflow lays them out, two runs with the probes their topologies recorded, and its one-line
refusal."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from helpers.records import make_run, probe


SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "report.py"
PNGS = ["speedup.png", "efficiency.png", "throughput.png", "breakdown.png", "busbw.png"]
SVGS = ["overview.svg", *(name.replace(".png", ".svg") for name in PNGS)]
PDFS = [name.replace(".svg", ".pdf") for name in SVGS]
OUTPUTS = ["scaling.tsv", "breakdown.tsv", "prediction.tsv", "projection.tsv", "timetoacc.tsv", *PNGS, *SVGS,
           *PDFS, "report.html"]


def run_report(metrics, out_dir, *extra):
    cmd = [sys.executable, str(SCRIPT), "--metrics", *map(str, metrics),
           "--out-dir", str(out_dir), *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def write_fixtures(tmp_path, runs):
    paths = []
    for run in runs:
        path = tmp_path / "runs" / f"{run['topology']}_r{run['repeat']}" / "metrics.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(run))
        paths.append(path)
    return paths


def _assert_one_line_error(proc, *fragments):
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("ddpscale report: ")
    for fragment in fragments:
        assert fragment in lines[0]


def probed_runs():
    """Two runs and the probe each topology's first repeat recorded."""
    runs = [make_run("1x1", batch_per_device=64, throughput_samples_s=6400.0),
            make_run("1x2", batch_per_device=32, throughput_samples_s=64 / 0.0105)]
    probes = {"1x1": probe("1x1", 1, 0.001, 0.006, 0.0, 0.0), "1x2": probe("1x2", 2, 0.0005, 0.006, 0.001, 0.001)}
    for record in probes.values():
        record["allreduce"] = [{**r, "algbw_gbps": r["bytes"] / r["time_s"] / 1e9 if r["time_s"] else None,
                                "busbw_gbps": r["bytes"] / r["time_s"] / 1e9 if r["time_s"] else None}
                               for r in record["allreduce"]]
    return runs, probes
