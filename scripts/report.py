#!/usr/bin/env python3
"""ddpscale report: metrics.json files -> scaling.tsv, 3 PNGs, report.html."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

# Runnable as `python scripts/report.py` from anywhere, not only via pytest.
sys.path.insert(0, str(Path(__file__).resolve().parent))

from ddpscale import analysis, plots  # noqa: E402
from ddpscale import html as report_html  # noqa: E402
from ddpscale.io import atomic_write  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--metrics", nargs="+", required=True, metavar="PATH",
                   help="metrics.json files, one per training run")
    p.add_argument("--baseline", default="1x1", help="baseline topology (default 1x1)")
    p.add_argument("--accuracy-metric", default="test_acc",
                   help="metric compared against the baseline (default test_acc)")
    p.add_argument("--accuracy-tolerance", type=float, default=0.02,
                   help="largest allowed drop vs the baseline (default 0.02)")
    p.add_argument("--out-dir", default="results/report", type=Path)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        runs = analysis.load_runs(args.metrics)
        summary = analysis.summarize(runs, args.baseline, args.accuracy_metric,
                                     args.accuracy_tolerance)
    except ValueError as exc:
        # A user-facing problem with the inputs: one line, no traceback.
        print(f"ddpscale report: {exc}", file=sys.stderr)
        return 2
    out = args.out_dir
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / "scaling.tsv", lambda tmp: analysis.rounded(summary).to_csv(
        tmp, sep="\t", index=False, na_rep=""))
    images = {}
    for name, plot in plots.FIGURES.items():
        atomic_write(out / name, lambda tmp, plot=plot: plot(summary, tmp))
        images[name] = (out / name).read_bytes()
    page = report_html.build_report(summary, runs, images)
    atomic_write(out / "report.html", lambda tmp: tmp.write_text(page, encoding="utf-8"))
    print(f"ddpscale report: wrote {out}/report.html ({len(summary)} topologies)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
