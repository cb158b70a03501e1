# What the workflow does while it parses (ddpscale.plan.workflowplan): the config as the user wrote it
# (config/config.yaml, --configfile, --config, a LightningCLI config) checked, the profile read
# and checked, the plan of this experiment's runs (ddpscale.plan.runplan) built once, the user's
# modules checked against the contract, so a bad config, profile or module stops before any job
# is submitted. What only Snakemake knows (the config files, the profile's resources, the
# executor, the dry-run flag, on a dry run which jobs its DAG runs) is read here and handed over;
# then the get_* helpers every rule reads the plan through.
import functools
import json
import os
import sys
from pathlib import Path

from snakemake.common import NOTHING_TO_BE_DONE_MSG
from snakemake.exceptions import WorkflowError
from snakemake.logging import logger as snakemake_logger
from snakemake.utils import validate
from snakemake_interface_logger_plugins.common import LogEvent

# scripts/ddpscale is on sys.path (the Snakefile puts it there before reading the config).
from ddpscale.core.io import keep, last_nonempty_line, restore  # noqa: E402
from ddpscale.plan import planfile, workflowplan  # noqa: E402
from ddpscale.run import runspec  # noqa: E402
from ddpscale.plan.site.squeue import live_training_job, query_squeue  # noqa: E402

GIVEN = workflowplan.Given(
    configfiles=list(workflow.configfiles),
    overlays=list(workflow.config_settings.configfiles),
    overrides=workflow.config_settings.config,
    overwrite_config=workflow.config_settings.overwrite_config or {},
    default_resources=workflow.resource_settings.default_resources,
    overwrite_resources=workflow.resource_settings.overwrite_resources,
    main=workflow.is_main_process,
    argv=sys.argv,
    environ=os.environ,
    cwd=os.getcwd(),
    basedir=workflow.basedir,
    python=sys.executable,
)
try:
    # validate fills in the schema's defaults (after ddpscale has named any bad key in one line)
    PARSED = workflowplan.build(config, GIVEN, lambda data: validate(data, schema="../schemas/config.schema.yaml"))
except workflowplan.ParseError as err:
    raise WorkflowError(str(err))
PLAN, PROFILE = PARSED.plan, PARSED.profile


def print_reservation():
    """On a dry run where the user started it: what the benchmark reserves, to stderr as the
    other ddpscale: lines, counting the jobs Snakemake will run. Which those are is known once
    Snakemake has built its DAG, after this file is read: the lines come from a filter on
    Snakemake's logger as it writes the job table (or "Nothing to be done"), so they stand just
    before it. The dry-run flag comes from the output settings (set from -n before parsing)."""
    settings = workflow.output_settings
    if settings is None or not settings.dryrun or not workflow.is_main_process:
        return
    printed = []

    def before_job_table(record):
        if printed or not (getattr(record, "event", None) == LogEvent.RUN_INFO or record.msg == NOTHING_TO_BE_DONE_MSG):
            return True
        printed.append(record)
        for line in workflowplan.reservation_lines(PARSED, workflow.dag):
            print(line, file=sys.stderr)
        return True

    snakemake_logger.addFilter(before_job_table)


print_reservation()


def write_plan():
    """What this run planned (ddpscale.plan.planfile), for make status, which sees neither the
    site nor this command line's --configfile and --config. Written when jobs start (onstart),
    never by a dry run or a refused config, and only when it changes, so nothing in results/ is
    touched for nothing."""
    problem = planfile.write(PLAN.layout.plan, PLAN.record())
    if problem:
        snakemake_logger.warning(f"ddpscale: make status cannot show this run's plan: {problem}")


wildcard_constraints:
    topology=r"\d+x\d+",
    repeat=r"\d+",
    generator=r"spiral",  # the built-in generators (schema: dataset.generator)


# --- Targets ---


def get_all_metrics(wildcards):
    return PLAN.metrics()


def get_stage_metrics(stage):
    return PLAN.stage_metrics(stage)


# --- rules/data.smk ---


def get_prepare_flags():
    return PLAN.prepare_flags()


def get_train_data(wildcards):
    """What a training run reads: the generated dataset, or the files the user's module reads.

    The generated dataset is ancient(): regenerated, it is byte-identical, and a rerun of
    prepare_data must not rerun (and first delete) finished measurements. Unless the dataset
    settings changed: then the data changes, and every run made from it must rerun. (The
    params trigger of get_run_identity cannot do it alone: Snakemake skips that check for a
    job downstream of a job that reruns, and an ancient input does not make it rerun.)
    """
    generated = PLAN.generated_files
    if not PLAN.data_settings_changed():
        generated = [ancient(path) for path in generated]
    return generated + config["data"]["files"]


# --- rules/train.smk ---


def slurm_resource(name):
    def get(wildcards):
        return PLAN.resources(wildcards.topology)[name]

    return get


# The allocation of one topology, then what the profile's `train` entry sets for every stage
# (it wins, as set-resources did before there were stages); a stage's own entry wins over both.
TRAINING_RESOURCES = {
    **{name: slurm_resource(name) for name in ("nodes", "tasks")},
    "tasks_per_gpu": 0,
    **{name: slurm_resource(name) for name in ("gres", "cpus_per_task", "mem_mb", "mpi", "slurm_extra")},
    **PROFILE.shared,
}


def set_time_limits():
    """Each training stage's time limit as the plan sizes it (ddpscale.plan.cost.timelimit), called
    after the rules are defined: Snakemake applies the profile's set-resources last, so a stage
    entry's runtime would otherwise win over throughput mode's shorter limit."""
    try:
        limits = workflowplan.time_limits(PARSED, GIVEN)
    except workflowplan.ParseError as err:
        raise WorkflowError(str(err))
    for rule, minutes in limits.items():
        if minutes is not None:
            workflow.get_rule(rule).resources["runtime"] = minutes


def get_attempt(wildcards, attempt):
    return attempt


def get_launch(wildcards):
    check_site_matches_executor()
    check_no_earlier_job(wildcards)
    return PLAN.launch(wildcards.topology)


def writes_args():
    """Whether this snakemake writes the jobs' args files: the one the user started, when it
    runs jobs; a dry run writes nothing, and a cluster job's own snakemake reads what the
    user's wrote (train.py refuses a file whose digest is not the one in its command line)."""
    settings = workflow.output_settings
    return workflow.is_main_process and not (settings is not None and settings.dryrun)


def get_run_flags(wildcards):
    """The run's settings, inline or as their args file and digest (ddpscale.run.argsfile: they may
    be longer than a command line can be), unrecorded: get_run_settings is what reruns the job.
    train.py prints them all, so the log shows what ran."""
    return runspec.Unrecorded(PLAN.run_flags(wildcards.topology, wildcards.repeat, write=writes_args()))


def get_run_settings(wildcards):
    """The run's settings whose change reruns it, as Snakemake records them (a param the shell
    does not use; RunSpec.recorded)."""
    return PLAN.run_settings(wildcards.topology, wildcards.repeat)


def get_log_flags(wildcards):
    """The flags that only choose what the log names (the accuracy metric): as an object
    Snakemake cannot serialise, so it keeps no record of it and choosing another metric
    retrains nothing (test_any_logged_metric_is_compared_and_a_missing_one_is_said)."""
    return runspec.Unrecorded(PLAN.log_flags(wildcards.topology, wildcards.repeat))


def get_run_identity(wildcards):
    """What defines a run beyond its flags, as a param so that a change reruns it: the generated
    data's settings and the installed torch and Lightning (RunPlan.run_identity). The data's
    checksum and the training code are checked by train.py and the report (docs/reliability.md,
    "Resume and run identity")."""
    return PLAN.run_identity()


def check_site_matches_executor():
    """A cluster executor with no site facts would start every rank on one node (ddpscale.plan.workflowplan).

    The executor is only known once execution starts, so this runs when jobs are built, before
    submission.
    """
    plugin = workflow.executor_plugin
    if plugin is not None and (problem := workflowplan.executor_problem(PLAN, plugin.common_settings.non_local_exec)):
        raise WorkflowError(problem)


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


# --- rules/report.smk ---

REPORT_FIGURES = {
    "speedup": "Speedup vs ideal and predicted",
    "efficiency": "Parallel efficiency",
    "throughput": "Throughput per device",
    "breakdown": "Where a training step's time goes",
    "busbw": "All-reduce bus bandwidth",
}


def report_outputs(folder, registered):
    """Every file the report script writes; the full report registers them for --report."""

    def item(name, labels, category="Scaling"):
        path = f"{folder}/{name}"
        caption = f"../report/{name.split('.')[0]}.rst"
        return report(path, caption=caption, category=category, labels=labels) if registered else path

    out = {
        "table": item("scaling.tsv", {"table": "scaling"}),
        "breakdown_table": item("breakdown.tsv", {"table": "time breakdown"}),
        "prediction_table": item("prediction.tsv", {"table": "predicted vs measured"}),
        "projection_table": item("projection.tsv", {"table": "full training, projected"}),
        "tta_table": item("timetoacc.tsv", {"table": "time to accuracy"}),
    }
    for name, title in REPORT_FIGURES.items():
        out[name] = item(f"{name}.png", {"figure": title})
    # the same figures and the first screen's overview as SVG and PDF, for papers: report.html
    # links them, so Snakemake's own report, which holds the page alone, does not register them
    for name in ["overview", *REPORT_FIGURES]:
        for kind in ("svg", "pdf"):
            out[f"{name}_{kind}"] = f"{folder}/{name}.{kind}"
    # the page with the verdict, first in Snakemake's report too (report/workflow.rst points to it)
    out["html"] = item("report.html", {"page": "verdict, tables and plots"}, category="Verdict")
    return out


def report_files():
    """Every file of the report and of the partial report (restore_report, keep_report)."""
    return [*report_outputs(PLAN.layout.report, False).values()] + [
        *report_outputs(f"{PLAN.layout.report}/partial", False).values()
    ]


def keep_report():
    """Before any job: a copy of the report as it is, since Snakemake deletes a job's outputs
    before the job runs. Nothing is put back here: a report the user deleted stays deleted, and
    the copy a killed run left is put back by the next run's failure, if it fails."""
    keep(report_files())


def restore_report():
    """After a failure: the report files the failed job lost, put back from the copies."""
    for path in restore(report_files()):
        print(f"ddpscale: the report job did not finish: kept the previous {path}", file=sys.stderr)


def get_report_dir(wildcards, output):
    return str(Path(output.html).parent)


def get_compare_with(wildcards):
    """The earlier scaling.tsv to compare with (checked at parse time), or nothing."""
    path = config["report"]["compare_with"]
    return [path] if path else []


def get_finished_metrics(wildcards):
    """What a partial report is built from: every run that finished, none that did not."""
    done = PLAN.finished_metrics()
    if not done:
        raise WorkflowError(
            "no training run has finished yet, so there is nothing to report; "
            "run the workflow (or its `baseline` target) first"
        )
    return done


def get_failures(wildcards):
    """The last line of each train log without metrics: a new failure reruns the partial report."""
    tails = {}
    for topology, repeat in PLAN.runs():
        log = Path(PLAN.layout.train_log(topology, repeat))
        if not PLAN.finished(topology, repeat) and log.exists():
            tails[str(log)] = last_nonempty_line(log.read_text(errors="replace"))
    return json.dumps(tails, sort_keys=True)


def get_report_flags(wildcards):
    """The report's settings and records, inline or as their args file and digest (a param: a
    change reruns it). The records come from the input function, not `input`: Snakemake records
    no param that takes `input`, and another accuracy metric must rebuild the report."""
    return PLAN.report_flags(PROFILE.runtimes, writes_args(), get_all_metrics(wildcards), "report_scaling")


def get_partial_report_flags(wildcards):
    return PLAN.report_flags(PROFILE.runtimes, writes_args(), get_finished_metrics(wildcards), "partial_report")
