# What the benchmark reserves, printed by a dry run (`snakemake --profile profiles/<site> -n`)
# before anything is submitted: per training job its devices, time limit and GPU-hours, and the
# total (ddpscale.plan.reservation). Functions and one print; no rules.
from snakemake.resources import Resource

from ddpscale.plan import reservation  # noqa: E402


def runtime_minutes(resources):
    """The `runtime` of one profile entry in minutes, as Snakemake reads it ("2h" is 120);
    None where the entry sets none or sets an expression evaluated per job."""
    value = (resources or {}).get("runtime")
    if value is None:
        return None
    try:
        value = value if isinstance(value, Resource) else Resource("runtime", value)
    except WorkflowError:
        return None
    if value.is_evaluable() or not isinstance(value.value, int):
        return None
    return value.value


def get_stage_runtimes():
    """{train_<stage>: its time limit in minutes or None}, from the profile's resources."""
    settings = workflow.resource_settings
    overwrite = settings.overwrite_resources
    stages = {rule: runtime_minutes(overwrite.get(rule)) for rule in STAGE_RULES.values()}
    train, default = runtime_minutes(overwrite.get("train")), runtime_minutes(settings.default_resources)
    return {rule: reservation.stage_runtime(rule, stages, train, default) for rule in STAGE_RULES.values()}


def run_finished(topology, repeat):
    return Path(LAYOUT.metrics(topology, repeat)).exists()


def print_reservation():
    """On a dry run where the user started it: what the benchmark reserves, to stderr as the
    other ddpscale: lines. The Snakefile is read before Snakemake picks its executor, so the
    dry-run flag comes from the output settings (set from -n/--dry-run before parsing)."""
    settings = workflow.output_settings
    if settings is None or not settings.dryrun or not workflow.is_main_process:
        return
    jobs = reservation.training_jobs(
        STAGE_TOPOLOGIES,
        REPEATS,
        SITE,
        get_stage_runtimes(),
        run_finished,
    )
    for line in reservation.summary_lines(jobs, SITE, ACCELERATOR, MEASURE, config["throughput"]):
        print(line, file=sys.stderr)


print_reservation()
