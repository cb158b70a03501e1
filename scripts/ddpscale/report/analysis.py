"""Turn per-run metrics.json records into one scaling table per topology.

Pure pandas on purpose: the report has to run (and be unit-tested) on a
login node without torch or a GPU, so nothing here imports the training stack.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

import pandas as pd

from ddpscale.training import identity

SCHEMA_VERSION = 1

# Keys the report reads. Accuracy metrics are deliberately not listed: a user
# LightningModule may log no test step, and that is reported, not rejected.
REQUIRED_KEYS = (
    "schema_version", "topology", "repeat", "num_nodes", "devices_per_node",
    "world_size", "device_name", "simulated", "backend", "scaling",
    "batch_per_device", "effective_batch", "warmup_epochs", "epoch_times_s",
    "fit_time_s", "throughput_samples_s", "time_per_epoch_s", "hosts",
    "versions",
)

SUMMARY_COLUMNS = (
    "topology", "num_nodes", "devices_per_node", "world_size", "repeats",
    "device_name", "simulated", "scaling", "batch_per_device",
    "effective_batch", "fit_time_s", "time_per_epoch_s",
    "throughput_samples_s", "speedup", "efficiency", "time_speedup",
    "gpu_hours",
)

# Training FLOPs per sample, achieved TFLOP/s over all devices, MFU (GPU runs only).
COMPUTE_COLUMNS = ("flops_per_sample", "achieved_tflops", "mfu")

# What decides whether a row's numbers can mean what they seem (verdict.caveats words them).
# Older metrics files lack the newer keys: those stay NA, "not known", and say nothing.
# device_kind: "cuda" or "cpu". ranks_per_host: world size / distinct hosts. usable_cores and
# oversubscribed (more ranks on a host than usable cores: a CPU-simulated run that measured
# contention). simulated_nodes_on_one_host: several "nodes" on one host, so no network was
# crossed. compile_recompiles: torch.compile recompilations beyond each function's first compile.
CAVEAT_COLUMNS = ("device_kind", "ranks_per_host", "usable_cores", "oversubscribed",
                  "simulated_nodes_on_one_host", "compile_recompiles")

# Spread over repeats of the two figures a user compares: min, max, and a 95% interval
# of the mean (Student's t) once there are 3 or more repeats.
SPREAD_COLUMNS = tuple(f"{col}_{stat}" for col in ("fit_time_s", "throughput_samples_s")
                       for stat in ("min", "max", "ci_low", "ci_high"))

# Two-sided 95% quantiles of Student's t by degrees of freedom (no scipy in the stack).
_T975 = {2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262,
         10: 2.228, 12: 2.179, 15: 2.131, 20: 2.086, 25: 2.060, 30: 2.042, 60: 2.000}

# 0.90 - 0.88 is -0.0200000000000000018 in binary floating point; without
# slack a drop of exactly the tolerance would be reported as a failure.
_FLOAT_SLACK = 1e-9


def validate_run(record: object, source: str) -> dict:
    """Return record if it is a schema-1 metrics dict, else raise ValueError."""
    if not isinstance(record, dict):
        raise ValueError(f"{source}: expected a JSON object, got {type(record).__name__}")
    missing = [k for k in REQUIRED_KEYS if k not in record]
    if missing:
        raise ValueError(f"{source}: missing required key(s): {', '.join(missing)}")
    if record["schema_version"] != SCHEMA_VERSION:
        raise ValueError(
            f"{source}: schema_version {record['schema_version']!r} is not "
            f"supported (expected {SCHEMA_VERSION})")
    return record


def load_runs(paths: Iterable[str | Path]) -> pd.DataFrame:
    """One row per metrics.json; list/dict fields stay Python objects."""
    records = []
    for path in paths:
        path = Path(path)
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ValueError(f"{path}: cannot read: {exc.strerror or exc}") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"{path}: not valid JSON ({exc})") from None
        record = dict(validate_run(record, str(path)))
        record["source"] = str(path)
        records.append(record)
    if not records:
        raise ValueError("no metrics files given")
    return pd.DataFrame.from_records(records)


def check_world_sizes(runs: pd.DataFrame) -> None:
    """A run whose world_size differs from the request lost ranks: it must
    never be shown as a result, so refuse the whole report."""
    expected = runs["num_nodes"] * runs["devices_per_node"]
    bad = runs[runs["world_size"] != expected]
    if not bad.empty:
        row = bad.iloc[0]
        raise ValueError(
            f"run {row['topology']} (repeat {row['repeat']}) is broken: "
            f"world_size {row['world_size']} != num_nodes*devices_per_node "
            f"{row['num_nodes'] * row['devices_per_node']}; rerun it or drop "
            f"its metrics file")


def _known(value) -> bool:
    """False for None, NaN and pd.NA (a key an older metrics file does not have)."""
    try:
        return not pd.isna(value)
    except (TypeError, ValueError):  # a list or dict: present
        return True


def _column(runs: pd.DataFrame, key: str) -> pd.Series:
    return runs[key] if key in runs.columns else pd.Series(None, index=runs.index, dtype=object)


def device_kinds(runs: pd.DataFrame) -> pd.Series:
    """"cuda" or "cpu" per run: the recorded device_kind, else what `simulated` implies."""
    kinds = _column(runs, "device_kind")
    return pd.Series([str(k) if _known(k) else ("cpu" if bool(sim) else "cuda")
                      for k, sim in zip(kinds, runs["simulated"])], index=runs.index)


def run_facts(runs: pd.DataFrame) -> pd.DataFrame:
    """CAVEAT_COLUMNS per run (NA where a metrics file predates the key).

    simulated_nodes_on_one_host, when not recorded, is read off the hosts the ranks reported:
    more than one node on a single host name is the same fact, measured.
    """
    hosts = [sorted({str(h) for h in hs}) if isinstance(hs, (list, tuple)) and len(hs) else None
             for hs in runs["hosts"]]
    ranks = [int(ws) // len(h) if h and _known(ws) else pd.NA
             for ws, h in zip(runs["world_size"], hosts)]
    sim_nodes = [bool(v) if _known(v) else (h is not None and len(h) == 1 and int(n) > 1
                                            if h is not None and _known(n) else pd.NA)
                 for v, h, n in zip(_column(runs, "simulated_nodes_on_one_host"), hosts,
                                    runs["num_nodes"])]
    return pd.DataFrame({
        "topology": runs["topology"], "repeat": runs["repeat"],
        "device_kind": device_kinds(runs),
        "ranks_per_host": pd.array(ranks, dtype="Int64"),
        "usable_cores": pd.to_numeric(_column(runs, "usable_cores"), errors="coerce").astype("Int64"),
        "oversubscribed": pd.array([bool(v) if _known(v) else pd.NA
                                    for v in _column(runs, "oversubscribed")], dtype="boolean"),
        "simulated_nodes_on_one_host": pd.array(sim_nodes, dtype="boolean"),
        "compile_recompiles": pd.to_numeric(_column(runs, "compile_recompiles"),
                                            errors="coerce").astype("Int64"),
    }, index=runs.index)


def _any_known(values: pd.Series):
    """True if any repeat is True, False if all known are False, NA when none is known."""
    known = values.dropna()
    return pd.NA if known.empty else bool(known.astype(bool).any())


def _facts_by_topology(runs: pd.DataFrame) -> pd.DataFrame:
    facts = run_facts(runs).groupby("topology", sort=False)
    out = facts.agg(device_kind=("device_kind", _join_unique),
                    ranks_per_host=("ranks_per_host", "max"),
                    usable_cores=("usable_cores", "min"),
                    oversubscribed=("oversubscribed", _any_known),
                    simulated_nodes_on_one_host=("simulated_nodes_on_one_host", _any_known),
                    compile_recompiles=("compile_recompiles", "max"))
    for col in ("oversubscribed", "simulated_nodes_on_one_host"):
        out[col] = out[col].astype("boolean")
    for col in ("ranks_per_host", "usable_cores", "compile_recompiles"):
        out[col] = out[col].astype("Int64")
    return out


RUNS_DIR = "results/runs"


def check_device_kinds(runs: pd.DataFrame) -> None:
    """GPU and CPU runs in one report would make speedups across different hardware: refuse."""
    gpu = device_kinds(runs).eq("cuda")
    if gpu.all() or not gpu.any():
        return
    names = {"GPU": list(dict.fromkeys(runs.loc[gpu, "topology"])),
             "CPU": list(dict.fromkeys(runs.loc[~gpu, "topology"]))}
    listing = "; ".join(f"{kind}: {', '.join(map(str, tops))}" for kind, tops in names.items())
    raise ValueError(f"the runs mix GPU and CPU devices ({listing}), and a speedup across them "
                     f"would compare different hardware; rerun with one accelerator: delete the "
                     f"stale {RUNS_DIR}/<topology> folders of the kind you do not want and run "
                     f"the workflow again")


def _run_labels(runs: pd.DataFrame) -> list[str]:
    return [f"{t}/r{r}" for t, r in zip(runs["topology"], runs["repeat"])]


def check_identities(runs: pd.DataFrame) -> None:
    """Runs made from other data, settings, code or versions are not comparable: refuse.

    A run written before identities were recorded is unknown: alone it is allowed (see
    identity_note), beside known ones it cannot be checked, so it is refused too.
    """
    records = dict(zip(_run_labels(runs), _column(runs, "identity")))
    unknown = [label for label, rec in records.items() if not isinstance(rec, dict)]
    fix = ("rerun them so every run matches, e.g. `snakemake --profile <profile> --forcerun train`, "
           f"or delete the stale {RUNS_DIR}/<topology>/r<k>/metrics.json and run the workflow again")
    if unknown and len(unknown) < len(records):
        raise ValueError(f"run(s) {', '.join(unknown)} record no identity (written before ddpscale "
                         "recorded the data, code and versions of a run), so the report cannot check "
                         f"that they match the others; {fix}")
    differing = identity.differences(records)
    if differing:
        raise ValueError(f"the runs differ in {'; '.join(differing)}, and the report never mixes "
                         f"runs of different data, settings, code or versions; {fix}")


def identity_note(runs: pd.DataFrame) -> str | None:
    """Said in the report when no run records its identity (older metrics files)."""
    if any(isinstance(rec, dict) for rec in _column(runs, "identity")):
        return None
    return ("identity unknown: these metrics files predate ddpscale's record of each run's data "
            "checksum, code and versions, so the report could not check that every run used the same")


def t975(dof: int) -> float:
    """Student's t 97.5% quantile, rounded down to the nearest tabulated dof (conservative)."""
    below = [d for d in _T975 if d <= dof]
    return _T975[max(below)] if below else float("nan")


def spread(values: pd.Series) -> dict:
    """min, max and the 95% interval of the mean (NaN below 3 values: too few to trust)."""
    values = pd.to_numeric(values, errors="coerce").dropna()
    out = {"min": values.min(), "max": values.max(), "ci_low": float("nan"), "ci_high": float("nan")}
    if len(values) >= 3:
        half = t975(len(values) - 1) * values.std(ddof=1) / len(values) ** 0.5
        out.update(ci_low=values.mean() - half, ci_high=values.mean() + half)
    return out


def _spreads(grouped) -> pd.DataFrame:
    rows = {}
    for topology, group in grouped:
        rows[topology] = {f"{col}_{stat}": value for col in ("fit_time_s", "throughput_samples_s")
                          for stat, value in spread(group[col]).items()}
    return pd.DataFrame.from_dict(rows, orient="index")


def _join_unique(values: pd.Series) -> str:
    return ", ".join(dict.fromkeys(str(v) for v in values))


def summarize(runs: pd.DataFrame, baseline: str, accuracy_metric: str,
              tolerance: float) -> pd.DataFrame:
    """Median over repeats per topology, then speedup etc. against baseline."""
    if accuracy_metric not in runs.columns:
        raise ValueError(
            f"accuracy metric '{accuracy_metric}' is not in any metrics file; "
            f"choose one the runs log, e.g. val_acc or test_acc")
    check_world_sizes(runs)
    check_device_kinds(runs)
    check_identities(runs)
    if baseline not in set(runs["topology"]):
        raise ValueError(
            f"baseline '{baseline}' has no finished run; add it to topologies "
            f"in config/config.yaml")

    runs = runs.copy()
    # null -> NaN so the median skips it and an all-null topology stays NaN.
    runs[accuracy_metric] = pd.to_numeric(runs[accuracy_metric], errors="coerce")
    median_cols = ["fit_time_s", "time_per_epoch_s", "throughput_samples_s",
                   accuracy_metric]
    for col in median_cols:
        runs[col] = pd.to_numeric(runs[col], errors="coerce")

    grouped = runs.groupby("topology", sort=False)
    table = grouped.agg(
        num_nodes=("num_nodes", "first"),
        devices_per_node=("devices_per_node", "first"),
        world_size=("world_size", "first"),
        repeats=("topology", "size"),
        device_name=("device_name", _join_unique),
        simulated=("simulated", lambda s: bool(s.astype(bool).any())),
        scaling=("scaling", _join_unique),
        batch_per_device=("batch_per_device", "first"),
        effective_batch=("effective_batch", "first"),
    )
    # Runs from before FLOPs were counted lack these: NaN, shown as n/a.
    for col in COMPUTE_COLUMNS:
        runs[col] = pd.to_numeric(runs[col], errors="coerce") if col in runs else float("nan")
    median_cols += list(COMPUTE_COLUMNS)
    medians = grouped[median_cols].median()
    table = (table.join(medians).join(_spreads(grouped)).join(_facts_by_topology(runs))
             .reset_index())

    base = table.loc[table["topology"] == baseline].iloc[0]
    table["speedup"] = table["throughput_samples_s"] / base["throughput_samples_s"]
    table["efficiency"] = table["speedup"] / (table["world_size"] / base["world_size"])
    table["time_speedup"] = base["fit_time_s"] / table["fit_time_s"]
    table["gpu_hours"] = table["fit_time_s"] * table["world_size"] / 3600.0

    delta = table[accuracy_metric] - base[accuracy_metric]
    held = (delta >= -tolerance - _FLOAT_SLACK).astype("boolean")
    held[delta.isna()] = pd.NA  # metric not logged: neither held nor failed
    table["accuracy_delta"] = delta
    table["accuracy_held"] = held

    table = table.sort_values(["world_size", "num_nodes"], kind="stable")
    table = table[list(SUMMARY_COLUMNS) + [accuracy_metric, "accuracy_delta",
                                           "accuracy_held"] + list(SPREAD_COLUMNS)
                  + list(COMPUTE_COLUMNS) + list(CAVEAT_COLUMNS)].reset_index(drop=True)
    # Plots and HTML need these but they are not per-row data.
    table.attrs.update(baseline=baseline, accuracy_metric=accuracy_metric,
                       tolerance=float(tolerance))
    return table


def baseline_world_size(summary: pd.DataFrame) -> int:
    base = summary.attrs.get("baseline")
    rows = summary[summary["topology"] == base]
    return int(rows["world_size"].iloc[0] if len(rows) else summary["world_size"].min())


def device_word(summary: pd.DataFrame, n: int | None = None) -> str:
    """'CPU-simulated devices' or 'GPUs' (singular when n == 1)."""
    simulated = bool(summary["simulated"].any())
    if n == 1:
        return "CPU-simulated device" if simulated else "GPU"
    return "CPU-simulated devices" if simulated else "GPUs"


def hours_label(summary: pd.DataFrame) -> str:
    return "device-hours" if bool(summary["simulated"].any()) else "GPU-hours"


# Decimal places per column for scaling.tsv; hours get more because CPU
# smoke runs last seconds and would otherwise round to 0.
_ROUNDING = {"fit_time_s": 3, "time_per_epoch_s": 3, "throughput_samples_s": 2,
             "speedup": 3, "efficiency": 3, "time_speedup": 3, "gpu_hours": 6,
             "accuracy_delta": 4, **{col: 3 if col.startswith("fit") else 2 for col in SPREAD_COLUMNS}}


def rounded(summary: pd.DataFrame) -> pd.DataFrame:
    out = summary.copy()
    for col, places in _ROUNDING.items():
        out[col] = out[col].round(places)
    metric = summary.attrs.get("accuracy_metric")
    if metric in out.columns:
        out[metric] = out[metric].round(4)
    return out
