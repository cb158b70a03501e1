"""What a training run is, before it trains: its identity (what its numbers depend on, which keys
its checkpoint and its finished record), and where its logger writes. Its record is
ddpscale.job.record's."""

from __future__ import annotations

import sys
from pathlib import Path

import pytorch_lightning as pl
import torch

# The local launcher's modules: its forked ranks have them loaded and an srun rank would not, so
# the code hash (run_identity) would differ between a cluster's runs and a local one's, and
# between topologies whenever the launcher gained an import. Imported here, every rank holds
# the same set.
from ddpscale.job.launch import spawner as _launcher  # noqa: F401
from ddpscale.run import identity
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
