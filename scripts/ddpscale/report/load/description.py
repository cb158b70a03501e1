"""What a report measured, said at its head and in every row of scaling.tsv: the experiment, the
model (class and parameters), the data module and dataset, the config files, epochs, batch,
precision and compile. Two reports of different workloads must not look alike.

The runs' own records give what they trained (model and data classes, parameters, epochs,
batch, precision, compile); the workflow gives what only it knows (the experiment's name, the
config files, the dataset settings). Pure: no torch.
"""
from __future__ import annotations

import pandas as pd

from ddpscale.run.ddpsettings import said as ddp_said

# scaling.tsv columns, in this order, the same value on every row of one report
COLUMNS = ("experiment", "model_class", "model_parameters", "data_class", "dataset", "config_files",
           "max_epochs", "batch_scaling", "batch_size", "precision", "compile", "optimizers", "trainer_settings",
           "module_callbacks", "ddp", "loggers")


def _one(runs: pd.DataFrame, col: str) -> str:
    """The runs' value of a column, joined if they differ (the identity check keeps them equal)."""
    values = [v for v in runs[col] if v is not None and not (isinstance(v, float) and pd.isna(v))]
    return ", ".join(dict.fromkeys(str(v) for v in values)) or "unknown"


def _args(args: dict) -> str:
    return ", ".join(f"{k} {str(v).lower() if isinstance(v, bool) else v}" for k, v in args.items())


def _each_run(runs: pd.DataFrame, col: str, text) -> str:
    """A list- or dict-valued record, as text, joined over the runs where they differ."""
    return ", ".join(dict.fromkeys(text(v) for v in runs[col]))


def _trainer_settings(runs: pd.DataFrame) -> str:
    """The Trainer arguments that change what a step is, beyond Lightning's defaults: the
    accumulation of micro-batches per optimizer step (config accumulate_grad_batches), then a
    LightningCLI config's arguments (clipping, sync BN, ...) as the Trainer held them. Precision,
    compile and DDP's settings have rows of their own."""
    texts = []
    for accumulate, settings in zip(runs["accumulate_grad_batches"], runs["trainer_settings"]):
        accumulating = pd.notna(accumulate) and int(accumulate) != 1
        named = {"accumulate_grad_batches": int(accumulate)} if accumulating else {}
        texts.append(_args({**named, **(settings if isinstance(settings, dict) else {})}) or "ddpscale's")
    return ", ".join(dict.fromkeys(texts))


def dataset_text(dataset: dict | None, data_args: dict | None, data_class: str) -> str:
    """'spiral (generated): 10000 samples, noise 0.2, seed 1234, split 0.7/0.15/0.15', or what the
    data module makes itself with its init arguments."""
    if not dataset:
        return "unknown"
    if dataset.get("generator", "none") != "none":
        split = "/".join(str(x) for x in dataset.get("split", []))
        return (f"{dataset['generator']} (generated): {dataset.get('samples')} samples, noise {dataset.get('noise')}, "
                f"seed {dataset.get('seed')}, split {split}")
    name = data_class.rpartition(".")[2] or data_class
    return f"the data module's own ({name}{': ' + _args(data_args) if data_args else ''})"


def _batch(runs: pd.DataFrame) -> tuple[str, str]:
    """(scaling mode, the configured size: per device under weak scaling, global under strong)."""
    scaling = _one(runs, "scaling")
    col = "batch_per_device" if scaling == "weak" else "effective_batch"
    if scaling == "strong":
        # effective_batch counts accumulated micro-batches; the config's size is one step's
        size = ", ".join(dict.fromkeys(str(int(e) // int(a)) for e, a in
                                       zip(runs["effective_batch"], runs["accumulate_grad_batches"])))
        return scaling, size
    return scaling, _one(runs, col)


def describe(runs: pd.DataFrame, experiment: str | None = None, config_files: str | None = None,
             dataset: dict | None = None, data_args: dict | None = None) -> dict[str, str]:
    """COLUMNS -> the value this report's runs share, as text."""
    params = pd.to_numeric(runs["model_parameters"], errors="coerce")
    scaling, size = _batch(runs)
    data_class = _one(runs, "data_class")
    return {
        "experiment": experiment or "unknown",
        "model_class": _one(runs, "model_class"),
        "model_parameters": ", ".join(dict.fromkeys(str(int(p)) for p in params.dropna())) or "unknown",
        "data_class": data_class,
        "dataset": dataset_text(dataset, data_args, data_class),
        "config_files": config_files or "unknown",
        "max_epochs": _one(runs, "max_epochs"),
        "batch_scaling": scaling,
        "batch_size": size,
        "precision": _one(runs, "precision"),
        "compile": _one(runs, "compile"),
        "optimizers": _each_run(runs, "optimizers", lambda v: " + ".join(v) or "none"),
        "trainer_settings": _trainer_settings(runs),
        # what the module's configure_callbacks added to the Trainer (EarlyStopping, checkpoints)
        "module_callbacks": _each_run(runs, "module_callbacks", lambda v: ", ".join(v) or "none"),
        # DistributedDataParallel's settings where they are not torch's defaults (a 1-device run
        # records them unused: it trains without DDP)
        "ddp": _each_run(runs, "ddp", ddp_said),
        # what every run logged to while it was timed (its CSVLogger, or a LightningCLI config's)
        "loggers": _each_run(runs, "loggers", lambda v: ", ".join(v) or "none"),
    }


def with_columns(summary: pd.DataFrame, description: dict[str, str]) -> pd.DataFrame:
    """scaling.tsv: the description on every row, after the topology."""
    table = summary.copy()
    for offset, col in enumerate(COLUMNS):
        table.insert(1 + offset, col, description[col])
    return table


def headline(description: dict[str, str]) -> str:
    """'spiralmlp: SpiralMLP (3,234 parameters) on SpiralDataModule' for the page's title."""
    model = description["model_class"].rpartition(".")[2]
    data = description["data_class"].rpartition(".")[2]
    count = description["model_parameters"]
    params = f" ({int(count):,} parameters)" if count.isdigit() else ""
    return f"{description['experiment']}: {model}{params} on {data}"


LABELS = {"experiment": "Experiment", "model_class": "Model", "model_parameters": "Parameters",
          "data_class": "Data module", "dataset": "Dataset", "config_files": "Config files",
          "max_epochs": "Epochs", "batch_scaling": "Batch scaling", "batch_size": "Batch size",
          "precision": "Precision", "compile": "torch.compile", "optimizers": "Optimizer",
          "trainer_settings": "Trainer settings", "module_callbacks": "The module's callbacks",
          "ddp": "DDP settings", "loggers": "Loggers"}
