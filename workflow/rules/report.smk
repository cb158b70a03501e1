# The report: scaling table with spread, time breakdown, prediction, verdict, plots, HTML.
# Helpers: common.smk.
# exec: the python replaces the job's shell, so a signal that ends the job (Snakemake, scancel)
# ends the report too, instead of leaving it to write over the previous report put back.
rule report_scaling:
    input:
        script="scripts/report.py",
        metrics=get_all_metrics,
        earlier=get_compare_with,
    output:
        **report_outputs(PLAN.layout.report, registered=True),
    log:
        f"{PLAN.layout.logs}/report_scaling.log",
    params:
        python=PLAN.python,
        flags=get_report_flags,
        out_dir=get_report_dir,
    shell:
        "exec {params.python:q} {input.script} {params.flags} --out-dir {params.out_dir} > {log} 2>&1"


# After a failure: `snakemake --profile ... partial_report` builds the report from the runs
# that finished; the others appear as rows marked failed or not run.
rule partial_report:
    input:
        script="scripts/report.py",
        metrics=get_finished_metrics,
        earlier=get_compare_with,
    output:
        **report_outputs(f"{PLAN.layout.report}/partial", registered=False),
    log:
        f"{PLAN.layout.logs}/partial_report.log",
    params:
        python=PLAN.python,
        flags=get_partial_report_flags,
        failures=get_failures,
        out_dir=get_report_dir,
    shell:
        "exec {params.python:q} {input.script} {params.flags} --out-dir {params.out_dir} > {log} 2>&1"
