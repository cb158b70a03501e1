# The config, the site and the topologies, checked while the workflow is parsed, so a bad
# config or an impossible topology stops before any job is submitted; and the helpers every
# rule file uses. The helpers of one rule file are in common_<file>.smk (functions only).
import json
import os
import shlex
import sys

from snakemake.exceptions import WorkflowError

# scripts/ddpscale is on sys.path (the Snakefile puts it there before reading the config); the
# config itself is read and checked in common_config.smk, included first.
from ddpscale.plan.configcheck import (  # noqa: E402
    file_problems,
    setting_problems,
)

from ddpscale.plan.hostdevices import (  # noqa: E402
    AcceleratorError,
    choose_accelerator,
    oversubscription_warning,
    usable_cores,
    visible_gpus,
)
from ddpscale.plan.resources import (  # noqa: E402
    SITE_PREFIX,
    SiteError,
    check_stage_entry,
    launch_prefix,
    shared_resources,
    site_from_resources,
    slurm_resources,
)
from ddpscale.plan.pluginstates import wrap_status_query  # noqa: E402
from ddpscale.plan.resourcenames import profile_file, resource_problems, slurm_extra_problems  # noqa: E402
from ddpscale.core.topology import (  # noqa: E402
    STAGE_RULES,
    TopologyError,
    check_topologies,
    name_pattern,
    parse_topology,
    stage_topologies,
)
from ddpscale.core import measuremode  # noqa: E402
from ddpscale.core.io import last_nonempty_line, read_json_dict, write_json_atomic  # noqa: E402
from ddpscale.core.layout import LEGACY_RUNS, experiment_name, layout, legacy_note, other_workload  # noqa: E402
from ddpscale.plan.identity import generated_with_other_settings, installed_versions  # noqa: E402
from ddpscale.plan import contractfacts  # noqa: E402
from ddpscale.plan.contract import owned_init_args  # noqa: E402
from ddpscale.plan.contract import problems as contract_problems  # noqa: E402
from ddpscale.plan.plugins import PluginError, check_importable  # noqa: E402
from ddpscale.plan.spiral import corruption, manifest_path_for  # noqa: E402

# Each experiment writes to results/<experiment>/ (ddpscale.core.layout): another config never
# replaces this one's runs or report.
EXPERIMENT = experiment_name(config)
LAYOUT = layout(config)
DATA_DIR = LAYOUT.data
RUNS_DIR = LAYOUT.runs
REPORT_DIR = LAYOUT.report
print(f"ddpscale: experiment {EXPERIMENT}: results in {LAYOUT.root}/", file=sys.stderr)
if Path(LEGACY_RUNS).is_dir():
    print(f"ddpscale: note: {legacy_note(EXPERIMENT)}", file=sys.stderr)


def check_experiment_folder():
    """Finished runs of another model or data module in this folder: stop, rather than let
    Snakemake delete them to rerun (the experiment's name is what keeps two workloads apart)."""
    records = {}
    for path in Path().glob(LAYOUT.metrics("*", "*")):
        try:
            records[str(path)] = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # unreadable: its rerun is Snakemake's to decide
    clash = other_workload(records, config["model"]["class_path"], config["data"]["class_path"])
    if clash:
        raise WorkflowError(
            f"{CONFIG_SOURCE}: {clash}; set `experiment:` to a new name for this workload (its results go "
            f"to results/<name>/), or delete {RUNS_DIR} to replace the runs there"
        )


# The interpreter running Snakemake (the venv); also the one inside SLURM jobs.
PYTHON = sys.executable
# torch and Lightning as installed (package metadata, no import)
INSTALLED_VERSIONS = installed_versions()


def as_written(resources):
    """Resources as the values the profile wrote (Snakemake keeps them as Resource objects)."""
    return {name: getattr(value, "raw", value) for name, value in resources.items()}


def profile_entry(rule):
    """A profile's set-resources entry for one rule, as the values the profile wrote."""
    return as_written(workflow.resource_settings.overwrite_resources.get(rule, {}))


def check_profile_resources():
    """Every resource name of the profile is one Snakemake or the SLURM plugin reads, and no
    placeholder is left (ddpscale.plan.resourcenames). Checked where the user started the
    workflow: a job's own snakemake gets the resources again, already checked."""
    if not workflow.is_main_process:
        return
    settings = workflow.resource_settings
    entries = {"default-resources": as_written(settings.default_resources or {})}
    entries.update({f"set-resources {rule}": profile_entry(rule) for rule in settings.overwrite_resources})
    where = profile_file(sys.argv, os.environ)
    problems = [line for entry, values in entries.items() for line in resource_problems(where, entry, values)]
    extra = str(entries.get("set-resources train", {}).get(f"{SITE_PREFIX}slurm_extra", ""))
    if extra.strip():
        # the plugin's own list, so the check follows the installed plugin
        from snakemake_executor_plugin_slurm.validation import get_forbidden_slurm_options

        problems += slurm_extra_problems(where, "set-resources train", extra, get_forbidden_slurm_options())
    if problems:
        raise WorkflowError("\n".join(problems))


def plugin_reads_cancelled_jobs():
    """sacct's "CANCELLED by <uid>" is a failed state to the SLURM plugin too (ddpscale.plan.
    pluginstates): without this, a job cancelled with scancel is polled as running forever."""
    if not workflow.is_main_process:
        return
    try:
        import snakemake_executor_plugin_slurm as slurm_plugin
    except ImportError:  # no SLURM plugin: nothing to fix
        return
    if not wrap_status_query(slurm_plugin):
        print(
            "ddpscale: warning: this SLURM executor plugin has no query_job_status; a job cancelled "
            "with scancel may not be noticed (ddpscale is tested with the version in requirements.txt)",
            file=sys.stderr,
        )


def get_site():
    """Site facts: the `site_*` entries of a profile's set-resources `train`, for every stage.

    Snakemake gives a resource callable no access to other resources, so the facts are read
    here, once, from the parsed command line (snakemake.settings.types.ResourceSettings).
    """
    try:
        for name in STAGE_RULES.values():
            check_stage_entry(name, profile_entry(name))
        return site_from_resources(profile_entry("train"))
    except SiteError as err:
        raise WorkflowError(str(err))


if "probe" in workflow.resource_settings.overwrite_resources:
    print(
        "ddpscale: warning: the profile's set-resources entry `probe` is unused now that the probe "
        "runs inside each topology's first training job; remove that entry",
        file=sys.stderr,
    )
check_profile_resources()
plugin_reads_cancelled_jobs()
# What set-resources `train` sets besides site facts (runtime, partition...), for every stage.
SHARED_TRAINING_RESOURCES = shared_resources(profile_entry("train"))
SITE = get_site()
# What each run measures (config measure): auto is throughput on a cluster, full locally.
MEASURE, MEASURE_WHY = measuremode.resolve(config["measure"], SITE.is_local)
print(f"ddpscale: measure {MEASURE} ({MEASURE_WHY})", file=sys.stderr)
try:
    TOPOLOGIES = check_topologies(
        config["topologies"],
        config["baseline"],
        SITE.gpus_per_node,
        config["batch"]["scaling"],
        config["batch"]["size"],
        multi_node_whole_nodes=SITE.multi_node_whole_nodes,
    )
    for key in ("model", "data"):
        # jobs run in this working directory and train.py imports from it first
        check_importable(
            config[key]["class_path"], f"{source((key, 'class_path'))}: {key}.class_path", root=os.getcwd()
        )
except (TopologyError, PluginError) as err:
    raise WorkflowError(str(err))
# The user's classes are imported (seconds: torch) in a process of their own while the checks
# below run, unless their files are unchanged since the last time (ddpscale.plan.contractfacts).
CONTRACT = contractfacts.start(
    PYTHON,
    str(Path(workflow.basedir).parent / "scripts/contract.py"),
    config["model"]["class_path"],
    config["data"]["class_path"],
    os.getcwd(),
    INSTALLED_VERSIONS,
)
# Keys that only work together, and a generated dataset too small for a batch of every topology.
SETTING_PROBLEMS = setting_problems(config, TOPOLOGIES, CONFIG_SOURCE) + file_problems(
    config, CONFIG_SOURCE, os.path.exists
)
if SETTING_PROBLEMS:
    raise WorkflowError("\n".join(SETTING_PROBLEMS))


def check_contract():
    """The modules keep the contract (docs/your-model.md): classes that import, are what
    they must be, and take what the config and the workflow give them; refused here, not in a job."""
    try:
        facts = contractfacts.finish(CONTRACT)
    except ValueError as err:
        raise WorkflowError(f"{source(('model', 'class_path'))}: {err}")
    problems = owned_init_args(config, source) + contract_problems(facts, config, source)
    if problems:
        raise WorkflowError("\n".join(problems))


check_contract()
# after the config's own mistakes: a misspelt class path is named as that, not as a clash
check_experiment_folder()


def resolve_accelerator():
    """The accelerator every run uses, the GPU ids the local launcher hands out (or None) and
    each local rank's CPU threads (or None: a cluster rank gets its cpus-per-task).

    Local profile: decided once, here, from this host (ddpscale.plan.hostdevices): `auto` is GPU
    only when every topology's M x N ranks get a GPU each (simulated nodes share this host),
    else CPU for all, so a report never mixes the two. A cluster's GPUs come from the
    allocation, so other profiles keep the configured value here; each run's flag then asks
    for the GPU where that is `auto` (run_accelerator, common_train.smk).
    """
    if not SITE.is_local:
        return config["accelerator"], None, None
    gpus, cores = visible_gpus(), usable_cores()
    decision = choose_accelerator(config["accelerator"], TOPOLOGIES, gpus.count, cores, source=gpus.source)
    if decision.note:
        print(f"ddpscale: {decision.note}", file=sys.stderr)
    if decision.oversubscribed:
        print(f"ddpscale: warning: {oversubscription_warning(decision.oversubscribed, cores)}", file=sys.stderr)
    gpu_ids = list(gpus.ids) if decision.accelerator == "gpu" else None
    return decision.accelerator, gpu_ids, decision.threads


try:
    ACCELERATOR, GPU_IDS, LOCAL_THREADS = resolve_accelerator()
except AcceleratorError as err:
    raise WorkflowError(str(err))
GENERATED = config["dataset"]["generator"] != "none"

TOPOLOGY_NAMES = [t.name for t in TOPOLOGIES]
# config repeats, auto resolved by what the runs measure (3 in throughput mode, 1 in full)
REPEATS = list(range(measuremode.repeats(config["repeats"], MEASURE)))


def write_plan():
    """What this site resolved (measure, repeats), for make status, which cannot see the site
    and so cannot resolve repeats: auto. Written when jobs start (onstart), never by a dry run or
    a refused config, and only when it changes, so nothing in results/ is touched for nothing."""
    plan = {"measure": MEASURE, "repeats": len(REPEATS)}
    path = Path(LAYOUT.plan)
    if read_json_dict(path) == plan:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, plan)


# {stage: its topology names}: rule train_<stage> trains exactly these (wildcard constraints)
STAGE_TOPOLOGIES = stage_topologies(TOPOLOGIES, config["baseline"])
STAGE_PATTERNS = {stage: name_pattern(names) for stage, names in STAGE_TOPOLOGIES.items()}


wildcard_constraints:
    topology=r"\d+x\d+",
    repeat=r"\d+",
    generator=r"spiral",  # the built-in generators (schema: dataset.generator)


def get_metrics(topologies):
    return expand(LAYOUT.metrics("{topology}", "{repeat}"), topology=topologies, repeat=REPEATS)


def get_all_metrics(wildcards):
    return get_metrics(TOPOLOGY_NAMES)


def get_stage_metrics(stage):
    return get_metrics(STAGE_TOPOLOGIES[stage])


def finished(paths):
    return [path for path in paths if Path(path).exists()]


def as_flags(flags):
    return " ".join(f"{flag} {shlex.quote(str(value))}" for flag, value in flags.items())
