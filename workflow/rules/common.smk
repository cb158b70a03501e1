# Every Python helper of the workflow. Checks run while the workflow is parsed, so a bad
# config or an impossible topology stops before any job is submitted.
import json
import os
import shlex
import sys

import yaml
from snakemake.exceptions import WorkflowError
from snakemake.utils import validate


def own_init_args(config, overrides):
    """A section's init_args come only from the file that names its class.

    Snakemake merges --configfile (and --config) into config/config.yaml key by key, so a preset
    that swaps the model (config/transformer.yaml) would inherit the SpiralMLP's `hidden` and
    the spiral data's `resident`, and every job would fail on an unexpected keyword.
    """
    for section in ("model", "data"):
        override = overrides.get(section) or {}
        if isinstance(override, dict) and "class_path" in override and isinstance(config.get(section), dict):
            init_args = override.get("init_args") or {}
            # anything but a mapping is left for the schema check to name
            config[section]["init_args"] = dict(init_args) if isinstance(init_args, dict) else init_args


# scripts/ddpscale is on sys.path (the Snakefile puts it there before reading the config).
from ddpscale.configcheck import config_source, file_problems, schema_problems, setting_problems  # noqa: E402

CONFIG_SOURCE = config_source(workflow.configfiles, os.getcwd())


def check_config_schema():
    """Snakemake's validate prints the whole schema and config for one bad key; say it in one line.

    validate() still runs after this: it fills in the schema's defaults.
    """
    schema = yaml.safe_load((Path(workflow.basedir) / "schemas/config.schema.yaml").read_text())
    problems = schema_problems(config, schema, CONFIG_SOURCE)
    if problems:
        raise WorkflowError("\n".join(problems))


own_init_args(config, workflow.config_settings.overwrite_config or {})
check_config_schema()
validate(config, schema="../schemas/config.schema.yaml")
from ddpscale.cluster.hostdevices import (  # noqa: E402
    AcceleratorError, choose_accelerator, oversubscription_warning, usable_cores, visible_gpus,
)
from ddpscale.cluster.resources import (  # noqa: E402
    SiteError, cluster_env, launch_prefix, refuse_slurm_extra, site_from_resources, slurm_resources,
)
from ddpscale.cluster.topology import TopologyError, check_topologies, parse_topology  # noqa: E402
from ddpscale.training.identity import generated_with_other_settings, installed_versions  # noqa: E402
from ddpscale.training.plugins import PluginError, check_importable  # noqa: E402
from ddpscale.workloads.spiral import corruption, manifest_path_for  # noqa: E402

DATA_DIR = "results/data"
RUNS_DIR = "results/runs"
REPORT_DIR = "results/report"
# The interpreter running Snakemake (the venv); also the one inside SLURM jobs.
PYTHON = sys.executable


def get_site():
    """Site facts: the `site_*` entries a profile sets on rule train via set-resources.

    Snakemake gives a resource callable no access to other resources, so the facts are read
    here, once, from the parsed command line (snakemake.settings.types.ResourceSettings).
    """
    entries = workflow.resource_settings.overwrite_resources.get("train", {})
    raw = {name: getattr(value, "raw", value) for name, value in entries.items()}
    try:
        refuse_slurm_extra(workflow.resource_settings.overwrite_resources.get("probe", {}),
                           "profile set-resources probe")
        return site_from_resources(raw)
    except SiteError as err:
        raise WorkflowError(str(err))


SITE = get_site()
try:
    TOPOLOGIES = check_topologies(
        config["topologies"], config["baseline"], SITE.gpus_per_node,
        config["batch"]["scaling"], config["batch"]["size"],
    )
    for key in ("model", "data"):
        # jobs run in this working directory and train.py imports from it first
        check_importable(config[key]["class_path"], f"config/config.yaml, {key}.class_path", root=os.getcwd())
except (TopologyError, PluginError) as err:
    raise WorkflowError(str(err))
# Keys that only work together, and a generated dataset too small for a batch of every topology.
SETTING_PROBLEMS = setting_problems(config, TOPOLOGIES, CONFIG_SOURCE) + file_problems(
    config, CONFIG_SOURCE, os.path.exists)
if SETTING_PROBLEMS:
    raise WorkflowError("\n".join(SETTING_PROBLEMS))


def resolve_accelerator():
    """The accelerator every run uses, and the GPU ids the local launcher hands out (or None).

    Local profile: decided once, here, from this host (ddpscale.cluster.hostdevices): `auto` is GPU
    only when every topology's M x N ranks get a GPU each (simulated nodes share this host),
    else CPU for all, so a report never mixes the two. A cluster's GPUs come from the
    allocation, so other profiles pass the configured value on unchanged.
    """
    if not SITE.is_local:
        return config["accelerator"], None
    gpus, cores = visible_gpus(), usable_cores()
    decision = choose_accelerator(config["accelerator"], TOPOLOGIES, gpus.count, cores, source=gpus.source)
    if decision.note:
        print(f"ddpscale: {decision.note}", file=sys.stderr)
    if decision.oversubscribed:
        print(f"ddpscale: warning: {oversubscription_warning(decision.oversubscribed, cores)}", file=sys.stderr)
    return decision.accelerator, (list(gpus.ids) if decision.accelerator == "gpu" else None)


try:
    ACCELERATOR, GPU_IDS = resolve_accelerator()
except AcceleratorError as err:
    raise WorkflowError(str(err))
GENERATED = config["dataset"]["generator"] != "none"

INSTALLED_VERSIONS = installed_versions()
TOPOLOGY_NAMES = [t.name for t in TOPOLOGIES]
REPEATS = list(range(config["repeats"]))
wildcard_constraints:
    topology=r"\d+x\d+",
    repeat=r"\d+",
    generator=r"spiral",  # the built-in generators (schema: dataset.generator)


def get_data_file():
    return f"{DATA_DIR}/{config['dataset']['generator']}/data.npz"


def get_prepare_flags():
    dataset = config["dataset"]
    data_file = get_data_file()
    return (f"--samples {dataset['samples']} --noise {dataset['noise']} --seed {dataset['seed']} "
            f"--split {' '.join(map(str, dataset['split']))} --out {data_file} "
            f"--manifest {manifest_path_for(data_file)}")


def check_generated_data():
    """Stop before any job when the dataset that finished runs used is missing or corrupt.

    Snakemake would regenerate it and rerun (first deleting) every finished run. The data is
    reproducible byte for byte, so regenerating it outside Snakemake keeps those runs.
    """
    data_file = Path(get_data_file())
    finished = [m for m in get_metrics(TOPOLOGY_NAMES) if Path(m).exists()]
    if data_file.exists():
        problem = corruption(str(data_file))
    elif finished:
        problem = f"data file {data_file} is missing but {len(finished)} finished run(s) used it"
    else:
        return
    if problem:
        raise WorkflowError(
            f"{problem.split('; ')[0]}. To regenerate the same bytes and keep finished runs: "
            f"rm -rf {data_file.parent} && {PYTHON} scripts/prepare_data.py {get_prepare_flags()}"
        )


def get_metrics(topologies):
    return expand(f"{RUNS_DIR}/{{topology}}/r{{repeat}}/metrics.json", topology=topologies, repeat=REPEATS)


def get_all_metrics(wildcards):
    return get_metrics(TOPOLOGY_NAMES)


def get_baseline_metrics(wildcards):
    return get_metrics([parse_topology(config["baseline"]).name])


def get_report_dir(wildcards, output):
    return str(Path(output.html).parent)


def get_all_probes(wildcards):
    return expand(f"{RUNS_DIR}/{{topology}}/probe.json", topology=TOPOLOGY_NAMES)


def get_compare_with(wildcards):
    """The earlier scaling.tsv to compare with (checked at parse time), or nothing."""
    path = config["report"]["compare_with"]
    return [path] if path else []


def finished(paths):
    return [path for path in paths if Path(path).exists()]


def get_finished_metrics(wildcards):
    """What a partial report is built from: every run that finished, none that did not."""
    done = finished(get_metrics(TOPOLOGY_NAMES))
    if not done:
        raise WorkflowError("no training run has finished yet, so there is nothing to report; "
                            "run the workflow (or its `baseline` target) first")
    return done


def get_finished_probes(wildcards):
    return finished(get_all_probes(wildcards))


def get_failures(wildcards):
    """The last line of each train log without metrics: a new failure reruns the partial report."""
    tails = {}
    for metrics in get_metrics(TOPOLOGY_NAMES):
        log = Path(metrics.replace(RUNS_DIR, "results/logs/train").replace("/metrics.json", ".log"))
        if not Path(metrics).exists() and log.exists():
            tails[str(log)] = log.read_text(errors="replace").strip().splitlines()[-1:]
    return json.dumps(tails, sort_keys=True)


def get_report_flags(wildcards):
    """The report's settings as explicit flags (inputs come separately)."""
    flags = {
        "--baseline": parse_topology(config["baseline"]).name,
        "--accuracy-metric": config["accuracy"]["metric"],
        "--accuracy-tolerance": config["accuracy"]["tolerance"],
        "--efficiency-threshold": config["report"]["efficiency_threshold"],
        "--repeats": config["repeats"],
        "--log-dir": "results/logs/train",
    }
    if config["report"]["compare_with"]:
        flags["--compare"] = config["report"]["compare_with"]
    return as_flags(flags) + " --expected " + " ".join(TOPOLOGY_NAMES)


def check_compare_with():
    path = config["report"]["compare_with"]
    if path and not Path(path).is_file():
        raise WorkflowError(
            f"config/config.yaml: report.compare_with is {path!r}, which is not a file; point it at "
            "a scaling.tsv from an earlier run (copy results/report/scaling.tsv before rerunning) "
            "or set it to null"
        )


check_compare_with()


def get_train_data(wildcards):
    """What a training run reads: the generated dataset, or the files the user's module reads.

    The generated dataset is ancient(): regenerated, it is byte-identical, and a rerun of
    prepare_data must not rerun (and first delete) finished measurements. Unless the dataset
    settings changed: then the data changes, and every run made from it must rerun. (The
    params trigger of get_run_identity cannot do it alone: Snakemake skips that check for a
    job downstream of a job that reruns, and an ancient input does not make it rerun.)
    """
    if not GENERATED:
        return config["data"]["files"]
    data_file = get_data_file()
    generated = [data_file, manifest_path_for(data_file)]
    if not generated_with_other_settings(manifest_path_for(data_file), config["dataset"]):
        generated = [ancient(path) for path in generated]
    return generated + config["data"]["files"]


if GENERATED:
    check_generated_data()


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


# The allocation of one topology, shared by its training runs and its probe.
TOPOLOGY_RESOURCES = dict(
    nodes=get_nodes, tasks=get_tasks, tasks_per_gpu=0, gres=get_gres,
    cpus_per_task=get_cpus_per_task, mem_mb=get_mem_mb, mpi=get_mpi, slurm_extra=get_slurm_extra,
)


def get_attempt(wildcards, attempt):
    return attempt


def get_launch(wildcards):
    check_site_matches_executor()
    return launch_prefix(parse_topology(wildcards.topology), SITE, PYTHON, GPU_IDS)


def check_site_matches_executor():
    """A cluster executor with no site facts would start every rank on one node.

    Happens when --set-resources on the command line replaces the profile's. The executor is
    only known once execution starts, so this runs when jobs are built, before submission.
    """
    plugin = workflow.executor_plugin
    if plugin is not None and plugin.common_settings.non_local_exec and SITE.is_local:
        raise WorkflowError(
            "rule train has no site facts (site_launcher, site_gpus_per_node, ...) but jobs go to "
            "a cluster executor. If you passed --set-resources on the command line, it replaced "
            "the profile's: repeat the profile's site_* entries for rule train there"
        )


def run_flags(topology_name):
    """Every setting that defines a run, shared by train and probe, so both measure the same."""
    topo = parse_topology(topology_name)
    flags = {
        "--topology": topo.name,
        "--nodes": topo.num_nodes,
        "--devices": topo.devices_per_node,
        # resolved for this host on the local profile: the flag, and so the checkpoint's
        # fingerprint, says what the run used
        "--accelerator": ACCELERATOR,
        "--cluster-env": cluster_env(topo, SITE),
        # Locally one simulated device is one core: a 1-device run must not get every core, or
        # adding devices would add no hardware and speedup would mean nothing.
        "--threads": 1 if SITE.is_local else SITE.cpus_per_gpu,
        "--seed": config["seed"],
        "--scaling": config["batch"]["scaling"],
        "--batch-size": config["batch"]["size"],
        "--precision": config["precision"],
        "--compile": config["compile"],
        "--accumulate-grad-batches": config["accumulate_grad_batches"],
        # how a dead or stuck rank ends the job; not part of the run's identity
        "--collective-timeout-s": config["collective_timeout_s"],
        "--loader": json.dumps(config["dataloader"], sort_keys=True),
        "--model-class": config["model"]["class_path"],
        "--model-args": json.dumps(config["model"]["init_args"], sort_keys=True),
        "--data-class": config["data"]["class_path"],
        "--data-args": json.dumps(config["data"]["init_args"], sort_keys=True),
    }
    if GENERATED:
        flags["--data-file"] = get_data_file()
    if config["data"]["files"]:  # checksummed into the run's identity
        flags["--data-files"] = json.dumps(config["data"]["files"])
    return flags


def get_run_identity(wildcards):
    """What defines a run beyond its flags, as a param so that a change reruns train and probe.

    The generated data is an ancient() input (a byte-identical regeneration must not rerun
    finished measurements), so its settings must trigger the rerun here; so must another
    torch or Lightning, read from package metadata (no import: parsing stays fast). The data's
    checksum and the training code are checked by train.py and the report (README, "Run identity").
    """
    return json.dumps({"dataset": config["dataset"] if GENERATED else None,
                       "versions": INSTALLED_VERSIONS}, sort_keys=True)


def as_flags(flags):
    return " ".join(f"{flag} {shlex.quote(str(value))}" for flag, value in flags.items())


def get_probe_flags(wildcards):
    return as_flags(run_flags(wildcards.topology))


def get_train_flags(wildcards):
    """Every setting of a run as explicit flags, so the log shows exactly what ran."""
    flags = run_flags(wildcards.topology)
    flags.update({
        "--repeat": wildcards.repeat,
        "--max-epochs": config["max_epochs"],
        "--warmup-epochs": config["warmup_epochs"],
        "--ckpt-dir": f"results/checkpoints/{flags['--topology']}/r{wildcards.repeat}",
    })
    return as_flags(flags)
