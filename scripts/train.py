"""Train one topology with Lightning DDP and write its metrics.json (rank 0, atomically, last).

Every rank runs this script; the launcher (scripts/launch_local.py or srun) starts them. The
settings come as flags, or in an args file the workflow wrote (ddpscale.plan.runspec); the
topology is checked against the process group that formed.
"""

import os
import signal
import sys
import time

import pytorch_lightning as pl
import torch
from pytorch_lightning.utilities.exceptions import SIGTERMException
from pytorch_lightning.utilities.model_helpers import is_overridden

from ddpscale.core import record as run_record
from ddpscale.job import callbacks, runinfo
from ddpscale.job.build import build_modules, build_trainer, keep_fit_events, set_threads
from ddpscale.job.device import compiling, gpu, transport
from ddpscale.job.launch.ranks import close_process_group
from ddpscale.job.measure import accuracy, timing, windows
from ddpscale.job.measure.samplecount import BatchSizeError
from ddpscale.job.measure.timing import NonFiniteLossError, WorldSizeError
from ddpscale.job.resume import checkpoint
from ddpscale.job.resume.signals import StopRequested, exit_code, stop_message
from ddpscale.plan import ddpsettings, plugins, runspec


def is_first_rank() -> bool:
    """Rank 0 as the launcher set it (srun or launch_local), before any process group exists."""
    return int(os.environ.get("SLURM_PROCID", os.environ.get("RANK", "0"))) == 0


def main(argv=None) -> int:
    spec = runspec.parse(argv)
    if is_first_rank():  # the workflow passes most of them in a file: the log shows what ran
        print(f"ddpscale: settings: {spec.command()}", flush=True)
    # first: a GPU run torch cannot give a GPU stops here, before any group or data exists
    gpu.require_gpu(spec.accelerator)
    topo = spec.topo
    transport.prepare(spec.metrics, topo.world_size, spec.accelerator)  # NCCL's transport log, before any group
    set_threads(spec, torch)
    pl.seed_everything(spec.run_seed, workers=True, verbose=False)
    started = runinfo.now()
    per_device = spec.batch_per_device
    effective = per_device * topo.world_size * spec.accumulate_grad_batches
    model, datamodule = build_modules(spec)

    measured = callbacks.build(spec)
    # held devices count from the SLURM job's start where there is one (ddpscale.job.measure.timing)
    measured.timing.held_since, measured.timing.held_from = timing.started(
        os.environ, measured.timing.held_since, spec.held_from_job)
    # a test pass needs both halves: a module may define test_step while its data has no test split
    test_pass = is_overridden("test_step", model) and is_overridden("test_dataloader", datamodule)
    # throughput mode compares no accuracy: a test pass would spend device time on nothing
    test_pass = test_pass and spec.measure == "full"
    # nor does it ask whether the accuracy metric is logged: a warning that it is not would send
    # the user to fix a name this run's report never reads
    accuracy_metric = spec.accuracy_metric if spec.measure == "full" else None
    ours = [*measured.all(), accuracy.MetricCheck(accuracy_metric, test_pass)]
    trainer = build_trainer(spec, ours, runinfo.logger_dir(spec.metrics))
    # the checkpoint and the finished record belong to this data, code and versions only
    identity = runinfo.run_identity(spec, trainer.strategy.root_device)
    settings = {**spec.measured(), "identity": identity}
    done = checkpoint.finished_record(spec.ckpt_dir, settings, spec.attempt, is_first_rank())
    if done is not None:
        if is_first_rank():
            print("ddpscale: this run finished in an earlier attempt; writing its metrics again", flush=True)
            run_record.write(spec.metrics, done)
        return 0
    ckpt = checkpoint.resume_path(spec.ckpt_dir, settings, trainer.global_rank == 0)

    if trainer.global_rank == 0:
        print(f"ddpscale: topology {topo} = {topo.num_nodes} node(s) x {topo.devices_per_node} "
              f"device(s); batch per device {per_device}, effective "
              f"{effective} ({spec.scaling} scaling)"
              + (f"; resuming from {ckpt}" if ckpt else ""), flush=True)
    fit_start = time.perf_counter()
    # a checkpoint is data: Lightning would otherwise pass None, torch's default, which
    # TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD turns into running whatever the pickle names
    try:
        trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt, weights_only=True)
    except RuntimeError as err:  # torch's DDP text for a setting the module cannot train with
        line = ddpsettings.step_error_line(err, ddpsettings.complete(spec.ddp), spec.accumulate_grad_batches)
        if line is None:
            raise
        raise ddpsettings.SettingError(line) from err
    fit_wall_s = time.perf_counter() - fit_start
    early_stop = runinfo.early_stop(trainer, spec.measure, spec.max_epochs, len(measured.timing.epoch_times))
    added = runinfo.module_callbacks(trainer, ours)
    logged = runinfo.scalars(trainer)  # trainer.test resets callback_metrics
    if spec.measure == "throughput":  # a warm validation and save for the projection
        windows.warm_overheads(trainer, model, datamodule, measured.windows, len(measured.checkpoint.save_seconds),
                               os.path.join(spec.ckpt_dir, "warm-save.ckpt"))
    if test_pass:
        keep_fit_events(trainer)
        # the test pass is not measured, and runs eagerly: compiled, its evaluation frames ran
        # under inference mode where fit's validation ran under no_grad, and each one recompiled
        # (counted as the run's recompilations)
        model = compiling.unwrap(model)
        trainer.test(model, datamodule=datamodule, verbose=False)
        logged.update(runinfo.scalars(trainer))
    backend = torch.distributed.get_backend() if runinfo.formed_world_size() > 1 else None
    transports = transport.gather(backend, spec.metrics)  # every rank takes part
    if trainer.global_rank == 0:
        missing = accuracy.end_line(accuracy_metric, logged) if accuracy_metric else None
        if missing:
            print(missing, flush=True)
        record = runinfo.metrics_record(spec, logged, trainer, measured.timing.summary(), measured.timing.ranks,
                                        started, per_device, effective)
        # wall time of this attempt's trainer.fit (set-up included, the probe not); fit_time_s
        # is the sum of finished epochs over all attempts, the figure the report compares
        record["probe_s"] = measured.probe.seconds if measured.probe else 0.0
        # what held time is billed for: whole nodes with site_exclusive, else the ranks
        record["held_devices"] = spec.held_devices or record["world_size"]
        record["fit_wall_s"] = fit_wall_s - record["probe_s"]
        # throughput mode's figure replaces the epochs' (ddpscale.job.measure.windows)
        record.update(windows.run_entries(spec.measure, spec.max_epochs, measured.windows.record(),
                                          uncounted=record["samples_uncounted"]))
        record.update(measured.record(record["world_size"], record["throughput_samples_s"],
                                      record["device_name"], spec.precision))
        record["val_history"] = accuracy.with_elapsed(record["val_history"], record["epoch_times_s"])
        record["compile"] = compiling.said(spec.compile, trainer.lightning_module)
        record["early_stop"] = early_stop  # a module's callback ended the training before max_epochs
        record["module_callbacks"] = added
        record["loggers"] = runinfo.loggers(trainer)
        record["transport"] = transports  # per rank: backend, transport, interface
        record["site_interconnect"] = spec.site_interconnect
        record["identity"] = identity
        if record["compile"] != "none":
            record.update(compiling.stats())
        checkpoint.finish(spec.ckpt_dir, settings, record)
        run_record.write(spec.metrics, record)  # last: its presence marks the run as done
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
    except (plugins.PluginError, gpu.CudaUnavailable, NonFiniteLossError, WorldSizeError, BatchSizeError,
            ddpsettings.SettingError, FileNotFoundError, ValueError) as err:
        say(f"ddpscale train: {err}")
        sys.exit(3)
    except RuntimeError as err:
        line = compiling.overwritten_output_line(err)
        if line is None:
            raise
        say(f"ddpscale train: {line}")
        sys.exit(3)
