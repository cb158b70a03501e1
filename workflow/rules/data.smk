rule prepare_data:
    input:
        script="scripts/prepare_data.py",
    output:
        data=f"{DATA_DIR}/{{generator}}/data.npz",
        manifest=f"{DATA_DIR}/{{generator}}/manifest.json",
    params:
        python=PYTHON,
        samples=config["dataset"]["samples"] if config["dataset"] else None,
        noise=config["dataset"]["noise"] if config["dataset"] else None,
        seed=config["dataset"]["seed"] if config["dataset"] else None,
        split=" ".join(map(str, config["dataset"]["split"])) if config["dataset"] else None,
    log:
        "results/logs/prepare_data/{generator}.log",
    shell:
        "{params.python:q} {input.script} --samples {params.samples} --noise {params.noise} "
        "--seed {params.seed} --split {params.split} "
        "--out {output.data} --manifest {output.manifest} > {log} 2>&1"
