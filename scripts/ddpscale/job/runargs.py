"""What defines a run: train.py's flags in, (model, datamodule) and the Trainer out.

The workflow passes every setting explicitly; the user's modules are built through the plugin
contract, and the probe runs under the very Trainer that trains.
"""

from __future__ import annotations

import argparse
import json
import os

from ddpscale.core.topology import Topology, batch_per_device
from ddpscale.job import compiling
from ddpscale.plan import ddpsettings, lightningcli, plugins

# Flags that change how a run fails, not what it measures: left out of its identity, so
# changing them does not start a run over.
NOT_IDENTITY = ("collective_timeout_s", "compile_timeout_s")
DEFAULT_LOADER = '{"num_workers": 0, "pin_memory": false, "persistent_workers": false, "prefetch_factor": null}'


def add_run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--topology", required=True, help="label, e.g. 2x4")
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--devices", type=int, required=True, help="devices (ranks) per node")
    p.add_argument("--accelerator", default="auto", choices=["auto", "cpu", "gpu"])
    p.add_argument("--cluster-env", default="local", choices=["local", "slurm"])
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads per rank; 0: cores / local ranks")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--scaling", choices=["weak", "strong"], required=True)
    p.add_argument("--batch-size", type=int, required=True, help="per device (weak) or global (strong)")
    p.add_argument("--batch-dim", type=int, default=0,
                   help="the dimension of the batch's tensors that indexes samples (config batch.dim)")
    p.add_argument("--precision", default="32-true")
    p.add_argument("--compile", default="none", choices=compiling.MODES, help="torch.compile mode, or none")
    p.add_argument("--accumulate-grad-batches", type=int, default=1)
    p.add_argument("--loader", default=DEFAULT_LOADER,
                   help="JSON: num_workers, pin_memory, persistent_workers, prefetch_factor")
    p.add_argument("--ddp", type=ddp_settings, default=ddpsettings.complete({}),
                   help="JSON: DistributedDataParallel's settings on more than one device (config ddp): "
                        f"{', '.join(ddpsettings.DEFAULTS)}")
    p.add_argument("--model-class", required=True)
    p.add_argument("--model-args", default="{}", help="JSON init arguments")
    p.add_argument("--data-class", required=True)
    p.add_argument("--data-args", default="{}", help="JSON init arguments")
    p.add_argument("--data-file", default=None, help="dataset written by prepare_data")
    p.add_argument("--collective-timeout-s", type=float, default=300,
                   help="seconds a collective waits for a dead or stuck rank before the job fails")
    p.add_argument("--compile-timeout-s", type=float, default=1800,
                   help="seconds a collective waits while torch.compile compiles (--compile other than none): "
                        "the probe, the first training steps and the first validation and test")
    p.add_argument("--data-files", default="[]",
                   help="JSON list: the files the data module reads (config data.files), checksummed "
                        "into the run's identity")
    p.add_argument("--trainer-args", default="{}",
                   help="JSON: further pl.Trainer arguments (a LightningCLI config's gradient_clip_val, ...)")
    p.add_argument("--loggers", default=None,
                   help="JSON list: a LightningCLI config's trainer.logger as [{kind: csv|tensorboard, "
                        "init_args}] ([]: none); default: one CSVLogger")
    p.add_argument("--optimizers", default="{}",
                   help="JSON: a LightningCLI config's optimizer and lr_scheduler, used as the model's "
                        "configure_optimizers as LightningCLI does")


def run_flags(**settings) -> argparse.Namespace:
    """A run's flags as the parser gives them, defaults for all not in settings: code that builds a
    run's Trainer without the command line (the benchmarks) gets every flag train.py has."""
    p = argparse.ArgumentParser()
    add_run_args(p)
    defaults = {a.dest: a.default for a in p._actions if a.dest != "help"}
    return argparse.Namespace(**{**defaults, **settings})


def ddp_settings(text: str) -> dict:
    """--ddp checked before anything trains: argparse prints the one line and exits."""
    try:
        return ddpsettings.parse(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def ddp_strategy(args):
    """The DDPStrategy of a run on more than one device: the config's DDP settings, its named
    comm hook as torch's function, and the timeout for a dead or stuck rank."""
    from datetime import timedelta

    from pytorch_lightning.strategies import DDPStrategy

    ddp = ddpsettings.complete(getattr(args, "ddp", None))
    hook = None
    if ddp["comm_hook"] != "none":
        # a name from ddpsettings.COMM_HOOKS, never a path from the config
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        hook = getattr(default_hooks, f"{ddp['comm_hook']}_hook")
    return DDPStrategy(timeout=timedelta(seconds=args.collective_timeout_s), ddp_comm_hook=hook,
                       **ddpsettings.strategy_kwargs(ddp))


def run_seed(args) -> int:
    """The seed a run trains with: the config's seed plus the repeat, so each repeat trains with
    a seed of its own (accuracy held is a test over seeds: ddpscale.report.accuracy) and repeat
    r of every topology shares one."""
    return args.seed + getattr(args, "repeat", 0)


def topology(args) -> Topology:
    return Topology(args.nodes, args.devices)


def per_device_batch(args) -> int:
    return batch_per_device(args.scaling, args.batch_size, topology(args))


def set_threads(args, torch) -> None:
    """Ranks of one simulated node share its cores; a cluster rank gets its cpus-per-task."""
    local_ranks = args.devices if args.cluster_env == "local" else 1
    torch.set_num_threads(args.threads or max(1, (os.cpu_count() or 1) // (local_ranks * args.nodes)))


def build_modules(args):
    """The user's LightningModule and LightningDataModule, built from the flags."""
    import pytorch_lightning as pl

    compiling.check_compiler(args.compile, on_cpu=args.accelerator == "cpu" or not _has_cuda())
    model_cls = plugins.load_class(args.model_class, "model.class_path", pl.LightningModule)
    data_cls = plugins.load_class(args.data_class, "data.class_path", pl.LightningDataModule)
    user_data_args = json.loads(args.data_args)
    data_args = plugins.data_init_args(data_cls, user_data_args, per_device_batch(args),
                                       json.loads(args.loader), args.data_file)
    data_args.update(compiling.static_shape_args(args.compile, plugins.accepted(data_cls), user_data_args))
    model = compiling.wrap(model_cls(**json.loads(args.model_args)), args.compile)
    optimizers = json.loads(args.optimizers)
    if optimizers:
        lightningcli.attach_optimizers(model, optimizers)
    return model, data_cls(**data_args)


def build_loggers(spec: str | None, log_dir: str, attempt: int) -> list:
    """The run's loggers, all written in log_dir, one version per attempt: a CSVLogger, or what
    a LightningCLI config's trainer.logger names (lightningcli.LOGGERS: CSV and TensorBoard
    loggers with their own arguments; [] for none)."""
    from pytorch_lightning.loggers import CSVLogger, TensorBoardLogger

    kinds = {"csv": CSVLogger, "tensorboard": TensorBoardLogger}
    chosen = [{"kind": "csv", "init_args": {}}] if spec is None else json.loads(spec)
    return [kinds[c["kind"]](save_dir=log_dir, name="", version=f"attempt-{attempt}", **c["init_args"])
            for c in chosen]


def build_trainer(args, run_callbacks: list, log_dir: str | None = None, max_epochs: int | None = None):
    """The Trainer of a run (max_epochs: args.max_epochs).
    Its loggers (build_loggers: a CSVLogger unless a LightningCLI config names others) write in
    log_dir (a folder of the run's own, one version per attempt, so
    a retry does not delete what the last one logged): a module that logs through self.logger,
    as Lightning's docs teach, finds one, and what it costs is in what the run measures. No
    log_dir (a test's trainer): no logger."""
    import warnings

    import pytorch_lightning as pl
    from pytorch_lightning.plugins.environments import LightningEnvironment, SLURMEnvironment

    env = SLURMEnvironment(auto_requeue=False) if args.cluster_env == "slurm" else LightningEnvironment()
    if log_dir:
        # Lightning's hint for an epoch shorter than log_every_n_steps: logging counts steps
        # across epochs, so a short epoch's steps are still logged; in every small run's log
        # it would only be noise
        warnings.filterwarnings("ignore", message=r".*smaller than the logging interval")
    return pl.Trainer(
        accelerator=args.accelerator, devices=args.devices, num_nodes=args.nodes,
        # one device trains as a user would without DDP; more devices use DDP
        strategy=ddp_strategy(args) if topology(args).world_size > 1 else "auto",
        plugins=[env], precision=args.precision,
        max_epochs=args.max_epochs if max_epochs is None else max_epochs,
        accumulate_grad_batches=args.accumulate_grad_batches, callbacks=run_callbacks,
        logger=build_loggers(getattr(args, "loggers", None), log_dir, getattr(args, "attempt", 1)) if log_dir else False,
        enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, **json.loads(args.trainer_args),
    )


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()
