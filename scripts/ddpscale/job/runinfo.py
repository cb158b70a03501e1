"""Bookkeeping of one training run: its identity, device facts, the metrics record."""

from __future__ import annotations

import datetime as dt
import os
import platform
import socket
import sys
from pathlib import Path

import pytorch_lightning as pl
import torch

# The local launcher's modules: its forked ranks have them loaded and an srun rank would not, so
# the code hash (run_identity) would differ between a cluster's runs and a local one's, and
# between topologies whenever the launcher gained an import. Imported here, every rank holds
# the same set.
from ddpscale.job.launch import spawner as _launcher  # noqa: F401
from ddpscale.run import ddpsettings, identity
from ddpscale.run.hostdevices import host_oversubscribed, usable_cores
from ddpscale.run.runspec import RunSpec

# where the run's logger writes (build.build_trainer), beside its record
LOGS = "logs"


def logger_dir(record_path: str) -> str:
    """The folder a run's logger writes in: beside its record (metrics.json)."""
    return str(Path(record_path).parent / LOGS)


def run_identity(spec: RunSpec, root_device: torch.device) -> dict:
    """What this run's numbers depend on (ddpscale.run.identity), measured on this rank.

    Called once the user's classes are imported (their modules are part of the code) and
    before anything imports modules by topology, so every run of a config hashes the same set.
    """
    data = ([spec.data_file] if spec.data_file else []) + list(spec.data_files)
    scripts = Path(__file__).resolve().parents[2]
    user_modules = [path.rpartition(".")[0] for path in (spec.model_class, spec.data_class)]
    launcher = [scripts / "launch_local.py"]  # a script; the launcher's modules are imported above
    code = identity.code_files(sys.modules, scripts, [scripts / "train.py", *launcher], user_modules)
    return identity.identity(identity.data_checksums(data), spec.measured(), identity.code_hash(code),
                             software_versions(root_device))


def software_versions(root_device: torch.device) -> dict:
    """torch and Lightning; CUDA and NCCL only where the run used them (None on CPU)."""
    on_gpu = root_device.type == "cuda"
    nccl = None
    if on_gpu and torch.distributed.is_nccl_available():
        found = torch.cuda.nccl.version()
        nccl = ".".join(map(str, found)) if isinstance(found, tuple) else str(found)
    return {"torch": torch.__version__, "lightning": pl.__version__,
            "cuda": torch.version.cuda if on_gpu else None, "nccl": nccl}
















def device_facts(trainer: pl.Trainer) -> dict:
    root = trainer.strategy.root_device
    if root.type == "cuda":
        return {"device_kind": "cuda", "device_name": torch.cuda.get_device_name(root), "simulated": False}
    # Each CPU process stands in for one GPU; the report must never call this a GPU result.
    return {"device_kind": root.type, "device_name": f"{root.type}, simulated", "simulated": True}


def formed_world_size() -> int:
    """Read from the process group that actually formed, not from the request."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_world_size()
    return 1


def scalars(trainer: pl.Trainer) -> dict:
    return {k: float(v) for k, v in trainer.callback_metrics.items() if torch.is_tensor(v) and v.numel() == 1}


def early_stop(trainer: pl.Trainer, measure: str, max_epochs: int, epochs_completed: int) -> dict | None:
    """How a full training ended before its configured epochs because something asked it to: a
    module's EarlyStopping (configure_callbacks) or its own code setting trainer.should_stop.
    {"by": the callbacks that stopped it, or "the module", "epochs_trained", "configured_epochs"};
    None where it trained them all, and in throughput mode, which stops by design. Called right
    after fit: a test pass attaches the module's callbacks anew, a fresh EarlyStopping with them."""
    if measure != "full" or not trainer.should_stop or epochs_completed >= max_epochs:
        return None
    by = sorted({type(c).__name__ for c in trainer.callbacks if getattr(c, "stopped_epoch", 0)})
    return {"by": ", ".join(by) or "the module (trainer.should_stop)", "epochs_trained": epochs_completed,
            "configured_epochs": max_epochs}


def module_callbacks(trainer: pl.Trainer, ours: list) -> list[str]:
    """The class names of the callbacks the Trainer ran besides ddpscale's own: those the
    module's configure_callbacks added. Called right after fit, as early_stop is."""
    return [type(c).__name__ for c in trainer.callbacks if not any(c is mine for mine in ours)]


def loggers(trainer: pl.Trainer) -> list[str]:
    """The class names of the run's loggers (build.build_loggers): what it logged to is part of
    what it measured, and the report names them."""
    return [type(logger).__name__ for logger in trainer.loggers]


def metrics_record(spec: RunSpec, scalars: dict, trainer: pl.Trainer, summary: dict, ranks: list[dict],
                   started: str, batch_per_device: int, effective_batch: int) -> dict:
    hosts = sorted({r["host"] for r in ranks})
    simulated_nodes = os.environ.get("DDPSCALE_SIMULATED_NODES")
    devices = device_facts(trainer)
    cores = usable_cores()  # this rank's; the local launcher's ranks all share the same set
    return {
        "topology": spec.topology,
        "repeat": spec.repeat,
        "seed": spec.run_seed,
        "num_nodes": spec.num_nodes,
        "devices_per_node": spec.devices_per_node,
        "world_size": formed_world_size(),
        "node_ranks": [r["node_rank"] for r in ranks],
        "hosts": hosts,
        "simulated_nodes_on_one_host": bool(simulated_nodes) and len(hosts) == 1 and spec.num_nodes > 1,
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        **devices,
        "usable_cores": cores,
        # CPU ranks that outnumber the cores they share measure contention, not scaling
        "oversubscribed": host_oversubscribed(devices["simulated"], hosts, formed_world_size(), cores,
                                              one_launcher=spec.cluster_env == "local"),
        "backend": torch.distributed.get_backend() if formed_world_size() > 1 else None,
        "scaling": spec.scaling,
        "batch_per_device": batch_per_device,
        "effective_batch": effective_batch,
        "accumulate_grad_batches": spec.accumulate_grad_batches,
        "precision": spec.precision,
        "max_epochs": spec.max_epochs,
        **summary,
        "val_loss": scalars.get("val_loss"),
        "val_acc": scalars.get("val_acc"),
        "test_acc": scalars.get("test_acc"),
        "logged_metrics": scalars,
        "model_class": spec.model_class,
        # what the report says was measured: parameters, and those the optimizer trains
        **parameter_counts(trainer.lightning_module),
        "optimizers": [type(o).__name__ for o in trainer.optimizers],
        # further Trainer settings (a LightningCLI config's), as the Trainer holds them
        "trainer_settings": trainer_settings(trainer, spec.trainer_args),
        # DistributedDataParallel's settings (config ddp); "used": false where one device trained
        "ddp": ddpsettings.record(spec.ddp, formed_world_size()),
        "data_class": spec.data_class,
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "lightning": pl.__version__},
        "launched_from": socket.gethostname(),
        "started_at": started,
        "finished_at": now(),
    }


def trainer_settings(trainer: pl.Trainer, asked: dict) -> dict:
    """Each Trainer argument passed beyond ddpscale's own, read back from the Trainer where it
    keeps one (what it uses, not what the flag said), as text where it is not plain JSON (an enum)."""
    out = {}
    for key, given in asked.items():
        value = getattr(trainer, key) if hasattr(trainer, key) else given
        out[key] = value if isinstance(value, (bool, int, float, str, type(None))) else str(value)
    return out


def parameter_counts(module: torch.nn.Module) -> dict:
    params = list(module.parameters())
    return {"model_parameters": sum(p.numel() for p in params),
            "model_trainable_parameters": sum(p.numel() for p in params if p.requires_grad)}


def now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
