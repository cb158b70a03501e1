# Helpers of rules/train.smk: what each training job gets: its allocation, launch command
# and flags.
import functools

from ddpscale.core import measuremode  # noqa: E402
from ddpscale.plan.resources import run_accelerator  # noqa: E402
from ddpscale.core.topology import batch_per_device  # noqa: E402
from ddpscale.plan.squeue import live_training_job, query_squeue  # noqa: E402
from ddpscale.plan.ddpsettings import DEFAULTS as DDP_DEFAULTS  # noqa: E402
from ddpscale.plan.ddpsettings import flag as ddp_flag  # noqa: E402


def get_resources(wildcards):
    return slurm_resources(parse_topology(wildcards.topology), SITE)


def get_nodes(wildcards):
    return get_resources(wildcards)["nodes"]


def get_tasks(wildcards):
    return get_resources(wildcards)["tasks"]


def get_gres(wildcards):
    return get_resources(wildcards)["gres"]


def get_cpus_per_task(wildcards):
    return get_resources(wildcards)["cpus_per_task"]


def get_mem_mb(wildcards):
    return get_resources(wildcards)["mem_mb"]


def get_mpi(wildcards):
    return get_resources(wildcards)["mpi"]


def get_slurm_extra(wildcards):
    return get_resources(wildcards)["slurm_extra"]


# The allocation of one topology, then what the profile's `train` entry sets for every stage
# (it wins, as set-resources did before there were stages); a stage's own entry wins over both.
TRAINING_RESOURCES = {
    **dict(
        nodes=get_nodes,
        tasks=get_tasks,
        tasks_per_gpu=0,
        gres=get_gres,
        cpus_per_task=get_cpus_per_task,
        mem_mb=get_mem_mb,
        mpi=get_mpi,
        slurm_extra=get_slurm_extra,
    ),
    **SHARED_TRAINING_RESOURCES,
}


def get_attempt(wildcards, attempt):
    return attempt


def get_launch(wildcards):
    check_site_matches_executor()
    check_no_earlier_job(wildcards)
    return launch_prefix(parse_topology(wildcards.topology), SITE, PYTHON, GPU_IDS)


@functools.cache
def earlier_jobs():
    """This user's SLURM jobs before this snakemake submitted any: read once, at the first job
    built, so its own jobs (retries too) are never taken for an earlier one."""
    jobs, _ = query_squeue()
    return jobs or []


def check_no_earlier_job(wildcards):
    """A job of the same run still live from an earlier snakemake (a dropped SSH session) would
    share the run's checkpoint with the new one: stop before submitting (docs/clusters.md)."""
    plugin = workflow.executor_plugin
    # Only where the user started snakemake: inside the job, its jobstep snakemake would find
    # the job itself in squeue.
    if not workflow.is_main_process or plugin is None or not plugin.common_settings.non_local_exec:
        return
    line = live_training_job(earlier_jobs(), os.path.realpath(os.getcwd()), wildcards.topology, int(wildcards.repeat))
    if line:
        raise WorkflowError(line)


def check_site_matches_executor():
    """A cluster executor with no site facts would start every rank on one node.

    Happens when --set-resources on the command line replaces the profile's. The executor is
    only known once execution starts, so this runs when jobs are built, before submission.
    """
    plugin = workflow.executor_plugin
    if plugin is not None and plugin.common_settings.non_local_exec and SITE.is_local:
        raise WorkflowError(
            "set-resources train has no site facts (site_launcher, site_gpus_per_node, ...) but jobs go "
            "to a cluster executor. If you passed --set-resources on the command line, it replaced "
            "the profile's: repeat the profile's site_* entries for train there"
        )


def run_flags(topology_name):
    """Every setting that defines a run, the same for each of its repeats."""
    topo = parse_topology(topology_name)
    flags = {
        "--topology": topo.name,
        "--nodes": topo.num_nodes,
        "--devices": topo.devices_per_node,
        # resolved for this host on the local profile: the flag, and so the checkpoint's
        # fingerprint, says what the run used; a cluster's runs ask for the GPU (run_accelerator)
        "--accelerator": run_accelerator(ACCELERATOR, SITE),
        "--cluster-env": cluster_env(topo, SITE),
        # Locally one simulated device is one core (a 1-device run must not get every core, or
        # adding devices would add no hardware) and a GPU its share of the cores (hostdevices)
        "--threads": LOCAL_THREADS if SITE.is_local else SITE.cpus_per_gpu,
        "--seed": config["seed"],
        "--scaling": config["batch"]["scaling"],
        "--batch-size": config["batch"]["size"],
        "--precision": config["precision"],
        "--compile": config["compile"],
        "--accumulate-grad-batches": config["accumulate_grad_batches"],
        # how a dead or stuck rank ends the job; not part of the run's identity
        "--collective-timeout-s": config["collective_timeout_s"],
        "--compile-timeout-s": config["compile_timeout_s"],
        "--loader": json.dumps(config["dataloader"], sort_keys=True),
        "--model-class": config["model"]["class_path"],
        "--model-args": json.dumps(config["model"]["init_args"], sort_keys=True),
        "--data-class": config["data"]["class_path"],
        "--data-args": json.dumps(config["data"]["init_args"], sort_keys=True),
        # what the run measures, and in throughput mode when it stops (ddpscale.job.windows)
        "--measure": MEASURE,
        "--window-steps": config["throughput"]["window_steps"],
    }
    if MEASURE == measuremode.THROUGHPUT:
        flags["--target-precision"] = config["throughput"]["precision"]
        flags["--min-windows"] = config["throughput"]["min_windows"]
        for key, flag in (("max_steps", "--measure-max-steps"), ("max_minutes", "--measure-max-minutes")):
            if config["throughput"][key] is not None:
                flags[flag] = config["throughput"][key]
    if GENERATED:
        flags["--data-file"] = get_data_file()
    if config["batch"]["dim"]:  # only where set: every other config's runs keep their flags
        flags["--batch-dim"] = config["batch"]["dim"]
    if config["data"]["files"]:  # checksummed into the run's identity
        flags["--data-files"] = json.dumps(config["data"]["files"])
    # a LightningCLI config's Trainer arguments and optimizers (only where it has them: the flags of
    # every other config, and so its finished runs, stay as they were)
    if LIGHTNING and LIGHTNING.trainer_args:
        flags["--trainer-args"] = json.dumps(LIGHTNING.trainer_args, sort_keys=True)
    # DDP's settings, only where they are not torch's defaults (likewise): they change what is
    # measured, so a change reruns every run (the 1-device run records them as unused)
    if config["ddp"] != DDP_DEFAULTS:
        flags["--ddp"] = ddp_flag(config["ddp"])
    if LIGHTNING and LIGHTNING.optimizers:
        flags["--optimizers"] = json.dumps(LIGHTNING.optimizers, sort_keys=True)
    if LIGHTNING and LIGHTNING.loggers is not None:
        flags["--loggers"] = json.dumps(LIGHTNING.loggers, sort_keys=True)
    return flags


def get_run_identity(wildcards):
    """What defines a run beyond its flags, as a param so that a change reruns it.

    The generated data is an ancient() input (a byte-identical regeneration must not rerun
    finished measurements), so its settings must trigger the rerun here; so must another
    torch or Lightning, read from package metadata (no import: parsing stays fast). The data's
    checksum and the training code are checked by train.py and the report (docs/reliability.md, "Resume and run identity").
    """
    return json.dumps(
        {"dataset": config["dataset"] if GENERATED else None, "versions": INSTALLED_VERSIONS}, sort_keys=True
    )


def get_train_flags(wildcards):
    """Every setting of a run as explicit flags, so the log shows exactly what ran."""
    flags = run_flags(wildcards.topology)
    flags.update(
        {
            "--repeat": wildcards.repeat,
            "--max-epochs": config["max_epochs"],
            "--warmup-epochs": config["warmup_epochs"],
            "--ckpt-dir": LAYOUT.checkpoint_dir(flags["--topology"], wildcards.repeat),
        }
    )
    # for the report's check of the transport NCCL chose; only where the profile states it, so
    # the commands of every other site (and so their finished runs) stay as they were
    if SITE.interconnect != "unknown":
        flags["--site-interconnect"] = SITE.interconnect
    # what the job is billed for, where the site gives it whole nodes (only there, so every
    # other site's commands stay as they were)
    if SITE.whole_nodes:
        topo = parse_topology(wildcards.topology)
        flags["--held-devices"] = SITE.held_devices(topo.num_nodes, topo.world_size)
    # a cluster job holds its devices from the job's start, whatever ran before train.py; the
    # 1-device run has no SLURM process group (cluster_env local), so train.py is told
    held = "" if SITE.is_local else " --held-from-job"
    # the first repeat probes its topology before training, in the same allocation
    if wildcards.repeat != "0":
        return as_flags(flags) + held
    probe = held + " --probe"
    if flags["--topology"] == parse_topology(config["baseline"]).name:
        # the baseline's probe times its compute at every topology's per-device batch: the
        # prediction of each topology starts from the baseline's compute at its batch
        probe += " --probe-batch-sizes " + ",".join(map(str, get_probe_batch_sizes()))
    return as_flags(flags) + probe


def get_probe_batch_sizes():
    """The per-device batches of the configured topologies, smallest first."""
    return sorted({batch_per_device(config["batch"]["scaling"], config["batch"]["size"], t) for t in TOPOLOGIES})


# The metric the report compares, for the log line at each run's first validation (train.py
# --accuracy-metric defaults to it). In the jobs' environment, not their flags: a flag is a
# param, whose change reruns the job, and choosing another metric must not retrain anything.
os.environ[ACCURACY_METRIC_ENV] = config["accuracy"]["metric"]
# The metric recorded after every epoch for time to accuracy (train.py --epoch-metric), the same way
os.environ[EPOCH_METRIC_ENV] = measuremode.epoch_metric(
    config["accuracy"]["metric"], config["accuracy"]["epoch_metric"]
)
