#!/usr/bin/env python3
"""ddpscale status: per topology and repeat, whether the run is not started, queued (SLURM job
and reason), running (epoch, elapsed, time left, throughput), done (throughput, efficiency) or
failed (its log's last line), and a Snakemake lock a killed run left behind.

Reads the experiment's results/<experiment>/ (runs and train logs), squeue (where there is one) and /proc; never imports torch.
Run it in the directory snakemake runs in.
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
from ddpscale.core.layout import layout  # noqa: E402
from ddpscale.status import sources as status_sources  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", type=Path, default=Path("config/config.yaml"),
                   help="the workflow's config (default config/config.yaml)")
    p.add_argument("--configfile", type=Path, action="append", default=[], metavar="PATH",
                   help="an overlay, as snakemake's --configfile; repeatable, later ones win")
    p.add_argument("--results", type=Path, default=None,
                   help="the experiment's results folder (default results/<experiment> of the config)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        config = status_sources.read_config(args.config, args.configfile)
        results = args.results or Path(layout(config).root)
        text = status_sources.report(config, results, Path.cwd())
    except (OSError, yaml.YAMLError, TopologyError, TypeError, ValueError) as exc:
        # a missing or unreadable config: one line, no traceback
        print(terminal_safe(f"ddpscale status: {exc}".splitlines()[0]), file=sys.stderr)
        return 2
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
