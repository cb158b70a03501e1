# Helpers of rules/data.smk: the generated dataset, made once, checked against its manifest,
# read by every run.
def get_data_file():
    return f"{DATA_DIR}/{config['dataset']['generator']}/data.npz"


def get_prepare_flags():
    dataset = config["dataset"]
    data_file = get_data_file()
    return (
        f"--samples {dataset['samples']} --noise {dataset['noise']} --seed {dataset['seed']} "
        f"--split {' '.join(map(str, dataset['split']))} --out {data_file} "
        f"--manifest {manifest_path_for(data_file)}"
    )


def check_generated_data():
    """Stop before any job when the dataset that finished runs used is missing or corrupt.

    Snakemake would regenerate it and rerun (first deleting) every finished run. The data is
    reproducible byte for byte, so regenerating it outside Snakemake keeps those runs.
    """
    data_file = Path(get_data_file())
    finished = [m for m in get_metrics(TOPOLOGY_NAMES) if Path(m).exists()]
    if data_file.exists():
        problem = corruption(str(data_file))
    elif finished:
        problem = f"data file {data_file} is missing but {len(finished)} finished run(s) used it"
    else:
        return
    if problem:
        raise WorkflowError(
            f"{problem.split('; ')[0]}. To regenerate the same bytes and keep finished runs: "
            f"rm -rf {data_file.parent} && {PYTHON} scripts/prepare_data.py {get_prepare_flags()}"
        )


def get_train_data(wildcards):
    """What a training run reads: the generated dataset, or the files the user's module reads.

    The generated dataset is ancient(): regenerated, it is byte-identical, and a rerun of
    prepare_data must not rerun (and first delete) finished measurements. Unless the dataset
    settings changed: then the data changes, and every run made from it must rerun. (The
    params trigger of get_run_identity cannot do it alone: Snakemake skips that check for a
    job downstream of a job that reruns, and an ancient input does not make it rerun.)
    """
    if not GENERATED:
        return config["data"]["files"]
    data_file = get_data_file()
    generated = [data_file, manifest_path_for(data_file)]
    if not generated_with_other_settings(manifest_path_for(data_file), config["dataset"]):
        generated = [ancient(path) for path in generated]
    return generated + config["data"]["files"]


if GENERATED:
    check_generated_data()
