"""Site facts (from a profile) + topology -> SLURM resources and the launch command.

Pure functions: nothing here runs a scheduler, so every profile's mapping is unit-tested.
The resource names are those of snakemake-executor-plugin-slurm 2.8.0.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, fields

from ddpscale.run.topology import Topology
from ddpscale.core.io import CONTROL_CHARACTER
from ddpscale.plan.config.check import closest

# A profile states its site facts as custom resources of its set-resources entry `train`,
# prefixed so that they never collide with a resource the SLURM plugin interprets.
SITE_PREFIX = "site_"


# The site facts that are true or false (Snakemake hands a profile's `false` over as "False").
FLAG_FACTS = ("exclusive", "multi_node_whole_nodes")
# site_interconnect's values: what the report expects NCCL to use between nodes
INTERCONNECTS = ("infiniband", "ethernet", "unknown")
# How ranks start: one process per simulated device on this host, or tasks of an srun step.
LAUNCHERS = ("local", "srun")
# site_env and site_slurm_extra end up in shell lines (the job's, and the plugin's sbatch call,
# which it runs through a shell), so they are held to a grammar that has no shell syntax: a
# variable's name is an identifier (its value is quoted), an sbatch flag holds only these.
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
SBATCH_TEXT = re.compile(r"[A-Za-z0-9_.,:@%/+= -]*")
# An account, partition, QOS, cluster or node constraint: names, and the operators of sbatch's
# --constraint (& | [ ] *count), but not its parentheses: with them the text could call Python.
NAME_TEXT = re.compile(r"[A-Za-z0-9_.,:&|\[\]*-]+")
# A GRES type as the SLURM plugin accepts it in gpu:<type>:<count> (its utils.set_gres_string).
GPU_TYPE = re.compile(r"[A-Za-z0-9_.]+")
# sbatch --signal's sig_time "must have an integer value between 0 and 65535" (man sbatch).
SIGNAL_MAX_S = 65535


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
    # SLURM sends USR1 this many seconds before a training job's time limit, so the run can
    # save a mid-epoch checkpoint and exit (its retry resumes); 0: no warning signal.
    signal_s: int = 120
    # Whole nodes for training jobs (--exclusive): no other job shares their PCIe or network,
    # at the cost of queue time (every job holds whole nodes).
    exclusive: bool = False
    # The site gives a job of more than one node whole nodes (Raven): M x N with M > 1 must
    # use every GPU of each node, or the site refuses it.
    multi_node_whole_nodes: bool = False
    slurm_extra: str = ""  # further sbatch flags of training jobs, e.g. "--gpu-bind=none"
    # The network between nodes (INTERCONNECTS): the report flags a multi-node run whose NCCL
    # fell back to sockets on an InfiniBand site.
    interconnect: str = "unknown"

    @property
    def is_local(self) -> bool:
        return self.launcher == "local"

    @property
    def whole_nodes(self) -> bool:
        """Training jobs hold every GPU of their nodes, used or not (--exclusive)."""
        return self.exclusive and not self.is_local and self.gpus_per_node is not None

    def held_devices(self, num_nodes: int, world_size: int) -> int:
        """The GPUs a training job of this shape holds, and is billed for: its ranks, or its
        nodes' every GPU with site_exclusive."""
        return num_nodes * self.gpus_per_node if self.whole_nodes else world_size


def refuse_slurm_extra(resources: dict, where: str) -> None:
    """A profile's own slurm_extra for train or probe would silently replace the per-topology one."""
    if "slurm_extra" in resources:
        raise SiteError(
            f"{where}: slurm_extra would replace the flags ddpscale sets for each topology "
            f"(--ntasks-per-node, --signal, --exclusive); put your own sbatch flags in "
            f"site_slurm_extra of set-resources train instead"
        )


def shared_resources(resources: dict) -> dict:
    """What a profile's set-resources `train` gives every training stage besides the site facts
    (runtime, partition, QOS...): set on each stage rule, below its own set-resources entry."""
    return {key: value for key, value in resources.items() if not key.startswith(SITE_PREFIX)}


def check_stage_entry(rule: str, resources: dict) -> None:
    """A stage's own set-resources entry may set any resource but the site facts (they stay in
    `train`, one place for every stage) and slurm_extra (it would drop the per-topology flags)."""
    where = f"profile set-resources {rule}"
    refuse_slurm_extra(resources, where)
    misplaced = sorted(key for key in resources if key.startswith(SITE_PREFIX))
    if misplaced:
        raise SiteError(f"{where}: {', '.join(misplaced)} is a site fact; site facts hold for every "
                        f"stage, so set them once, under set-resources train")


def site_from_resources(resources: dict, where: str = "profile set-resources train") -> Site:
    """Build a Site from the `site_*` entries of a profile's set-resources `train`."""
    known = {f.name for f in fields(Site)}
    refuse_slurm_extra(resources, where)
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
    # Snakemake passes a profile's resources on as text: `site_exclusive: false` arrives as "False"
    for flag in FLAG_FACTS:
        if isinstance(values.get(flag), str) and values[flag].lower() in ("true", "false"):
            values[flag] = values[flag].lower() == "true"
    site = Site(**values)
    for name in ("cpus_per_gpu", "mem_mb_per_gpu", "gpus_per_node"):
        value = getattr(site, name)
        if name == "gpus_per_node" and value is None:
            continue
        # bool is an int in Python; `site_cpus_per_gpu: true` would become --cpus-per-task=True
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise SiteError(f"{where}: {SITE_PREFIX}{name} must be an integer >= 1 (got {value!r})")
    if (isinstance(site.signal_s, bool) or not isinstance(site.signal_s, int)
            or not 0 <= site.signal_s <= SIGNAL_MAX_S):
        raise SiteError(f"{where}: {SITE_PREFIX}signal_s must be an integer from 0 to {SIGNAL_MAX_S} (sbatch "
                        f"--signal's limit), seconds before the time limit (0: no signal) (got {site.signal_s!r})")
    if site.gpu_type is not None and not (isinstance(site.gpu_type, str) and GPU_TYPE.fullmatch(site.gpu_type)):
        raise SiteError(f"{where}: {SITE_PREFIX}gpu_type {site.gpu_type!r} is not a GRES type: write letters, "
                        f"digits, _ and . only, as `sinfo -o %G` lists it (e.g. a100)")
    for flag in FLAG_FACTS:
        if not isinstance(getattr(site, flag), bool):
            raise SiteError(f"{where}: {SITE_PREFIX}{flag} must be true or false (got {getattr(site, flag)!r})")
    if site.multi_node_whole_nodes and site.gpus_per_node is None:
        raise SiteError(f"{where}: {SITE_PREFIX}multi_node_whole_nodes needs {SITE_PREFIX}gpus_per_node, "
                        f"the GPUs of a whole node")
    if site.launcher not in LAUNCHERS:
        raise SiteError(f"{where}: {SITE_PREFIX}launcher must be one of {', '.join(LAUNCHERS)}, how the ranks start "
                        f"(got {site.launcher!r})")
    problem = env_problem(site.env) or slurm_extra_problem(site.slurm_extra)
    if problem:
        raise SiteError(f"{where}: {problem}")
    if site.interconnect not in INTERCONNECTS:
        raise SiteError(f"{where}: {SITE_PREFIX}interconnect must be one of {', '.join(INTERCONNECTS)}, the "
                        f"network between the nodes (got {site.interconnect!r})")
    return site


def env_words(env: str) -> list[str]:
    """site_env as its NAME=VALUE words (shell quoting as written is read)."""
    return shlex.split(env)


def env_problem(env) -> str | None:
    """Why site_env is not NAME=VALUE pairs separated by spaces, or None."""
    fix = 'write NAME=VALUE pairs separated by spaces, e.g. "NCCL_SOCKET_IFNAME=ib0 NCCL_IB_HCA=mlx5_0"'
    if not isinstance(env, str):
        return f"{SITE_PREFIX}env must be a string: {fix} (got {env!r})"
    if CONTROL_CHARACTER.search(env):
        return f"{SITE_PREFIX}env {env!r} holds a control character (a newline?); {fix}"
    try:
        words = env_words(env)
    except ValueError as err:
        return f"{SITE_PREFIX}env {env!r} cannot be read as shell words ({err}); {fix}"
    for word in words:
        name, equals, _ = word.partition("=")
        if not equals or not ENV_NAME.fullmatch(name):
            return f"{SITE_PREFIX}env {env!r}: {word!r} is not NAME=VALUE with NAME a variable name; {fix}"
    return None


# sbatch's options: those of SLURM 22.05's `man sbatch` (the test cluster's), and the few later
# releases added (--container-id, --extra, --oom-kill-step, --segment, --tres-bind,
# --tres-per-task). A misspelt option passed the dry run and failed at submission, after the
# data was prepared and the baseline queued.
SBATCH_LONG = frozenset("""
account acctg-freq array batch bb bbf begin chdir cluster-constraint clusters comment constraint
container container-id contiguous core-spec cores-per-socket cpu-freq cpus-per-gpu cpus-per-task
deadline delay-boot dependency distribution error exclude exclusive export export-file extra
extra-node-info get-user-env gid gpu-bind gpu-freq gpus gpus-per-node gpus-per-socket gpus-per-task
gres gres-flags help hint hold ignore-pbs input job-name kill-on-invalid-dep licenses mail-type
mail-user mcs-label mem mem-bind mem-per-cpu mem-per-gpu mincpus network nice no-kill no-requeue
nodefile nodelist nodes ntasks ntasks-per-core ntasks-per-gpu ntasks-per-node ntasks-per-socket
oom-kill-step open-mode output overcommit oversubscribe parsable partition power prefer priority
profile propagate qos quiet reboot requeue reservation segment signal sockets-per-node spread-job
switches test-only thread-spec threads-per-core time time-min tmp tres-bind tres-per-task uid usage
use-min-nodes verbose version wait wait-all-nodes wckey wrap
""".split())
SBATCH_SHORT = frozenset("ABCDFGHJLMNOQSVWabcdehikmnopqstvwx")


def unknown_sbatch_options(flags: str) -> list[str]:
    """The words of site_slurm_extra that name no sbatch option (a word without a dash is the
    value of the option before it: `--gpu-bind none`)."""
    unknown = []
    for word in flags.split():
        if word.startswith("--"):
            if word[2:].partition("=")[0] not in SBATCH_LONG:
                unknown.append(word)
        elif word.startswith("-") and (len(word) < 2 or word[1] not in SBATCH_SHORT):
            unknown.append(word)
    return unknown


def slurm_extra_problem(flags, name: str = f"{SITE_PREFIX}slurm_extra") -> str | None:
    """Why site_slurm_extra (or a profile's slurm_extra for another rule: name) is not plain sbatch
    flags, or None. The SLURM plugin runs sbatch through a shell with these flags as written: `;`,
    `$(...)` or a newline there would run on the login node, and a quote would swallow the flags
    after it."""
    if not isinstance(flags, str):
        return f"{name} must be a string of sbatch flags (got {flags!r})"
    bad = sorted(set(SBATCH_TEXT.sub("", flags)))
    if bad:
        return (f"{name} {flags!r} holds {' '.join(map(repr, bad))}, which sbatch flags do not need "
                "and a shell would read; write flags of letters, digits and . , : @ % / + = - separated by spaces, "
                'e.g. "--gpu-bind=none --hint=nomultithread"')
    if flags.strip() and not flags.strip().startswith("-"):
        return f"{name} {flags!r} must start with a flag (-x or --name)"
    if unknown := unknown_sbatch_options(flags):
        word = unknown[0]
        hint = closest(word.lstrip("-").partition("=")[0], SBATCH_LONG) if word.startswith("--") else ""
        hint = hint.replace("did you mean '", "did you mean '--")
        return (f"{name} {flags!r}: {word!r} is not an sbatch option{hint or ''}"
                "; `man sbatch` on your site lists them")
    return None


def signal_problem(site: Site, minutes: int | None) -> str | None:
    """Why a training job of `minutes` (its time limit; None: the partition's) cannot get the
    site_signal_s warning, or None: SLURM would signal it at once, and every run would stop to
    save a checkpoint as soon as it starts."""
    if site.is_local or not site.signal_s or minutes is None or site.signal_s < minutes * 60:
        return None
    return (f"{SITE_PREFIX}signal_s {site.signal_s} s is not below the job's time limit of {minutes * 60} s, so "
            "SLURM would signal every run as it starts; lower site_signal_s or raise the runtime")


def cluster_launched(topo: Topology, site: Site) -> bool:
    """Whether the ranks form a process group under SLURM (the `mpi` resource, Lightning's
    SLURMEnvironment); a 1-rank cluster run is still an srun task (launch_prefix), alone."""
    return topo.world_size > 1 and not site.is_local


def slurm_resources(topo: Topology, site: Site) -> dict:
    """The plugin resources of one training job.

    Facts of plugin 2.8.0 this relies on:
    - the jobstep plugin (0.6.1) runs the shell in the batch step whenever the job has an
      `mpi` resource at all (it tests the key, not the value), and the shell starts the ranks
      itself with srun (launch_prefix); without the key it would wrap the job in `srun -n1`,
      which trains a multi-node topology on one rank and "succeeds";
    - the plugin refuses a truthy `mpi` with tasks == 1, so the baseline's is empty (still a key);
    - with a gpu gres the plugin adds --ntasks-per-gpu from `tasks` unless tasks_per_gpu=0,
      which breaks M nodes x 1 GPU; `gres` is per node, unlike `gpu` (a job-wide total).
    """
    gres = f"gpu:{site.gpu_type}:{topo.devices_per_node}" if site.gpu_type else f"gpu:{topo.devices_per_node}"
    return {
        "slurm_extra": slurm_extra(topo, site),
        "nodes": topo.num_nodes,
        "tasks": topo.world_size,
        "tasks_per_gpu": 0,
        "gres": gres,
        "cpus_per_task": site.cpus_per_gpu,
        # --mem is per node: one rank per device on each node.
        "mem_mb": site.mem_mb_per_gpu * topo.devices_per_node,
        "mpi": site.launcher if cluster_launched(topo, site) else "",
    }


def slurm_extra(topo: Topology, site: Site) -> str:
    """The sbatch flags of one training job that the plugin has no resource for.

    - --ntasks-per-node: the plugin asks for --nodes=M --ntasks=M*N only, and SLURM may then
      place 7 + 1 tasks on nodes with room; the step (srun --ntasks-per-node=N) and Lightning
      need N on every node. Plugin 2.8.0 appends slurm_extra to its own flags and refuses
      only flags it sets itself (--ntasks, --nodes, ...; validation.py), not this one.
    - --signal=USR1@s: SLURM signals the job's steps s seconds before the limit, never the
      batch step, where the plugin runs Snakemake and the shell: so every rank, the 1-rank
      baseline's too, is an srun task (launch_prefix), else the warning reaches no one.
    - --exclusive: whole nodes (site_exclusive).
    A local site has no scheduler: nothing.
    """
    if site.is_local:
        return ""
    flags = [f"--ntasks-per-node={topo.devices_per_node}"]
    if site.signal_s:
        flags.append(f"--signal=USR1@{site.signal_s}")
    if site.exclusive:
        flags.append("--exclusive")
    if site.slurm_extra.strip():
        flags.append(site.slurm_extra.strip())
    return " ".join(flags)


def launch_prefix(topo: Topology, site: Site, python: str, gpu_ids: list[str] | None = None) -> str:
    """The command that starts every rank of a topology, to be followed by the script and flags.

    All counts are explicit: under SLURM the plugin's jobstep strips SLURM_* variables before
    the shell runs, and Lightning's SLURMEnvironment needs --ntasks-per-node == devices.

    Local site: gpu_ids are the GPUs this host hands out (ddpscale.run.hostdevices). Absent, the
    run is CPU-simulated and its ranks see no GPU (CUDA_VISIBLE_DEVICES empty), so CUDA is
    never initialised; given, the local launcher gives each simulated node its own. A
    cluster's ranks get their GPUs from the allocation.
    """
    # each NAME=VALUE quoted: a value is text for env, never shell syntax (env_problem)
    variables = [shlex.quote(word) for word in env_words(site.env)]
    if not site.is_local:
        if gpu_ids is not None:
            raise ValueError("gpu_ids are for the local launcher; under SLURM the allocation sets the GPUs")
    elif gpu_ids is None:
        variables.append("CUDA_VISIBLE_DEVICES=")
    elif len(gpu_ids) < topo.world_size:
        raise ValueError(f"{topo.name} needs {topo.world_size} GPUs, one per rank; got {len(gpu_ids)}")
    env = f"env {' '.join(variables)} " if variables else ""
    if site.is_local:
        # One rank too goes through the launcher: it holds the machine's lock while its ranks
        # run (ddpscale.job.launch.machinelock), and every topology starts the same way.
        gpus = "" if gpu_ids is None else f"--gpu-ids {shlex.quote(','.join(gpu_ids[:topo.world_size]))} "
        return (
            f"{env}{shlex.quote(python)} scripts/launch_local.py --nodes {topo.num_nodes} "
            f"--procs-per-node {topo.devices_per_node} {gpus}-- {shlex.quote(python)}"
        )
    # One rank too is an srun task: the batch step, where it would otherwise run, never gets
    # the --signal warning (slurm_extra), and --kill-on-bad-exit reports its exit as srun's.
    srun = (f"{site.launcher} --nodes={topo.num_nodes} --ntasks-per-node={topo.devices_per_node} "
            f"--cpus-per-task={site.cpus_per_gpu} --kill-on-bad-exit=1 {shlex.quote(python)}")
    if topo.world_size == 1:
        return f"{env}{srun}"
    # sbatch exports the submitting shell's environment (--export=ALL), so a MASTER_ADDR or
    # MASTER_PORT set there would reach every job, and Lightning's default port (the job id's
    # last 4 digits) is shared by jobs 10000 apart. The batch step runs on the first node, where
    # rank 0 listens: it picks a port free there (scripts/master_port.py) and srun passes it on.
    port = f'MASTER_PORT="$({shlex.quote(python)} scripts/master_port.py)"'
    return f"env -u MASTER_ADDR {' '.join(variables + [port])} {srun}"


def cluster_env(topo: Topology, site: Site) -> str:
    """Which Lightning cluster environment the ranks must use (never guessed from variables)."""
    if cluster_launched(topo, site):
        return "slurm"
    return "local"


def run_accelerator(configured: str, site: Site) -> str:
    """The --accelerator of a site's runs. Local: as resolved for this host (`cpu` simulates
    devices). A cluster: `auto` means the GPU, so a node whose torch cannot start CUDA stops the
    run in one line (ddpscale.job.device.gpu) instead of Lightning training on its CPU without a word;
    only an explicit `cpu` (a test cluster without GPUs) trains on the nodes' CPUs."""
    if site.is_local or configured == "cpu":
        return configured
    return "gpu"
