"""Train one topology with Lightning DDP and write its metrics.json (rank 0, atomically, last).

Every rank runs this script; the launcher (scripts/launch_local.py or srun) starts them. The
topology comes from explicit flags and is checked against the process group that formed.
"""

import argparse
import os
import signal
import sys
import time

import pytorch_lightning as pl
import torch
from pytorch_lightning.utilities.exceptions import SIGTERMException
from pytorch_lightning.utilities.model_helpers import is_overridden

from ddpscale.core.topology import Topology
from ddpscale.plan.configcheck import ACCURACY_METRIC_ENV, EPOCH_METRIC_ENV
from ddpscale.core import record as run_record
from ddpscale.job import held, valhistory, windows
from ddpscale.job.samplecount import BatchSizeError
from ddpscale.job.timing import NonFiniteLossError, WorldSizeError
from ddpscale.job import callbacks, compiling, cudacheck, metriccheck, runinfo, transportinfo
from ddpscale.plan import ddpsettings, plugins
from ddpscale.job.runargs import (NOT_IDENTITY, add_run_args, build_modules, build_trainer, per_device_batch,
                                       run_seed, set_threads)
from ddpscale.job.signals import StopRequested, exit_code, stop_message
from ddpscale.job.teardown import close_process_group


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_run_args(p)
    p.add_argument("--repeat", type=int, default=0)
    p.add_argument("--max-epochs", type=int, required=True)
    p.add_argument("--warmup-epochs", type=int, default=1)
    p.add_argument("--ckpt-dir", required=True, help="resume checkpoints (not a workflow output)")
    p.add_argument("--metrics", required=True, help="metrics.json to write")
    p.add_argument("--attempt", type=int, default=1, help="Snakemake's attempt of this job (retries count up)")
    p.add_argument("--accuracy-metric", default=os.environ.get(ACCURACY_METRIC_ENV),
                   help="the metric the report compares (config accuracy.metric; default: $"
                        f"{ACCURACY_METRIC_ENV}, as the workflow sets it): the log says whether it is logged")
    p.add_argument("--epoch-metric", default=os.environ.get(EPOCH_METRIC_ENV),
                   help="the metric recorded after every epoch's validation, for time to accuracy (config "
                        f"accuracy.epoch_metric; default: ${EPOCH_METRIC_ENV}, as the workflow sets it)")
    p.add_argument("--site-interconnect", default="unknown",
                   help="the network between nodes as the profile states it (site_interconnect), for the report")
    p.add_argument("--held-from-job", action="store_true",
                   help="count the devices' hold from the SLURM job's start (the workflow sets it on a "
                        "cluster site; a 1-device job there runs without SLURM's process group)")
    p.add_argument("--measure", choices=["throughput", "full"], default="full",
                   help="throughput: stop once the steady-state throughput is known to --target-precision "
                        "(or at a cap); full: train --max-epochs (config measure)")
    p.add_argument("--target-precision", type=float, default=0.02,
                   help="half-width of the 95%% interval of the mean window throughput, over the mean, at which "
                        "throughput mode stops (config throughput.precision)")
    p.add_argument("--window-steps", type=int, default=20, help="training batches per timed window")
    p.add_argument("--held-devices", type=int, default=None,
                   help="GPUs the job holds and is billed for, where it holds whole nodes (site_exclusive); "
                        "default: its ranks")
    p.add_argument("--min-windows", type=int, default=30,
                   help="throughput mode: windows timed before the rule first looks (config throughput.min_windows)")
    p.add_argument("--measure-max-steps", type=int, default=None,
                   help="throughput mode: the most training batches measured (config throughput.max_steps)")
    p.add_argument("--measure-max-minutes", type=float, default=None,
                   help="throughput mode: the most minutes measured (config throughput.max_minutes)")
    p.add_argument("--probe", action="store_true",
                   help="probe the topology (step breakdown, all-reduce) before training; in metrics.json 'probe'")
    p.add_argument("--probe-batch-sizes", type=batch_sizes, default=[],
                   help="comma-separated per-device batches at which a one-device probe also times its "
                        "compute (the workflow gives the baseline every topology's), for the prediction")
    return p.parse_args(argv)


def batch_sizes(text: str) -> list[int]:
    try:
        sizes = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if any(s < 1 for s in sizes):
        raise argparse.ArgumentTypeError(f"batch sizes must be >= 1, got {text!r}")
    return sizes


def is_first_rank() -> bool:
    """Rank 0 as the launcher set it (srun or launch_local), before any process group exists."""
    return int(os.environ.get("SLURM_PROCID", os.environ.get("RANK", "0"))) == 0


def run_settings(args) -> dict:
    """The flags that define what a run measures: its checkpoint and finished record are kept
    for these only (paths, threads, the attempt and whether it probes do not change them)."""
    return {k: v for k, v in vars(args).items()
            if k not in ("metrics", "ckpt_dir", "threads", "attempt", "probe", "probe_batch_sizes", "held_from_job",
                         "accuracy_metric", "epoch_metric", "site_interconnect", "held_devices", *NOT_IDENTITY)}


def main(argv=None) -> int:
    args = parse_args(argv)
    # first: a GPU run torch cannot give a GPU stops here, before any group or data exists
    cudacheck.require_gpu(args.accelerator)
    topo = Topology(args.nodes, args.devices)
    transportinfo.prepare(args.metrics, topo.world_size, args.accelerator)  # NCCL's transport log, before any group
    settings = run_settings(args)
    set_threads(args, torch)
    pl.seed_everything(run_seed(args), workers=True, verbose=False)
    started = runinfo.now()
    per_device = per_device_batch(args)
    effective = per_device * topo.world_size * args.accumulate_grad_batches
    model, datamodule = build_modules(args)

    measured = callbacks.build(args, topo, per_device)
    # held devices count from the SLURM job's start where there is one (ddpscale.job.held)
    measured.timing.held_since, measured.timing.held_from = held.started(
        os.environ, measured.timing.held_since, args.held_from_job)
    # a test pass needs both halves: a module may define test_step while its data has no test split
    test_pass = is_overridden("test_step", model) and is_overridden("test_dataloader", datamodule)
    # throughput mode compares no accuracy: a test pass would spend device time on nothing
    test_pass = test_pass and args.measure == "full"
    # nor does it ask whether the accuracy metric is logged: a warning that it is not would send
    # the user to fix a name this run's report never reads
    accuracy_metric = args.accuracy_metric if args.measure == "full" else None
    ours = [*measured.all(), metriccheck.MetricCheck(accuracy_metric, test_pass)]
    trainer = build_trainer(args, ours, runinfo.logger_dir(args.metrics))
    # the checkpoint and the finished record belong to this data, code and versions only
    identity = runinfo.run_identity(args, settings, trainer.strategy.root_device)
    settings = {**settings, "identity": identity}
    done = runinfo.finished_record(args.ckpt_dir, settings, args.attempt, is_first_rank())
    if done is not None:
        if is_first_rank():
            print("ddpscale: this run finished in an earlier attempt; writing its metrics again", flush=True)
            run_record.write(args.metrics, done)
        return 0
    ckpt = runinfo.resume_path(args.ckpt_dir, settings, trainer.global_rank == 0)

    if trainer.global_rank == 0:
        print(f"ddpscale: topology {topo} = {topo.num_nodes} node(s) x {topo.devices_per_node} "
              f"device(s); batch per device {per_device}, effective "
              f"{effective} ({args.scaling} scaling)"
              + (f"; resuming from {ckpt}" if ckpt else ""), flush=True)
    fit_start = time.perf_counter()
    trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt)
    fit_wall_s = time.perf_counter() - fit_start
    early_stop = runinfo.early_stop(trainer, args.measure, args.max_epochs, len(measured.timing.epoch_times))
    added = runinfo.module_callbacks(trainer, ours)
    logged = runinfo.scalars(trainer)  # trainer.test resets callback_metrics
    if args.measure == "throughput":  # a warm validation and save for the projection
        windows.warm_overheads(trainer, model, datamodule, measured.windows, len(measured.checkpoint.save_seconds),
                               os.path.join(args.ckpt_dir, "warm-save.ckpt"))
    if test_pass:
        trainer.test(model, datamodule=datamodule, verbose=False)
        logged.update(runinfo.scalars(trainer))
    backend = torch.distributed.get_backend() if runinfo.formed_world_size() > 1 else None
    transport = transportinfo.gather(backend, args.metrics)  # every rank takes part
    if trainer.global_rank == 0:
        missing = metriccheck.end_line(accuracy_metric, logged) if accuracy_metric else None
        if missing:
            print(missing, flush=True)
        record = runinfo.metrics_record(args, logged, trainer, measured.timing.summary(), measured.timing.ranks,
                                        started, per_device, effective)
        # wall time of this attempt's trainer.fit (set-up included, the probe not); fit_time_s
        # is the sum of finished epochs over all attempts, the figure the report compares
        record["probe_s"] = measured.probe.seconds if measured.probe else 0.0
        # what held time is billed for: whole nodes with site_exclusive, else the ranks
        record["held_devices"] = args.held_devices or record["world_size"]
        record["fit_wall_s"] = fit_wall_s - record["probe_s"]
        # throughput mode's figure replaces the epochs' (ddpscale.job.windows)
        record.update(windows.run_entries(args.measure, args.max_epochs, measured.windows.record(),
                                          uncounted=record["samples_uncounted"]))
        record.update(measured.record(record["world_size"], record["throughput_samples_s"],
                                      record["device_name"], args.precision))
        record["val_history"] = valhistory.with_elapsed(record["val_history"], record["epoch_times_s"])
        record["compile"] = compiling.said(args.compile, trainer.lightning_module)
        record["early_stop"] = early_stop  # a module's callback ended the training before max_epochs
        record["module_callbacks"] = added
        record["loggers"] = runinfo.loggers(trainer)
        record["transport"] = transport  # per rank: backend, transport, interface
        record["site_interconnect"] = args.site_interconnect
        record["identity"] = identity
        if record["compile"] != "none":
            record.update(compiling.stats())
        runinfo.finish(args.ckpt_dir, settings, record)
        run_record.write(args.metrics, record)  # last: its presence marks the run as done
    return 0


def say(line: str) -> None:
    """One line to stderr in one write: print writes the text and its newline apart, and the
    ranks of a failing run write at once, so two ranks' lines ran together on one line."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


if __name__ == "__main__":
    try:
        code = main()
        close_process_group()
        sys.exit(code)
    except StopRequested as stopped:
        say(f"ddpscale train: {stopped}")
        sys.exit(exit_code(stopped.signum))
    except SIGTERMException:  # Lightning's own handler, outside training (e.g. in trainer.test)
        say(f"ddpscale train: {stop_message(signal.SIGTERM, None)}")
        sys.exit(exit_code(signal.SIGTERM))
    except (plugins.PluginError, cudacheck.CudaUnavailable, NonFiniteLossError, WorldSizeError, BatchSizeError,
            FileNotFoundError, ValueError) as err:
        say(f"ddpscale train: {err}")
        sys.exit(3)
    except RuntimeError as err:
        line = compiling.overwritten_output_line(err) or ddpsettings.unused_parameters_line(err)
        if line is None:
            raise
        say(f"ddpscale train: {line}")
        sys.exit(3)
