# The generated dataset (helpers: common.smk).
rule prepare_data:
    input:
        script="scripts/prepare_data.py",
    output:
        data=f"{PLAN.layout.data}/{{generator}}/data.npz",
        manifest=f"{PLAN.layout.data}/{{generator}}/manifest.json",
    log:
        f"{PLAN.layout.logs}/prepare_data/{{generator}}.log",
    params:
        python=PLAN.python,
        flags=get_prepare_flags(),
    shell:
        "{params.python:q} {input.script} {params.flags} > {log} 2>&1"
