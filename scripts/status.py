#!/usr/bin/env python3
"""ddpscale status: per topology and repeat, whether the run is not started, queued (SLURM job
and reason), running (epoch, elapsed, time left, throughput), done (throughput, efficiency) or
failed (its log's last line), and a Snakemake lock a killed run left behind.

Shows the runs the workflow planned for the experiment (results/<experiment>/plan.json, written
when its jobs start, so it follows every --configfile and --config the run was started with), and
names it; before any run, the config's runs, marked "not planned yet". Give it the --configfile
and --config the run was started with, as snakemake takes them (at least those that name the
experiment). Reads the experiment's runs and train logs, squeue (where there is one) and /proc;
never imports torch. Run it in the directory snakemake runs in.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

# Runnable as `python scripts/status.py` from anywhere, not only via pytest.
sys.path.insert(0, str(Path(__file__).resolve().parent))

import yaml  # noqa: E402

from ddpscale.core.io import terminal_safe  # noqa: E402
from ddpscale.run.topology import TopologyError  # noqa: E402
from ddpscale.core.layout import experiment_name, layout  # noqa: E402
from ddpscale.status import sources as status_sources  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--configfile", "--configfiles", type=Path, nargs="+", action="extend", default=[],
                   metavar="FILE", help="the overlays the run was started with, as snakemake's --configfile: "
                   "on config/config.yaml, later ones win")
    p.add_argument("--config", "-C", nargs="*", action="extend", default=[], metavar="KEY=VALUE",
                   help="the overrides the run was started with, as snakemake's --config (at least those "
                   "that name the experiment, e.g. experiment=NAME)")
    p.add_argument("--results", type=Path, default=None,
                   help="the experiment's results folder (default results/<experiment> of the config)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        config = status_sources.read_config(args.configfile, status_sources.parse_overrides(args.config))
        results = args.results or Path(layout(config).root)
        # the plan must be this experiment's, unless the folder was named
        experiment = None if args.results else experiment_name(config)
        text = status_sources.report(config, results, Path.cwd(), experiment)
    except (OSError, yaml.YAMLError, TopologyError, TypeError, ValueError) as exc:
        # a missing or unreadable config: one line, no traceback
        print(terminal_safe(f"ddpscale status: {exc}".splitlines()[0]), file=sys.stderr)
        return 2
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
