# The report: scaling table with spread, time breakdown, prediction, verdict, plots, HTML.
REPORT_FIGURES = {
    "speedup": "Speedup vs ideal and predicted",
    "efficiency": "Parallel efficiency",
    "throughput": "Throughput per device",
    "breakdown": "Where a training step's time goes",
    "busbw": "All-reduce bus bandwidth",
}


def report_outputs(folder, registered):
    """Every file the report script writes; the full report registers them for --report."""
    def item(name, labels):
        path = f"{folder}/{name}"
        caption = f"../report/{name.split('.')[0]}.rst"
        return report(path, caption=caption, category="Scaling", labels=labels) if registered else path

    out = {"table": item("scaling.tsv", {"table": "scaling"}),
           "breakdown_table": item("breakdown.tsv", {"table": "time breakdown"}),
           "prediction_table": item("prediction.tsv", {"table": "predicted vs measured"})}
    for name, title in REPORT_FIGURES.items():
        out[name] = item(f"{name}.png", {"figure": title})
    out["html"] = f"{folder}/report.html"
    return out


rule report_scaling:
    input:
        script="scripts/report.py",
        metrics=get_all_metrics,
        probes=get_all_probes,
        earlier=get_compare_with,
    output:
        **report_outputs(REPORT_DIR, registered=True),
    params:
        python=PYTHON,
        flags=get_report_flags,
        out_dir=get_report_dir,
    log:
        "results/logs/report_scaling.log",
    shell:
        "{params.python:q} {input.script} --metrics {input.metrics} --probes {input.probes} "
        "{params.flags} --out-dir {params.out_dir} > {log} 2>&1"


# After a failure: `snakemake --profile ... partial_report` builds the report from the runs
# that finished; the others appear as rows marked failed or not run.
rule partial_report:
    input:
        script="scripts/report.py",
        metrics=get_finished_metrics,
        probes=get_finished_probes,
        earlier=get_compare_with,
    output:
        **report_outputs(f"{REPORT_DIR}/partial", registered=False),
    params:
        python=PYTHON,
        flags=get_report_flags,
        failures=get_failures,
        out_dir=get_report_dir,
    log:
        "results/logs/partial_report.log",
    shell:
        "{params.python:q} {input.script} --metrics {input.metrics} --probes {input.probes} "
        "{params.flags} --out-dir {params.out_dir} > {log} 2>&1"
