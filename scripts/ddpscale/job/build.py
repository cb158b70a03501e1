"""A run's spec in, (model, datamodule) and the Trainer out.

The user's modules are built through the plugin contract, and the probe runs under the very
Trainer that trains.
"""

from __future__ import annotations

import os

from ddpscale.job.device import compiling
from ddpscale.plan import ddpsettings, lightningcli, plugins
from ddpscale.plan.runspec import RunSpec

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
    local_ranks = spec.devices if spec.cluster_env == "local" else 1
    torch.set_num_threads(spec.threads or max(1, (os.cpu_count() or 1) // (local_ranks * spec.nodes)))


def build_modules(spec: RunSpec):
    """The user's LightningModule and LightningDataModule, built from the spec."""
    import pytorch_lightning as pl

    compiling.check_compiler(spec.compile, on_cpu=spec.accelerator == "cpu" or not _has_cuda())
    model_cls = plugins.load_class(spec.model_class, "model.class_path", pl.LightningModule)
    data_cls = plugins.load_class(spec.data_class, "data.class_path", pl.LightningDataModule)
    data_args = plugins.data_init_args(data_cls, dict(spec.data_args), spec.batch_per_device, dict(spec.loader),
                                       spec.data_file)
    data_args.update(compiling.static_shape_args(spec.compile, plugins.accepted(data_cls), spec.data_args))
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
        accelerator=spec.accelerator, devices=spec.devices, num_nodes=spec.nodes,
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
