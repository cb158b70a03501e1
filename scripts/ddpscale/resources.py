"""Site facts (from a profile) + topology -> SLURM resources and the launch command.

Pure functions: nothing here runs a scheduler, so every profile's mapping is unit-tested.
The resource names are those of snakemake-executor-plugin-slurm 2.8.0.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, fields

from ddpscale.topology import Topology

# A profile states its site facts as custom resources of rule `train`, prefixed so that
# they never collide with a resource the SLURM plugin interprets.
SITE_PREFIX = "site_"


class SiteError(ValueError):
    """A profile's site facts are incomplete or misspelt."""


@dataclass(frozen=True)
class Site:
    launcher: str = "local"  # "local": one process per simulated device on this host; else e.g. "srun"
    gpus_per_node: int | None = None  # devices a node has; None = no limit (local simulation)
    gpu_type: str | None = None  # gres type, e.g. "a100" -> --gres=gpu:a100:N
    cpus_per_gpu: int = 1  # CPUs for each rank (one rank per GPU)
    mem_mb_per_gpu: int = 2000  # host memory for each rank
    env: str = ""  # variables exported to every rank, e.g. NCCL settings: "NCCL_IB_DISABLE=0 ..."

    @property
    def is_local(self) -> bool:
        return self.launcher == "local"


def site_from_resources(resources: dict, where: str = "profile set-resources train") -> Site:
    """Build a Site from the `site_*` entries of a profile's set-resources for rule train."""
    known = {f.name for f in fields(Site)}
    values = {}
    for key, value in resources.items():
        if not key.startswith(SITE_PREFIX):
            continue
        name = key[len(SITE_PREFIX):]
        if name not in known:
            raise SiteError(
                f"{where}: unknown site fact '{key}'; known: "
                + ", ".join(SITE_PREFIX + k for k in sorted(known))
            )
        values[name] = value
    site = Site(**values)
    for name in ("cpus_per_gpu", "mem_mb_per_gpu", "gpus_per_node"):
        value = getattr(site, name)
        if name == "gpus_per_node" and value is None:
            continue
        # bool is an int in Python; `site_cpus_per_gpu: true` would become --cpus-per-task=True
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise SiteError(f"{where}: {SITE_PREFIX}{name} must be an integer >= 1 (got {value!r})")
    if not isinstance(site.launcher, str) or not site.launcher.strip():
        raise SiteError(f"{where}: {SITE_PREFIX}launcher must be 'local' or a launcher such as 'srun' (got {site.launcher!r})")
    return site


def cluster_launched(topo: Topology, site: Site) -> bool:
    """Whether the site's launcher (srun) starts the ranks; 1 rank or local: no launcher job."""
    return topo.world_size > 1 and not site.is_local


def slurm_resources(topo: Topology, site: Site) -> dict:
    """The plugin resources of one training job.

    Facts of plugin 2.8.0 this relies on:
    - a job with a truthy `mpi` resource runs its shell in the batch step, and the shell
      starts the ranks itself (launch_prefix); with `mpi` falsy the plugin wraps the job in
      `srun -n1`, which would train a multi-node topology on one rank and "succeed";
    - the plugin refuses `mpi` with tasks == 1, so the 1-rank baseline is a plain job;
    - with a gpu gres the plugin adds --ntasks-per-gpu from `tasks` unless tasks_per_gpu=0,
      which breaks M nodes x 1 GPU; `gres` is per node, unlike `gpu` (a job-wide total).
    """
    gres = f"gpu:{site.gpu_type}:{topo.devices_per_node}" if site.gpu_type else f"gpu:{topo.devices_per_node}"
    return {
        "nodes": topo.num_nodes,
        "tasks": topo.world_size,
        "tasks_per_gpu": 0,
        "gres": gres,
        "cpus_per_task": site.cpus_per_gpu,
        # --mem is per node: one rank per device on each node.
        "mem_mb": site.mem_mb_per_gpu * topo.devices_per_node,
        "mpi": site.launcher if cluster_launched(topo, site) else "",
    }


def launch_prefix(topo: Topology, site: Site, python: str, gpu_ids: list[str] | None = None) -> str:
    """The command that starts every rank of a topology, to be followed by the script and flags.

    All counts are explicit: under SLURM the plugin's jobstep strips SLURM_* variables before
    the shell runs, and Lightning's SLURMEnvironment needs --ntasks-per-node == devices.

    Local site: gpu_ids are the GPUs this host hands out (ddpscale.hostdevices). Absent, the
    run is CPU-simulated and its ranks see no GPU (CUDA_VISIBLE_DEVICES empty), so CUDA is
    never initialised; given, a single rank gets the first and the local launcher gives each
    simulated node its own. A cluster's ranks get their GPUs from the allocation.
    """
    variables = [site.env] if site.env else []
    if not site.is_local:
        if gpu_ids is not None:
            raise ValueError("gpu_ids are for the local launcher; under SLURM the allocation sets the GPUs")
    elif gpu_ids is None:
        variables.append("CUDA_VISIBLE_DEVICES=")
    elif len(gpu_ids) < topo.world_size:
        raise ValueError(f"{topo.name} needs {topo.world_size} GPUs, one per rank; got {len(gpu_ids)}")
    elif topo.world_size == 1:
        variables.append(f"CUDA_VISIBLE_DEVICES={shlex.quote(gpu_ids[0])}")
    env = f"env {' '.join(variables)} " if variables else ""
    if topo.world_size == 1:
        return f"{env}{shlex.quote(python)}"
    if site.is_local:
        gpus = "" if gpu_ids is None else f"--gpu-ids {shlex.quote(','.join(gpu_ids[:topo.world_size]))} "
        return (
            f"{env}{shlex.quote(python)} scripts/launch_local.py --nodes {topo.num_nodes} "
            f"--procs-per-node {topo.devices_per_node} {gpus}-- {shlex.quote(python)}"
        )
    return (
        f"{env}{site.launcher} --nodes={topo.num_nodes} --ntasks-per-node={topo.devices_per_node} "
        f"--cpus-per-task={site.cpus_per_gpu} --kill-on-bad-exit=1 {shlex.quote(python)}"
    )


def cluster_env(topo: Topology, site: Site) -> str:
    """Which Lightning cluster environment the ranks must use (never guessed from variables)."""
    if cluster_launched(topo, site):
        return "slurm"
    return "local"
