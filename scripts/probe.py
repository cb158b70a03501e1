"""Probe one topology without training: all-reduce bandwidth and where a step's time goes.

The workflow runs this probe inside the first repeat's training job (train.py --probe); this
script runs it alone, for a quick look at a topology or a new cluster, on the same path: the
user's modules under the Trainer train.py builds, on the group Lightning forms, and a fit
that stops right after the probe, before its first epoch. Every rank runs it, started by a
launcher with train.py's run flags; rank 0 writes the JSON (atomically). A probe that cannot
measure exits 3 with its reason.
"""

import argparse
import sys
import tempfile

import pytorch_lightning as pl
import torch

from ddpscale.io import write_json_atomic
from ddpscale.measurement import probe as measurement_probe
from ddpscale.measurement.timing import ScalingMetrics, WorldSizeError
from ddpscale.training import cudacheck, plugins
from ddpscale.training.callbacks import ProbeBeforeTraining
from ddpscale.training.runargs import add_run_args, build_modules, build_trainer, set_threads, topology
from ddpscale.training.teardown import close_process_group

SIZES = measurement_probe.DEFAULTS


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_run_args(p)
    p.add_argument("--out", required=True, help="probe.json to write")
    p.add_argument("--steps", type=int, default=SIZES["steps"],
                   help="micro-batches per timed block (whole optimizer steps: rounded up to accumulate_grad_batches)")
    p.add_argument("--rounds", type=int, default=SIZES["rounds"], help="rounds of (no_sync block, synced block)")
    p.add_argument("--warmup", type=int, default=SIZES["warmup"], help="untimed steps / all-reduce calls first")
    p.add_argument("--iters", type=int, default=SIZES["iters"], help="timed all-reduce calls per message size")
    return p.parse_args(argv)


class ProbeFailed(Exception):
    """The probe could not measure (every rank agreed); rank 0 says why."""


def probe(args) -> dict | None:
    """Rank 0's record (None on the other ranks)."""
    set_threads(args, torch)
    pl.seed_everything(args.seed, workers=True, verbose=False)
    model, datamodule = build_modules(args)
    probed = ProbeBeforeTraining(args, {name: getattr(args, name) for name in SIZES}, alone=True)
    # the world-size check of train.py first: a group short of ranks stops before the probe
    check = ScalingMetrics(expected_world_size=topology(args).world_size)
    # a module that logs through self.logger needs a logger; what the probe's one epoch logs is
    # of no use, and probe.json is all this script leaves
    with tempfile.TemporaryDirectory(prefix="ddpscale-probe-logs-") as logs:
        trainer = build_trainer(args, [check, probed], logs, max_epochs=1)
        trainer.fit(model, datamodule=datamodule)
    if trainer.global_rank != 0:
        return None
    if probed.failure is not None:
        failure = probed.failure
        raise ProbeFailed(f"{failure.message} ({failure.kind}, in {failure.doing})")
    return probed.record


def main(argv=None) -> int:
    args = parse_args(argv)
    cudacheck.require_gpu(args.accelerator)  # as train.py: before any group or data exists
    record = probe(args)
    if record is not None:
        write_json_atomic(args.out, record)
        print(measurement_probe.summary(record), flush=True)
    return 0


if __name__ == "__main__":
    try:
        code = main()
        close_process_group()
        sys.exit(code)
    except (ProbeFailed, plugins.PluginError, cudacheck.CudaUnavailable, WorldSizeError, FileNotFoundError,
            ValueError) as err:
        print(f"ddpscale probe: {err}", file=sys.stderr)
        sys.exit(3)
