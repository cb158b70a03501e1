rule report_scaling:
    input:
        script="scripts/report.py",
        metrics=get_all_metrics,
    output:
        table=report(f"{REPORT_DIR}/scaling.tsv", caption="../report/scaling.rst", category="Scaling", labels={"table": "scaling"}),
        speedup=report(f"{REPORT_DIR}/speedup.png", caption="../report/speedup.rst", category="Scaling", labels={"figure": "speedup"}),
        efficiency=report(f"{REPORT_DIR}/efficiency.png", caption="../report/efficiency.rst", category="Scaling", labels={"figure": "efficiency"}),
        throughput=report(f"{REPORT_DIR}/throughput.png", caption="../report/throughput.rst", category="Scaling", labels={"figure": "throughput"}),
        html=f"{REPORT_DIR}/report.html",
    params:
        python=PYTHON,
        baseline=parse_topology(config["baseline"]).name,
        metric=config["accuracy"]["metric"],
        tolerance=config["accuracy"]["tolerance"],
        out_dir=get_report_dir,
    log:
        "results/logs/report_scaling.log",
    shell:
        "{params.python:q} {input.script} --metrics {input.metrics} --baseline {params.baseline} "
        "--accuracy-metric {params.metric} --accuracy-tolerance {params.tolerance} "
        "--out-dir {params.out_dir} > {log} 2>&1"
