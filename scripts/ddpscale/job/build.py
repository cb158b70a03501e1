"""One run, from its spec: the model, datamodule and Trainer built, then trained, tested and
recorded (train).

The user's modules are built through the plugin contract, and the probe runs under the very
Trainer that trains. train is what every rank of scripts/train.py runs: it checks the device,
builds the run and its callbacks (ddpscale.job.callbacks), re-emits the record of a run that
finished in an earlier attempt or resumes from its checkpoint (ddpscale.job.resume), trains,
runs the test pass, and on rank 0 has the job's recorder (ddpscale.job.record) assemble the
record, which core/record writes, the one writer of metrics.json and final.json.
"""

from __future__ import annotations

import os
import time

from ddpscale.core import record as run_record
from ddpscale.job import callbacks
from ddpscale.job import record as recorder
from ddpscale.job.device import compiling, gpu, transport
from ddpscale.job.launch.ranks import formed_world_size
from ddpscale.job.measure import accuracy, timing, windows
from ddpscale.job.resume import checkpoint
from ddpscale.run import ddpsettings, lightningcli, usermodule
from ddpscale.run.runspec import RunSpec


def ddp_strategy(spec: RunSpec):
    """The DDPStrategy of a run on more than one device: the config's DDP settings, its named
    comm hook as torch's function, and the timeout for a dead or stuck rank."""
    from datetime import timedelta

    from pytorch_lightning.strategies import DDPStrategy

    ddp = ddpsettings.complete(spec.ddp)
    hook = None
    if ddp["comm_hook"] != "none":
        # a name from ddpsettings.COMM_HOOKS, never a path from the config
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        hook = getattr(default_hooks, f"{ddp['comm_hook']}_hook")
    return DDPStrategy(timeout=timedelta(seconds=spec.collective_timeout_s), ddp_comm_hook=hook,
                       **ddpsettings.strategy_kwargs(ddp))


def set_threads(spec: RunSpec, torch) -> None:
    """Ranks of one simulated node share its cores; a cluster rank gets its cpus-per-task."""
    local_ranks = spec.devices_per_node if spec.cluster_env == "local" else 1
    torch.set_num_threads(spec.threads or max(1, (os.cpu_count() or 1) // (local_ranks * spec.num_nodes)))


def build_modules(spec: RunSpec):
    """The user's LightningModule and LightningDataModule, built from the spec."""
    import pytorch_lightning as pl

    compiling.check_compiler(spec.compile, on_cpu=spec.accelerator == "cpu" or not _has_cuda())
    model_cls = usermodule.load_class(spec.model_class, "model.class_path", pl.LightningModule)
    data_cls = usermodule.load_class(spec.data_class, "data.class_path", pl.LightningDataModule)
    data_args = usermodule.data_init_args(data_cls, dict(spec.data_args), spec.batch_per_device, dict(spec.loader),
                                       spec.data_file)
    data_args.update(compiling.static_shape_args(spec.compile, usermodule.accepted(data_cls), spec.data_args))
    model = compiling.wrap(model_cls(**spec.model_args), spec.compile)
    if spec.optimizers:
        lightningcli.attach_optimizers(model, spec.optimizers)
    return model, data_cls(**data_args)


def default_logger_kind() -> str:
    """The logger plain `Trainer()` gives a module (Lightning 2.6, LoggerConnector.configure_logger):
    a TensorBoardLogger where the tensorboard or tensorboardX package is installed, else a
    CSVLogger. A module written against it (log_hyperparams(params, metrics), experiment.add_histogram,
    as Lightning's TensorBoard guide shows) dies with a CSVLogger; Lightning's own test decides."""
    from lightning_fabric.loggers import tensorboard

    return "tensorboard" if tensorboard._TENSORBOARD_AVAILABLE or tensorboard._TENSORBOARDX_AVAILABLE else "csv"


def build_loggers(chosen: list | None, log_dir: str, attempt: int) -> list:
    """The run's loggers, all written in log_dir, one version per attempt: Lightning's default
    logger (default_logger_kind; nothing in ddpscale reads what it writes), or what a
    LightningCLI config's trainer.logger names (lightningcli.LOGGERS: CSV and TensorBoard loggers
    with their own arguments; [] for none)."""
    from pytorch_lightning.loggers import CSVLogger, TensorBoardLogger

    kinds = {"csv": CSVLogger, "tensorboard": TensorBoardLogger}
    chosen = [{"kind": default_logger_kind(), "init_args": {}}] if chosen is None else chosen
    return [kinds[c["kind"]](save_dir=log_dir, name="", version=f"attempt-{attempt}", **c["init_args"])
            for c in chosen]


def keep_fit_events(trainer) -> None:
    """Before the test pass: a TensorBoard writer that fit closed opens a new event file when the
    test logs. tensorboardX names that file by the second it opens and truncates one of that
    name, so a test within fit's last second erased every event fit wrote (the module's
    histograms, its training curves). A suffix of its own keeps the two apart; torch's writer
    names its files by process and a counter, and has no such attribute."""
    for logger in trainer.loggers:
        writer = getattr(logger, "_experiment", None)
        if isinstance(getattr(writer, "_filename_suffix", None), str):
            writer._filename_suffix += ".test"


def build_trainer(spec: RunSpec, run_callbacks: list, log_dir: str | None = None, max_epochs: int | None = None):
    """The Trainer of a run (max_epochs: spec.max_epochs).
    Its loggers (build_loggers: Lightning's default unless a LightningCLI config names others) write in
    log_dir (a folder of the run's own, one version per attempt, so
    a retry does not delete what the last one logged): a module that logs through self.logger,
    as Lightning's docs teach, finds one, and what it costs is in what the run measures. No
    log_dir (a test's trainer): no logger."""
    import warnings

    import pytorch_lightning as pl
    from pytorch_lightning.plugins.environments import LightningEnvironment, SLURMEnvironment

    env = SLURMEnvironment(auto_requeue=False) if spec.cluster_env == "slurm" else LightningEnvironment()
    if log_dir:
        # Lightning's hint for an epoch shorter than log_every_n_steps: logging counts steps
        # across epochs, so a short epoch's steps are still logged; in every small run's log
        # it would only be noise
        warnings.filterwarnings("ignore", message=r".*smaller than the logging interval")
    return pl.Trainer(
        accelerator=spec.accelerator, devices=spec.devices_per_node, num_nodes=spec.num_nodes,
        # one device trains as a user would without DDP; more devices use DDP
        strategy=ddp_strategy(spec) if spec.topo.world_size > 1 else "auto",
        plugins=[env], precision=spec.precision,
        max_epochs=spec.max_epochs if max_epochs is None else max_epochs,
        accumulate_grad_batches=spec.accumulate_grad_batches, callbacks=run_callbacks,
        logger=build_loggers(spec.loggers, log_dir, spec.attempt) if log_dir else False,
        enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, **spec.trainer_args,
    )


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def is_first_rank() -> bool:
    """Rank 0 as the launcher set it (srun or launch_local), before any process group exists."""
    return int(os.environ.get("SLURM_PROCID", os.environ.get("RANK", "0"))) == 0


def train(spec: RunSpec) -> int:
    """Train the run the spec describes and, on rank 0, write its metrics.json; 0 when done."""
    import pytorch_lightning as pl
    import torch
    from pytorch_lightning.utilities.model_helpers import is_overridden

    if is_first_rank():  # the workflow passes most of them in a file: the log shows what ran
        print(f"ddpscale: settings: {spec.command()}", flush=True)
    # first: a GPU run torch cannot give a GPU stops here, before any group or data exists
    gpu.require_gpu(spec.accelerator)
    topo = spec.topo
    transport.prepare(spec.metrics, topo.world_size, spec.accelerator)  # NCCL's transport log, before any group
    set_threads(spec, torch)
    pl.seed_everything(spec.run_seed, workers=True, verbose=False)
    started = recorder.now()
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
    trainer = build_trainer(spec, ours, recorder.logger_dir(spec.metrics))
    # the checkpoint and the finished record belong to this data, code and versions only
    identity = recorder.run_identity(spec, trainer.strategy.root_device)
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
    early_stop = recorder.early_stop(trainer, spec.measure, spec.max_epochs, len(measured.timing.epoch_times))
    added = recorder.module_callbacks(trainer, ours)
    logged = accuracy.scalars(trainer)  # trainer.test resets callback_metrics
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
        logged.update(accuracy.scalars(trainer))
    backend = torch.distributed.get_backend() if formed_world_size() > 1 else None
    transports = transport.gather(backend, spec.metrics)  # every rank takes part
    if trainer.global_rank == 0:
        missing = accuracy.end_line(accuracy_metric, logged) if accuracy_metric else None
        if missing:
            print(missing, flush=True)
        record = recorder.record(spec, trainer, measured, recorder.AfterFit(
            started=started, fit_wall_s=fit_wall_s, identity=identity, early_stop=early_stop, module_callbacks=added,
            logged=logged, backend=backend, transports=transports))
        checkpoint.finish(spec.ckpt_dir, settings, record)
        run_record.write(spec.metrics, record)  # last: its presence marks the run as done
    return 0
