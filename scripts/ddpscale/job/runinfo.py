"""Bookkeeping of one training run: resume checkpoints, device facts, the metrics record."""

from __future__ import annotations

import datetime as dt
import os
import pickle
import platform
import re
import socket
import sys
from pathlib import Path

import pytorch_lightning as pl
import torch

from ddpscale.core import record as run_record
from ddpscale.core.io import read_json_dict, terminal_safe, write_json_atomic
from ddpscale.job import checksum

# The local launcher's modules: its forked ranks have them loaded and an srun rank would not, so
# the code hash (run_identity) would differ between a cluster's runs and a local one's, and
# between topologies whenever the launcher gained an import. Imported here, every rank holds
# the same set.
from ddpscale.job import launch as _launcher  # noqa: F401
from ddpscale.run import ddpsettings, identity
from ddpscale.run.hostdevices import host_oversubscribed, usable_cores
from ddpscale.run.runspec import RunSpec

LAST = "last.ckpt"
PREVIOUS = "previous.ckpt"  # the checkpoint last.ckpt replaced, kept until the next save (ddpscale.job.checksum)
# where the run's logger writes (build.build_trainer), beside its record
LOGS = "logs"
FINGERPRINT = "fingerprint.json"
FINAL = "final.json"  # the metrics record of a finished run, kept for a retry of the same job


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


def resume_path(ckpt_dir: str, settings: dict, is_rank_zero: bool) -> str | None:
    """The checkpoint to resume from, or None to start fresh.

    A checkpoint is only resumed if it was written by a run with the same settings and
    identity (data checksum, training code, versions); a stale one is removed by rank 0 so a
    changed config, dataset or code starts over. Of a matching one, last.ckpt is resumed if it
    is whole, signed and loads as data (problem), else previous.ckpt, the one it replaced; one
    that is not is set aside (last.ckpt.damaged), or every rerun would crash, resume damaged
    weights or run the code a planted file names.
    Every rank reaches the same answer without a process group: rank 0 deletes or renames
    a checkpoint (atomic) before it rewrites the fingerprint or looks at the next one, each
    rank checks a file itself (a rank that finds it renamed already goes on to the next, as
    rank 0 did), and a new checkpoint cannot appear before all ranks have started.
    """
    ckpt_dir = Path(ckpt_dir)
    last, stamp = ckpt_dir / LAST, ckpt_dir / FINGERPRINT
    wanted = identity.digest(settings)
    recorded = _read_stamp(stamp)
    candidates = [ckpt_dir / LAST, ckpt_dir / PREVIOUS]
    if recorded.get("fingerprint") == wanted:
        damaged = False
        for path in candidates:
            if not path.exists():
                continue
            why = problem(path, interrupted=path == last and (ckpt_dir / PREVIOUS).exists())
            if why is None:
                return str(path)
            damaged = True
            if is_rank_zero:
                aside = checksum.put_aside(path)
                print(f"ddpscale: {path} {why}; set aside as {aside.name}", flush=True)
        if damaged and is_rank_zero:
            print("ddpscale: no whole checkpoint left; starting this run fresh", flush=True)
        return None
    if is_rank_zero:
        if last.exists():
            changed = ", ".join(k for k in changed_keys(recorded.get("settings"), settings)
                                if not k.endswith("digest")) or "unknown"
            print(f"ddpscale: {last} was written with other settings (changed: {changed}); "
                  "starting this run fresh", flush=True)
        for path in candidates:
            checksum.remove(path)
        # atomic: the other ranks read this file while rank 0 writes it
        write_json_atomic(stamp, {"fingerprint": wanted, "settings": settings})
    return None


def _read_stamp(stamp: Path) -> dict:
    return read_json_dict(stamp) or {}


def problem(path: Path, interrupted: bool) -> str | None:
    """Why a checkpoint is not resumed, as the rest of a sentence ("is damaged (...)"), or None.

    Its checksum decides whether it is whole. One without a checksum is never resumed: where a
    previous.ckpt exists its save was cut short, else ddpscale did not write it (a copied or
    planted file), and a checkpoint is trusted only as far as this run's own signature goes. A
    whole one must still load as data (unloadable), or resuming would stop at trainer.fit."""
    why = checksum.mismatch(path)
    if why == checksum.UNSIGNED:
        if interrupted:
            return "is damaged (it has no checksum: its save was interrupted)"
        return (f"is not resumed (it has no checksum, {checksum.sidecar(path).name}: ddpscale resumes only "
                "checkpoints it wrote and signed)")
    if why:
        return f"is damaged ({why})"
    why = unloadable(path)
    return f"is not resumed ({why})" if why else None


def unloadable(path: Path) -> str | None:
    """Why torch cannot load this checkpoint as data, or None.

    weights_only=True: a checkpoint is unpickled as tensors and plain types only, so a file that
    names a function to call (a pickle's __reduce__) is refused instead of run. Lightning's own
    contents (hyper-parameters, loops, callbacks, optimizer states) are plain types; a module
    that saves its own classes registers them (docs/your-model.md). Cheap for a checkpoint of
    gigabytes: mmap=True reads the zip directory and unpickles the structure, but leaves the
    tensor bytes on disk until used.
    """
    try:
        saved = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    except pickle.UnpicklingError as err:
        found = re.search(r"Unsupported global: GLOBAL (\S+)", str(err))
        held = found.group(1) if found else "an object torch does not load as data"
        return (f"it holds {terminal_safe(held)}, which torch would load only by running code; a module's own "
                "class must be allowed with torch.serialization.add_safe_globals (docs/your-model.md)")
    except Exception as err:  # noqa: BLE001 - whatever torch raises, the file is unusable
        return f"{type(err).__name__}: {str(err).splitlines()[0][:120] if str(err) else 'no detail'}"
    if not isinstance(saved, dict) or "state_dict" not in saved:
        return "not a Lightning checkpoint"
    return None


def changed_keys(old, new, prefix: str = "") -> list[str]:
    """Dotted names of the entries that differ between two settings dicts."""
    if not isinstance(old, dict) or not isinstance(new, dict):
        return [prefix] if old != new and prefix else []
    out = []
    for key in sorted(set(old) | set(new)):
        name = f"{prefix}{key}"
        if isinstance(old.get(key), dict) and isinstance(new.get(key), dict):
            out += changed_keys(old[key], new[key], name + ".")
        elif old.get(key) != new.get(key):
            out.append(name)
    return out


def finish(ckpt_dir: str, settings: dict, record: dict) -> None:
    """After success: keep the record, drop the resume checkpoint.

    A job can finish and still be killed before it exits (SLURM's time limit during
    interpreter teardown): the scheduler then reports TIMEOUT and Snakemake deletes the
    metrics. The retry re-emits this record instead of training again.
    """
    ckpt_dir = Path(ckpt_dir)
    write_json_atomic(ckpt_dir / FINAL, {"fingerprint": identity.digest(settings), "record": record})
    for name in (LAST, PREVIOUS):
        checksum.remove(ckpt_dir / name)


def finished_record(ckpt_dir: str, settings: dict, attempt: int, is_rank_zero: bool) -> dict | None:
    """The record of this same run if it finished in an earlier attempt of this job.

    Only for a retry (attempt > 1): a new command (say, after deleting metrics.json to
    measure again) always trains afresh. Every rank reaches the same answer; only rank 0
    removes a record that no longer applies.
    """
    path = Path(ckpt_dir) / FINAL
    if not path.exists():
        return None
    final = read_json_dict(path) or {}
    # a record of another shape is as good as none: the run trains (or resumes) and writes its own
    done = final.get("record")
    whole = isinstance(done, dict) and run_record.problem({**done, "schema_version": run_record.SCHEMA_VERSION}) is None
    if attempt > 1 and whole and final.get("fingerprint") == identity.digest(settings):
        return done
    if is_rank_zero:
        path.unlink(missing_ok=True)
    return None


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
        "num_nodes": spec.nodes,
        "devices_per_node": spec.devices,
        "world_size": formed_world_size(),
        "node_ranks": [r["node_rank"] for r in ranks],
        "hosts": hosts,
        "simulated_nodes_on_one_host": bool(simulated_nodes) and len(hosts) == 1 and spec.nodes > 1,
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
