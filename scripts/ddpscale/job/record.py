"""The job's recorder: the record of a run (metrics.json), assembled on rank 0 after fit and the
test pass from its sections, each produced by the concept that owns it and declared, key by key
with its kind and unit, in ddpscale.core.record.SECTIONS (which refuses a key a section does not
declare, and writes the file):

- run: what ran, where and on what code (run_section, here: the spec, the topology that formed,
  the Trainer as it ran, versions, and the run's identity, run_identity: what its numbers depend
  on, which also keys its checkpoint and its finished record);
- device, placement, transport: ddpscale.job.device.gpu, ddpscale.job.launch.ranks,
  ddpscale.job.device.transport;
- timing, checkpoint, windows: the run's clock (ddpscale.job.measure.timing), its saves
  (ddpscale.job.resume.checkpoint), its timed windows (ddpscale.job.measure.windows);
- throughput: the headline figure, chosen in one place (ddpscale.job.measure.windows.headline);
- probe, accuracy, compile, flops: ddpscale.job.callbacks, ddpscale.job.measure.accuracy,
  ddpscale.job.device.compiling, ddpscale.job.device.flops (through the FlopsCount callback).
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

import pytorch_lightning as pl
import torch

from ddpscale.core import record as run_record
from ddpscale.job import callbacks
from ddpscale.job.device import compiling, gpu, transport
# The local launcher's modules: its forked ranks have them loaded and an srun rank would not, so
# the code hash (run_identity) would differ between a cluster's runs and a local one's, and
# between topologies whenever the launcher gained an import. Imported here, every rank holds
# the same set.
from ddpscale.job.launch import spawner as _launcher  # noqa: F401
from ddpscale.job.launch.ranks import formed_world_size
from ddpscale.job.measure import windows
from ddpscale.run import ddpsettings, identity
from ddpscale.run.runspec import RunSpec


@dataclass
class AfterFit:
    """What train() knows of the run outside its callbacks, read right after fit (early_stop and
    module_callbacks before a test pass attaches the module's callbacks anew) and after the test
    pass (logged, transports)."""

    started: str  # when the job began to build the run (now())
    fit_wall_s: float  # this attempt's wall time in trainer.fit, the probe included
    identity: dict  # run_identity, below
    early_stop: dict | None  # early_stop()
    module_callbacks: list[str]  # module_callbacks()
    logged: dict  # every scalar the module logged in fit and test (ddpscale.job.measure.accuracy.scalars)
    backend: str | None  # the process group's, None on one rank
    transports: list[dict] | None  # ddpscale.job.device.transport.gather


def record(spec: RunSpec, trainer: pl.Trainer, measured: callbacks.RunCallbacks, after: AfterFit) -> dict:
    """The run's record, section by section (ddpscale.core.record.assemble checks each)."""
    world_size = formed_world_size()
    timing = measured.timing.section()
    windowed = measured.windows.section(uncounted=timing["samples_uncounted"])
    probe = callbacks.probe_section(measured.probe)
    run = run_section(spec, trainer, measured.timing.ranks, after, world_size, probe["probe_s"])
    throughput = windows.headline(spec.measure, spec.max_epochs, measured.timing.steady_figure(),
                                  windowed["window_throughput_samples_s"])
    device = gpu.section(trainer.strategy.root_device, measured.gpu.record, run["hosts"], world_size,
                         one_launcher=spec.cluster_env == "local")
    return run_record.assemble({
        "run": run, "device": device, "placement": measured.placement.section(),
        "transport": transport.section(after.backend, after.transports, spec.site_interconnect),
        "timing": timing, "checkpoint": measured.checkpoint.section(), "windows": windowed,
        "throughput": throughput, "probe": probe,
        "accuracy": measured.history.section(after.logged, timing["epoch_times_s"]),
        "compile": compiling.section(spec.compile, trainer.lightning_module),
        "flops": measured.flops.section(world_size, throughput["throughput_samples_s"], device["device_name"],
                                        spec.precision),
    })


def run_section(spec: RunSpec, trainer: pl.Trainer, ranks: list[dict], after: AfterFit, world_size: int,
                probe_s: float) -> dict:
    """The record's run section: the spec, the ranks that formed (ranks: EpochTiming.ranks), the
    Trainer as it ran, the versions and the run's identity."""
    hosts = sorted({r["host"] for r in ranks})
    simulated_nodes = os.environ.get("DDPSCALE_SIMULATED_NODES")
    return {
        "topology": spec.topology, "repeat": spec.repeat, "seed": spec.run_seed,
        "num_nodes": spec.num_nodes, "devices_per_node": spec.devices_per_node, "world_size": world_size,
        "node_ranks": [r["node_rank"] for r in ranks], "hosts": hosts,
        "simulated_nodes_on_one_host": bool(simulated_nodes) and len(hosts) == 1 and spec.num_nodes > 1,
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        "scaling": spec.scaling, "batch_per_device": spec.batch_per_device,
        "effective_batch": spec.batch_per_device * spec.topo.world_size * spec.accumulate_grad_batches,
        "accumulate_grad_batches": spec.accumulate_grad_batches, "precision": spec.precision,
        "max_epochs": spec.max_epochs, "model_class": spec.model_class,
        # what the report says was measured: parameters, and those the optimizer trains
        **parameter_counts(trainer.lightning_module),
        "optimizers": [type(o).__name__ for o in trainer.optimizers],
        # further Trainer settings (a LightningCLI config's), as the Trainer holds them
        "trainer_settings": trainer_settings(trainer, spec.trainer_args),
        # DistributedDataParallel's settings (config ddp); "used": false where one device trained
        "ddp": ddpsettings.record(spec.ddp, world_size),
        "data_class": spec.data_class,
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "lightning": pl.__version__},
        "identity": after.identity,
        "launched_from": socket.gethostname(), "started_at": after.started, "finished_at": now(),
        "early_stop": after.early_stop,  # a module's callback ended the training before max_epochs
        "module_callbacks": after.module_callbacks,
        "loggers": loggers(trainer),
        # what held time is billed for: whole nodes with site_exclusive, else the ranks
        "held_devices": spec.held_devices or world_size,
        # wall time of this attempt's trainer.fit (set-up included, the probe not); fit_time_s
        # is the sum of finished epochs over all attempts, the figure the report compares
        "fit_wall_s": after.fit_wall_s - probe_s,
    }


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
