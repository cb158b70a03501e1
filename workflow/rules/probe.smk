# One probe job per topology, on the same resources and launcher as its training runs: it times
# all-reduce over message sizes up to the gradient, and training steps with and without
# gradient synchronisation, which the report turns into the time breakdown and the prediction.
rule probe:
    input:
        script="scripts/probe.py",
        data=get_train_data,
    output:
        probe=report(f"{RUNS_DIR}/{{topology}}/probe.json", caption="../report/probe.rst",
                     category="Probes", labels={"topology": "{topology}"}),
    params:
        launch=get_launch,
        flags=get_probe_flags,
        # not on the command line: its change alone reruns the job (dataset settings, versions)
        identity=get_run_identity,
    resources:
        **TOPOLOGY_RESOURCES,
        # never beside a training run on the local profile: both would measure a shared CPU
        train_slots=1,
    log:
        "results/logs/probe/{topology}.log",
    shell:
        "{params.launch} {input.script} {params.flags} --out {output.probe} > {log} 2>&1"
