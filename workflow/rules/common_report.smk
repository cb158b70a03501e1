# Helpers of rules/report.smk: its outputs, inputs and flags.
import itertools

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
    # the page with the verdict, first in Snakemake's report too (report/workflow.rst points to it)
    out["html"] = item("report.html", {"page": "verdict, tables and plots"}, category="Verdict")
    return out


def get_report_dir(wildcards, output):
    return str(Path(output.html).parent)


def get_compare_with(wildcards):
    """The earlier scaling.tsv to compare with (checked at parse time), or nothing."""
    path = config["report"]["compare_with"]
    return [path] if path else []


def get_finished_metrics(wildcards):
    """What a partial report is built from: every run that finished, none that did not."""
    done = finished(get_metrics(TOPOLOGY_NAMES))
    if not done:
        raise WorkflowError(
            "no training run has finished yet, so there is nothing to report; "
            "run the workflow (or its `baseline` target) first"
        )
    return done


def get_failures(wildcards):
    """The last line of each train log without metrics: a new failure reruns the partial report."""
    tails = {}
    for topology, repeat in itertools.product(TOPOLOGY_NAMES, REPEATS):
        metrics, log = Path(LAYOUT.metrics(topology, repeat)), Path(LAYOUT.train_log(topology, repeat))
        if not metrics.exists() and log.exists():
            tails[str(log)] = last_nonempty_line(log.read_text(errors="replace"))
    return json.dumps(tails, sort_keys=True)


def get_report_flags(wildcards):
    """The report's settings as explicit flags (inputs come separately)."""
    flags = {
        "--baseline": parse_topology(config["baseline"]).name,
        "--accuracy-metric": config["accuracy"]["metric"],
        "--accuracy-mode": config["accuracy"]["mode"],
        "--accuracy-tolerance": config["accuracy"]["tolerance"],
        "--efficiency-threshold": config["report"]["efficiency_threshold"],
        "--repeats": len(REPEATS),
        "--log-dir": LAYOUT.train_logs,
        # what the report says it measured, beside what the runs recorded
        "--experiment": EXPERIMENT,
        "--config-files": CONFIG_SOURCE,
        "--dataset": json.dumps(config["dataset"], sort_keys=True),
        "--data-args": json.dumps(config["data"]["init_args"], sort_keys=True),
    }
    if config["accuracy"]["target"] is not None:
        flags["--accuracy-target"] = config["accuracy"]["target"]
    if config["report"]["compare_with"]:
        flags["--compare"] = config["report"]["compare_with"]
    # the job time limit a full training of each topology would run under (cluster profiles)
    limits = reservation.job_limits(reservation.training_jobs(STAGE_TOPOLOGIES, [0], SITE, get_stage_runtimes()), SITE)
    if limits:
        flags["--job-limits"] = json.dumps(limits, sort_keys=True)
    return as_flags(flags) + " --expected " + " ".join(TOPOLOGY_NAMES)


def check_compare_with():
    path = config["report"]["compare_with"]
    if path and not Path(path).is_file():
        raise WorkflowError(
            f"{source(('report', 'compare_with'))}: report.compare_with is {path!r}, which is not a file; point it at "
            f"a scaling.tsv from an earlier run (copy {REPORT_DIR}/scaling.tsv before rerunning) "
            "or set it to null"
        )


check_compare_with()
