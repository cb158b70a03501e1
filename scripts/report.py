#!/usr/bin/env python3
"""ddpscale report: metrics.json files (and their probes) -> tables (TSV), 5 PNGs, 6 SVGs and 6 PDFs, report.html."""
from __future__ import annotations

import argparse
import errno
import json
import signal
import sys
import warnings
from pathlib import Path

# Runnable as `python scripts/report.py` from anywhere, not only via pytest.
sys.path.insert(0, str(Path(__file__).resolve().parent))

from ddpscale.run import argsfile  # noqa: E402
from ddpscale.core.io import staged, terminal_safe, text_safe  # noqa: E402
from ddpscale.report import reportdata  # noqa: E402
from ddpscale.report.figures import breakdown, projection, scaling, timetoacc  # noqa: E402
from ddpscale.report.load import description, earlier, records, tsv  # noqa: E402
from ddpscale.report.render import html as report_html  # noqa: E402
from ddpscale.report.render import plots  # noqa: E402
from ddpscale.report.verdict import firstscreen  # noqa: E402


def finite(text: str) -> float:
    """A float that is a number (NaN and infinity are no target)."""
    value = float(text)
    if value != value or value in (float("inf"), float("-inf")):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def job_limits(text: str) -> dict:
    try:
        return projection.parse_limits(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--metrics", nargs="+", required=True, metavar="PATH",
                   help="metrics.json files, one per training run")
    p.add_argument("--baseline", default="1x1", help="baseline topology (default 1x1)")
    p.add_argument("--accuracy-metric", default="test_acc",
                   help="any metric the module logs, compared against the baseline (default test_acc)")
    p.add_argument("--accuracy-mode", default="auto", choices=["auto", "max", "min"],
                   help="max: higher is better (an accuracy); min: lower is better (a loss); "
                        "auto: min when the name says loss, error, perplexity, ... (default auto)")
    p.add_argument("--accuracy-tolerance", type=float, default=0.02,
                   help="largest allowed change the wrong way vs the baseline (default 0.02)")
    p.add_argument("--accuracy-target", type=finite, default=None,
                   help="a fixed quality target for time to accuracy (config accuracy.target); default: the "
                        "baseline's final value minus the tolerance")
    p.add_argument("--efficiency-threshold", type=float, default=0.8,
                   help="the recommendation's lowest acceptable efficiency (default 0.8)")
    p.add_argument("--expected", nargs="*", default=[], metavar="TOPOLOGY",
                   help="every configured topology: those without metrics appear as rows marked so")
    p.add_argument("--repeats", type=int, default=1, help="configured repeats per topology")
    p.add_argument("--log-dir", type=Path, default=None,
                   help="train logs (<dir>/<topology>/r<k>.log): a log without metrics is a failure")
    p.add_argument("--compare", type=Path, default=None, help="an earlier scaling.tsv to compare with")
    p.add_argument("--experiment", default=None, help="the experiment's name (config experiment), for the report's head")
    p.add_argument("--config-files", default=None, help="the config files of the runs, e.g. 'config/config.yaml + my.yaml'")
    p.add_argument("--dataset", type=json.loads, default=None, help="JSON: config dataset (generator and its settings)")
    p.add_argument("--data-args", type=json.loads, default=None, help="JSON: config data.init_args")
    p.add_argument("--job-limits", type=job_limits, default={},
                   help='JSON {topology: {"limit_s": s, "signal_s": s}}: the job time limit a full training of it '
                        "runs under and the warning before it (the workflow sets it from a cluster profile), for "
                        "the projection of a training longer than one job")
    p.add_argument("--out-dir", default="results/report", type=Path)
    p.add_argument(argsfile.FILE_FLAG, metavar="PATH",
                   help="a JSON file of further flags, as the workflow writes it (their length is not bounded "
                        "by the command line's); read in its place")
    p.add_argument(argsfile.DIGEST_FLAG, metavar="SHA256", help="the digest the args file must have")
    try:
        argv = argsfile.expand(sys.argv[1:] if argv is None else argv)
    except ValueError as err:
        p.error(str(err))
    return p.parse_args(argv)


def say(line: str, stream=None) -> None:
    """One line to a terminal (or a log read on one): names and log lines from the runs may hold
    control characters, shown escaped."""
    print(terminal_safe(line), file=stream or sys.stdout)


def log_tails(log_dir: Path | None, topologies: list[str]) -> dict:
    tails = {}
    for name in topologies:
        logs = sorted((log_dir / name).glob("r*.log")) if log_dir else []
        tails[name] = scaling.last_line(logs[-1]) if logs else None
    return tails


def show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """A library's warning, as the log gets it: one about a name from the runs ("Glyph 27 (\\x1b)
    missing from font") quotes the name, control characters and all."""
    text = warnings.formatwarning(message, category, filename, lineno, line)
    (file or sys.stderr).write(text_safe(text))


def stop(signum, frame) -> None:
    """SIGTERM (Snakemake ending the job, scancel) ends the report as Ctrl-C does: by an exception,
    so the unfinished new report is removed and the previous one stays in place."""
    raise SystemExit(128 + signum)


def write_report(data, out: Path) -> None:
    """Every file of the report, written aside and moved into out together (io.staged): killed or
    failing at any point, out holds the whole previous report or the whole new one."""
    tables = {"scaling.tsv": description.with_columns(scaling.rounded(data.summary, data.comparison.metric),
                                                     data.description),
              "breakdown.tsv": data.steps,
              "prediction.tsv": data.prediction,
              "projection.tsv": projection.rounded(data.projection),
              "timetoacc.tsv": timetoacc.rounded(data.timetoacc)}
    with staged(out) as stage:
        for name, table in tables.items():
            tsv.write(stage / name, table)
        images = {}
        for name, plot in plots.figures().items():
            plot(data, stage / name)
            images[name] = (stage / name).read_bytes()
        for name, content in plots.for_papers(data).items():  # the same figures as SVG and PDF, for papers
            (stage / name).write_bytes(content)
        (stage / "report.html").write_text(report_html.build_report(data, images), encoding="utf-8")


# what to do when the report folder takes no files, by the cause
WRITE_FIXES = {errno.ENOSPC: "free space on its file system (df -h shows it)",
               errno.EDQUOT: "free space within your quota there",
               errno.EROFS: "it is on a read-only file system: point the workflow's results elsewhere",
               errno.EACCES: "make it writable for you (ls -ld shows its owner and mode)",
               errno.EPERM: "make it writable for you (ls -ld shows its owner and mode)"}


def main(argv=None) -> int:
    args = parse_args(argv)
    warnings.showwarning = show_warning
    signal.signal(signal.SIGTERM, stop)
    try:
        runs = records.load_runs(args.metrics)
        data = reportdata.build(
            runs, breakdown.probes_in_runs(runs),
            baseline=args.baseline,
            metric=args.accuracy_metric, mode=args.accuracy_mode, tolerance=args.accuracy_tolerance,
            target=args.accuracy_target,
            threshold=args.efficiency_threshold, expected=args.expected, repeats=args.repeats,
            log_tails=log_tails(args.log_dir, args.expected),
            earlier=earlier.read_earlier(args.compare) if args.compare else None,
            compared_with=str(args.compare) if args.compare else None, job_limits=args.job_limits,
            description=description.describe(runs, args.experiment, args.config_files, args.dataset, args.data_args))
    except ValueError as exc:
        # A user-facing problem with the inputs: one line, no traceback.
        say(f"ddpscale report: {exc}", sys.stderr)
        return 2
    out = args.out_dir
    try:
        write_report(data, out)
    except OSError as exc:
        fix = WRITE_FIXES.get(exc.errno, "check that it can take new files")
        say(f"ddpscale report: cannot write the report into {out} ({exc.strerror or exc}): {fix}; "
            "the report there was left as it was", sys.stderr)
        return 2
    say(f"ddpscale report: wrote {out}/report.html ({len(data.summary)} topologies)")
    say(f"ddpscale report: answer: {firstscreen.answer(data)}")
    say(f"ddpscale report: {data.recommendation}")
    say(f"ddpscale report: {projection.cost_sentence(data.spent, scaling.hours_label(data.summary))}")
    for note in data.notes:
        say(f"ddpscale report: note: {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
