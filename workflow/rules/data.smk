# The generated dataset (helpers: common_data.smk).
rule prepare_data:
    input:
        script="scripts/prepare_data.py",
    output:
        data=f"{DATA_DIR}/{{generator}}/data.npz",
        manifest=f"{DATA_DIR}/{{generator}}/manifest.json",
    log:
        f"{LAYOUT.logs}/prepare_data/{{generator}}.log",
    params:
        python=PYTHON,
        flags=get_prepare_flags(),
    shell:
        "{params.python:q} {input.script} {params.flags} > {log} 2>&1"
