# Helpers of rules/train.smk: what each training job gets: its allocation, launch command
# and flags.
import functools

from ddpscale.plan import runspec  # noqa: E402
from ddpscale.plan.squeue import live_training_job, query_squeue  # noqa: E402


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


@functools.cache
def run_spec(topology, repeat):
    """One run's settings (ddpscale.plan.runspec), built once per topology and repeat."""
    return runspec.build(
        config,
        SITE,
        parse_topology(topology),
        int(repeat),
        topologies=TOPOLOGIES,
        measure=MEASURE,
        accelerator=ACCELERATOR,
        local_threads=LOCAL_THREADS,
        data_file=get_data_file() if GENERATED else None,
        lightning=LIGHTNING,
        layout=LAYOUT,
    )


def get_run_flags(wildcards):
    """The run's flags whose change reruns it: a param (every setting explicit, so the log shows
    what ran)."""
    return run_spec(wildcards.topology, wildcards.repeat).command(rerun=True)


def get_log_flags(wildcards):
    """The flags that only choose what the log names (the accuracy metric): as an object
    Snakemake cannot serialise, so it keeps no record of it and choosing another metric
    retrains nothing (test_any_logged_metric_is_compared_and_a_missing_one_is_said)."""
    return runspec.Unrecorded(run_spec(wildcards.topology, wildcards.repeat).command(rerun=False))


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
