# One job per topology and repeat. Checkpoints live outside the outputs, so a failed or
# timed-out run resumes from its last epoch when the command is run again.
rule train:
    input:
        script="scripts/train.py",
        data=get_train_data,
    output:
        metrics=report(f"{RUNS_DIR}/{{topology}}/r{{repeat}}/metrics.json", caption="../report/run.rst",
                       category="Runs", labels={"topology": "{topology}", "repeat": "{repeat}"}),
    params:
        launch=get_launch,
        flags=get_train_flags,
        # not on the command line: its change alone reruns the job (dataset settings, versions)
        identity=get_run_identity,
    resources:
        **TOPOLOGY_RESOURCES,
        # a retry may find the run already finished (killed while exiting): see train.py
        attempt=get_attempt,
        # The local profile allows one at a time, so runs never share the CPU they measure.
        train_slots=1,
    log:
        "results/logs/train/{topology}/r{repeat}.log",
    shell:
        "{params.launch} {input.script} {params.flags} --metrics {output.metrics} --attempt {resources.attempt} > {log} 2>&1"
