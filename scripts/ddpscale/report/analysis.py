"""Turn per-run metrics.json records into one scaling table per topology.

Pure pandas on purpose: the report has to run (and be unit-tested) on a
login node without torch or a GPU, so nothing here imports the training stack.
"""
from __future__ import annotations

import pandas as pd

from ddpscale.report import accuracy, interconnect
from ddpscale.report.comparison import Comparison
from ddpscale.core.measuremode import THROUGHPUT
from ddpscale.report.records import (check_device_kinds, check_identities, check_measure_modes, check_world_sizes,
                                     column, device_kinds, held_devices, known, measure_mode)
from ddpscale.core.stats import mean_interval

SUMMARY_COLUMNS = (
    "topology", "num_nodes", "devices_per_node", "world_size", "repeats",
    "device_name", "simulated", "scaling", "batch_per_device",
    "effective_batch", "samples_trained", "fit_time_s", "time_per_epoch_s",
    "throughput_samples_s", "speedup", "efficiency", "time_speedup",
    "gpu_hours", "held_gpu_hours", "gpu_seconds_per_sample",
)
# samples_trained: training samples of every finished epoch over all ranks (median over repeats).
# time_speedup: baseline fit time / fit time, NA unless the topology trained the baseline's
# samples (SAME_SAMPLES). gpu_hours: the epochs' wall time x devices (training);
# held_gpu_hours: the time the job held its devices x devices (ddpscale.job.held);
# gpu_seconds_per_sample: devices / steady-state throughput, the cost of one sample.

# Runs train "the same samples" within this fraction: a data module that shards with
# drop_last may leave out a different remainder at each world size.
SAME_SAMPLES = 0.01

# Training FLOPs per sample, achieved TFLOP/s over all devices, MFU (GPU runs only).
COMPUTE_COLUMNS = ("flops_per_sample", "achieved_tflops", "mfu")

# What decides whether a row's numbers can mean what they seem (verdict.caveats words them).
# A fact a run could not measure (the transport of one rank) stays NA, "not known", and says nothing.
# device_kind: "cuda" or "cpu". ranks_per_host: world size / distinct hosts. usable_cores and
# oversubscribed (more ranks on a host than usable cores: a CPU-simulated run that measured
# contention). simulated_nodes_on_one_host: several "nodes" on one host, so no network was
# crossed. compile_recompiles: torch.compile recompilations beyond each function's first compile.
# transport: the network the collectives crossed ('gloo on eth0', 'NCCL over InfiniBand (...)');
# nccl_over_sockets: a multi-node run whose NCCL used sockets where the site says InfiniBand.
# early_stop: a module's EarlyStopping ended the run; samples_uncounted: why some batch's samples
# could not be counted (ddpscale.job.samplecount): its figures per sample are n/a.
CAVEAT_COLUMNS = ("device_kind", "ranks_per_host", "usable_cores", "oversubscribed",
                  "simulated_nodes_on_one_host", "compile_recompiles", "transport", "nccl_over_sockets", "early_stop",
                  "samples_uncounted")

# Spread over repeats of the two figures a user compares: min, max, and a 95% interval
# of the mean (Student's t) once there are 3 or more repeats.
SPREAD_COLUMNS = tuple(f"{col}_{stat}" for col in ("fit_time_s", "throughput_samples_s")
                       for stat in ("min", "max", "ci_low", "ci_high"))

# How the throughput was measured (records.measure_mode): in
# throughput mode the half-width of the 95% interval of the mean window throughput within a
# run (median over repeats) and why the runs stopped ("precision reached", "step cap
# reached", ...; the repeats' reasons joined).
MEASURE_COLUMNS = ("measure", "throughput_half_width", "stop_reason")


def run_facts(runs: pd.DataFrame) -> pd.DataFrame:
    """CAVEAT_COLUMNS per run."""
    ranks = [int(ws) // len(set(map(str, hs))) for ws, hs in zip(runs["world_size"], runs["hosts"])]
    return pd.DataFrame({
        "topology": runs["topology"], "repeat": runs["repeat"],
        "device_kind": device_kinds(runs),
        "ranks_per_host": pd.array(ranks, dtype="Int64"),
        "usable_cores": pd.to_numeric(runs["usable_cores"], errors="coerce").astype("Int64"),
        "oversubscribed": pd.array([bool(v) for v in runs["oversubscribed"]], dtype="boolean"),
        "simulated_nodes_on_one_host": pd.array([bool(v) for v in runs["simulated_nodes_on_one_host"]],
                                                dtype="boolean"),
        # only a run with torch.compile counts its recompilations
        "compile_recompiles": pd.to_numeric(column(runs, "compile_recompiles"),
                                            errors="coerce").astype("Int64"),
        "transport": [interconnect.run_text(t) for t in runs["transport"]],
        # NA where no transport was recorded: one rank has no collectives
        "nccl_over_sockets": pd.array([interconnect.socket_fallback(r) is not None if isinstance(r["transport"], list)
                                       else pd.NA for _, r in runs.iterrows()], dtype="boolean"),
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
                    compile_recompiles=("compile_recompiles", "max"),
                    transport=("transport", _join_known),
                    nccl_over_sockets=("nccl_over_sockets", _any_known))
    for col in ("oversubscribed", "simulated_nodes_on_one_host", "nccl_over_sockets"):
        out[col] = out[col].astype("boolean")
    for col in ("ranks_per_host", "usable_cores", "compile_recompiles"):
        out[col] = out[col].astype("Int64")
    return out


def spread(values: pd.Series) -> dict:
    """min, max and the 95% interval of the mean (NaN below 3 values: too few to trust)."""
    values = pd.to_numeric(values, errors="coerce").dropna()
    out = {"min": values.min(), "max": values.max(), "ci_low": float("nan"), "ci_high": float("nan")}
    if len(values) >= 3:
        mean, half = mean_interval([float(v) for v in values])
        out.update(ci_low=mean - half, ci_high=mean + half)
    return out


def _spreads(grouped) -> pd.DataFrame:
    rows = {}
    for topology, group in grouped:
        rows[topology] = {f"{col}_{stat}": value for col in ("fit_time_s", "throughput_samples_s")
                          for stat, value in spread(group[col]).items()}
    return pd.DataFrame.from_dict(rows, orient="index")


def _join_unique(values: pd.Series) -> str:
    return ", ".join(dict.fromkeys(str(v) for v in values))


def _join_known(values: pd.Series):
    """The repeats' texts, each once; None where no repeat recorded one."""
    return "; ".join(dict.fromkeys(str(v) for v in values if v is not None and known(v))) or None


def early_stop_text(value) -> str | None:
    """'stopped early: 6 of 8 epochs (EarlyStopping)' for a run's early_stop record, else None."""
    if not isinstance(value, dict):
        return None
    return (f"stopped early: {value.get('epochs_trained')} of {value.get('configured_epochs')} epochs "
            f"({value.get('by')})")


def compare(runs: pd.DataFrame, baseline: str, accuracy_metric: str, tolerance: float,
            mode: str = "auto") -> Comparison:
    """What these runs are compared against and how, once they are shown to be comparable (the
    world that formed, one kind of device, one identity, one measure mode, a baseline run).

    The accuracy metric is any scalar the module logged (report.accuracy); where no run (or
    not the baseline) logged it, or the runs measured in throughput mode, accuracy is not
    compared and not_compared says why."""
    check_world_sizes(runs)
    check_device_kinds(runs)
    check_identities(runs)
    check_measure_modes(runs)
    if baseline not in set(runs["topology"]):
        raise ValueError(
            f"baseline '{baseline}' has no finished run; add it to topologies "
            f"in config/config.yaml")
    measure = measure_mode(runs)
    values = accuracy.values(runs, accuracy_metric)
    not_compared = (accuracy.NOT_COMPARED_THROUGHPUT if measure == THROUGHPUT else
                    accuracy.not_compared(accuracy_metric, accuracy.logged_names(runs), baseline,
                                          bool(values[runs["topology"] == baseline].notna().any()),
                                          bool(values.notna().any())))
    return Comparison(baseline=baseline, metric=accuracy_metric, tolerance=float(tolerance),
                      direction=accuracy.direction(accuracy_metric, mode), measure=measure, not_compared=not_compared)


def summarize(runs: pd.DataFrame, comparison: Comparison) -> pd.DataFrame:
    """Median over repeats per topology, then speedup etc. against the baseline (runs as
    compare checked them)."""
    baseline, accuracy_metric, measure = comparison.baseline, comparison.metric, comparison.measure
    runs = runs.copy()
    # a module's EarlyStopping ended the run before its configured epochs: every figure is of fewer
    runs["early_stop"] = [early_stop_text(v) for v in runs["early_stop"]]
    # some batch's samples could not be counted: its figures per sample are n/a, and this says why
    runs["samples_uncounted"] = [f"samples not counted: {v}" if isinstance(v, str) and v else None
                                 for v in runs["samples_uncounted"]]
    # null or never logged -> NaN, so the median skips it and an all-null topology stays NaN
    runs[accuracy_metric] = accuracy.values(runs, accuracy_metric)
    median_cols = ["fit_time_s", "time_per_epoch_s", "throughput_samples_s", "samples_trained", "held_s",
                   "throughput_half_width", accuracy_metric]
    for col in median_cols:  # null where not measured (samples uncounted, no steady windows): NaN, n/a
        runs[col] = pd.to_numeric(runs[col], errors="coerce")

    runs["held_devices"] = held_devices(runs)
    grouped = runs.groupby("topology", sort=False)
    table = grouped.agg(
        held_devices=("held_devices", "first"),
        num_nodes=("num_nodes", "first"),
        devices_per_node=("devices_per_node", "first"),
        world_size=("world_size", "first"),
        repeats=("topology", "size"),
        device_name=("device_name", _join_unique),
        simulated=("simulated", lambda s: bool(s.astype(bool).any())),
        scaling=("scaling", _join_unique),
        batch_per_device=("batch_per_device", "first"),
        effective_batch=("effective_batch", "first"),
        stop_reason=("stop_reason", _join_known),
        early_stop=("early_stop", _join_known),
        samples_uncounted=("samples_uncounted", _join_known),
    )
    # null where not counted (a module FLOPs could not be counted for; MFU on a CPU): NaN, n/a
    for col in COMPUTE_COLUMNS:
        runs[col] = pd.to_numeric(runs[col], errors="coerce")
    median_cols += list(COMPUTE_COLUMNS)
    medians = grouped[median_cols].median()
    table = (table.join(medians).join(_spreads(grouped)).join(_facts_by_topology(runs))
             .reset_index())

    base = table.loc[table["topology"] == baseline].iloc[0]
    table["speedup"] = table["throughput_samples_s"] / base["throughput_samples_s"]
    table["efficiency"] = table["speedup"] / (table["world_size"] / base["world_size"])
    # fit times compare only where both trained the same samples: under weak scaling with a
    # fixed number of steps per epoch a larger world trains more in the same time
    same = (table["samples_trained"] - base["samples_trained"]).abs() <= SAME_SAMPLES * base["samples_trained"]
    table["time_speedup"] = (base["fit_time_s"] / table["fit_time_s"]).where(same)
    table["gpu_hours"] = table["fit_time_s"] * table["world_size"] / 3600.0
    # billed for what the job held: whole nodes with site_exclusive, else its ranks
    table["held_gpu_hours"] = table["held_s"] * table["held_devices"] / 3600.0
    table["gpu_seconds_per_sample"] = table["world_size"] / table["throughput_samples_s"]

    table["measure"] = measure
    if measure == THROUGHPUT:  # a run stopped mid-training: its metric is no final accuracy
        table[accuracy_metric] = float("nan")
    table["accuracy_delta"] = table[accuracy_metric] - base[accuracy_metric]
    # held is a test over the repeats' seeds (report.accuracy.verdict); NA: not tested, not
    # logged or inconclusive, and accuracy_test says which
    seeds = {} if measure == THROUGHPUT else {
        topology: group[accuracy_metric].dropna().tolist() for topology, group in runs.groupby("topology")}
    tests = [accuracy.verdict(seeds.get(t, []), seeds.get(baseline, []), comparison.tolerance, comparison.direction,
                              t == baseline)
             for t in table["topology"]]
    table["accuracy_held"] = pd.array([t[0] for t in tests], dtype="boolean")
    table["accuracy_test"] = [t[1] for t in tests]
    # the change the wrong way and, where tested, the far end of its one-sided 95% interval
    table["accuracy_bound"] = [t[2] for t in tests]
    table = table.sort_values(["world_size", "num_nodes"], kind="stable")
    table = table[list(SUMMARY_COLUMNS) + [accuracy_metric, "accuracy_delta", "accuracy_held", "accuracy_test",
                                           "accuracy_bound"] + list(SPREAD_COLUMNS)
                  + list(COMPUTE_COLUMNS) + list(CAVEAT_COLUMNS) + list(MEASURE_COLUMNS)].reset_index(drop=True)
    return table


def baseline_world_size(summary: pd.DataFrame, baseline: str) -> int:
    rows = summary[summary["topology"] == baseline]
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
             "speedup": 3, "efficiency": 3, "time_speedup": 3, "gpu_hours": 6, "held_gpu_hours": 6,
             "gpu_seconds_per_sample": 9, "throughput_half_width": 2,
             "accuracy_delta": 4, "accuracy_bound": 4, **{col: 3 if col.startswith("fit") else 2 for col in SPREAD_COLUMNS}}


def rounded(summary: pd.DataFrame, metric: str) -> pd.DataFrame:
    out = summary.copy()
    for col, places in _ROUNDING.items():
        out[col] = out[col].round(places)
    out[metric] = out[metric].round(4)
    return out
