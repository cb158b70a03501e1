"""Turn per-run metrics.json records into one scaling table per topology: what the runs are compared
against (Comparison, decided once by compare), the medians over repeats with their intervals, and a
row with its status for every expected topology, finished or not (add_missing).

Pure pandas on purpose: the report has to run (and be unit-tested) on a
login node without torch or a GPU, so nothing here imports the training stack.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ddpscale.core import steadystate
from ddpscale.core.io import cause_line
from ddpscale.run.measuremode import THROUGHPUT
from ddpscale.core.stats import mean_interval
from ddpscale.run.topology import parse_topology
from ddpscale.report.figures import accuracy, interconnect
from ddpscale.report.fmt import supported
from ddpscale.report.load.records import (check_device_kinds, check_identities, check_measure_modes,
                                          check_world_sizes, column, device_kinds, held_devices, known, measure_mode)

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
# held_gpu_hours: the time the job held its devices x devices (ddpscale.job.measure.timing);
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
# could not be counted (ddpscale.job.measure.samplecount): its figures per sample are n/a.
CAVEAT_COLUMNS = ("device_kind", "ranks_per_host", "usable_cores", "oversubscribed",
                  "simulated_nodes_on_one_host", "compile_recompiles", "transport", "nccl_over_sockets", "early_stop",
                  "samples_uncounted")

# Spread over repeats of the two figures a user compares: min, max, and a 95% interval
# of the mean (Student's t) once there are 3 or more repeats.
SPREAD_COLUMNS = tuple(f"{col}_{stat}" for col in ("fit_time_s", "throughput_samples_s")
                       for stat in ("min", "max", "ci_low", "ci_high"))

# How the throughput was measured (records.measure_mode): the half-width of the 95% interval of
# a run's window throughput, its steady windows' samples over their seconds (median over repeats;
# NaN: too short to tell), why the runs stopped ("precision reached", "step cap reached", ...;
# the repeats' reasons joined), and whether their windows settled (False: not steady, a drift or
# shift the rule could not cut off).
MEASURE_COLUMNS = ("measure", "throughput_half_width", "stop_reason", "windows_settled")

# The 95% intervals a decision is made by, on the log scale, where a throughput stays positive and
# a ratio's uncertainty is the sum of its sides' (ratio_intervals): throughput_spread is the
# half-width of log throughput (NaN: no interval), interval_from what it came from (INTERVAL_FROM).
INTERVAL_COLUMNS = ("throughput_spread", "interval_from", "throughput_low", "throughput_high",
                    "speedup_low", "speedup_high", "efficiency_low", "efficiency_high")
WITHIN_RUN = "within run"
OVER_REPEATS = "over repeats"
TOO_SHORT = steadystate.TOO_SHORT
TOO_NOISY = "too noisy to tell"  # a run's own interval of seconds per sample reaches zero
# The median of repeats varies more than their mean: by 1/0.637 in variance for normal data
# (the median's asymptotic efficiency, 2/pi), so its interval is the mean's this much wider.
MEDIAN_WIDENING = math.sqrt(math.pi / 2)


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


def log_spread_over_repeats(values: pd.Series) -> float:
    """The half-width of the 95% interval of the median of a throughput over repeats, on the log
    scale: the mean of the logs' interval (Student's t), widened as a median's is
    (MEDIAN_WIDENING); NaN below 3 repeats (too few to trust) or with a non-positive value."""
    values = [float(v) for v in pd.to_numeric(values, errors="coerce").dropna()]
    if len(values) < 3 or min(values) <= 0:
        return float("nan")
    _, half = mean_interval([math.log(v) for v in values])
    return half * MEDIAN_WIDENING


def _spreads(grouped) -> pd.DataFrame:
    rows = {}
    for topology, group in grouped:
        rows[topology] = {f"{col}_{stat}": value for col in ("fit_time_s", "throughput_samples_s")
                          for stat, value in spread(group[col]).items()}
        rows[topology]["repeats_spread"] = log_spread_over_repeats(group["throughput_samples_s"])
    return pd.DataFrame.from_dict(rows, orient="index")


def log_half_width(relative: float) -> float:
    """The half-width of log throughput from a run's own interval, whose relative half-width r is of
    the steady windows' seconds per sample, their seconds over their samples (core.steadystate):
    that interval, c(1 - r) to c(1 + r), is log((1 + r) / (1 - r)) wide on the log scale, so half
    of it, atanh(r) (r for a narrow one; taking r itself covered 91% of simulated ratios at
    r = 0.6, this 94%). NaN where it reaches zero (r >= 1): no upper bound, too short to tell."""
    return math.atanh(relative) if 0 <= relative < 1 else math.nan


def wider_spread(relative: float, repeats: float) -> tuple[float, str | None]:
    """(log half-width, where it came from) of a figure known to a run's relative half-width
    (the median run's; NaN: none) and to the spread over repeats (log_spread_over_repeats; NaN:
    fewer than 3): the wider of the two; (NaN, None) where neither exists."""
    within = log_half_width(relative)
    if pd.notna(repeats) and not within >= repeats:
        return float(repeats), OVER_REPEATS
    if pd.notna(within):
        return within, WITHIN_RUN
    return math.nan, None


def throughput_spread(row) -> tuple[float, str]:
    """(the half-width of a topology's log throughput at 95%, where it came from): wider_spread of
    its median run's own interval and its repeats; where neither exists, why (too short or too
    noisy to tell)."""
    mean, half = row.get("throughput_samples_s"), row.get("throughput_half_width")
    measured = pd.notna(half) and pd.notna(mean) and mean > 0
    width, source = wider_spread(float(half) / float(mean) if measured else math.nan,
                                 row.get("repeats_spread", math.nan))
    return width, source or (TOO_NOISY if measured else TOO_SHORT)


def ratio_spread(a: float, b: float) -> float:
    """The log half-width of a ratio of two independent throughputs: their half-widths in quadrature."""
    return math.hypot(a, b)


def add_intervals(table: pd.DataFrame, baseline: str) -> pd.DataFrame:
    """INTERVAL_COLUMNS: each topology's throughput, and its speedup and efficiency over the
    baseline with both sides' uncertainty, as 95% intervals that stay above zero. The baseline's
    own speedup interval is its throughput's, around 1."""
    out = table.copy()
    spreads = [throughput_spread(r) for _, r in out.iterrows()]
    out["throughput_spread"] = [s for s, _ in spreads]
    out["interval_from"] = [w for _, w in spreads]
    base = out.loc[out["topology"] == baseline].iloc[0]
    widths = [s if t == baseline else ratio_spread(s, base["throughput_spread"])
              for t, s in zip(out["topology"], out["throughput_spread"])]
    # a throughput's own interval is its own; a ratio's holds the baseline's too
    for col, value, width in (("throughput", out["throughput_samples_s"], out["throughput_spread"]),
                              ("speedup", out["speedup"], widths), ("efficiency", out["efficiency"], widths)):
        out[f"{col}_low"] = [v * math.exp(-w) for v, w in zip(value, width)]
        out[f"{col}_high"] = [v * math.exp(w) for v, w in zip(value, width)]
    return out


def _all_known(values: pd.Series):
    """False if any repeat is False, True if all known are True, NA when none is known."""
    known_ = values.dropna()
    return pd.NA if known_.empty else bool(known_.astype(bool).all())


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


@dataclass(frozen=True)
class Comparison:
    baseline: str  # the topology every speedup is over (config baseline)
    metric: str  # the accuracy metric compared with the baseline's (config accuracy.metric)
    tolerance: float  # how far the metric may move the wrong way and still hold (config accuracy.tolerance)
    direction: str  # "max": higher is better, "min": lower (report.figures.accuracy.direction)
    measure: str  # how the runs measured their throughput: "full" or "throughput" (run.measuremode)
    # why accuracy is not compared at all (report.figures.accuracy.not_compared); None where it is
    not_compared: str | None

    @property
    def throughput_mode(self) -> bool:
        return self.measure == THROUGHPUT

    @property
    def compared(self) -> bool:
        """Whether the baseline logged the accuracy metric, so held or not means something."""
        return self.not_compared is None

    def why_not_compared(self) -> str:
        """The short reason, in brackets after "accuracy not compared"."""
        return "throughput mode" if self.throughput_mode else f"{self.metric} not logged"


def compare(runs: pd.DataFrame, baseline: str, accuracy_metric: str, tolerance: float,
            mode: str = "auto") -> Comparison:
    """What these runs are compared against and how, once they are shown to be comparable (the
    world that formed, one kind of device, one identity, one measure mode, a baseline run).

    The accuracy metric is any scalar the module logged (report.figures.accuracy); where no run (or
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
    # False where the windows never settled (a drift, a shift): the figure is the later half's
    runs["windows_settled"] = [bool(v) if isinstance(v, (bool, np.bool_)) else pd.NA
                               for v in column(runs, "windows_settled")]
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
        windows_settled=("windows_settled", _all_known),
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
    table = add_intervals(table, baseline)

    table["measure"] = measure
    if measure == THROUGHPUT:  # a run stopped mid-training: its metric is no final accuracy
        table[accuracy_metric] = float("nan")
    table["accuracy_delta"] = table[accuracy_metric] - base[accuracy_metric]
    # held is a test over the repeats' seeds (report.figures.accuracy.verdict); NA: not tested, not
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
    # the test's power: the smallest change the wrong way it would call not held (80% power)
    table["accuracy_detectable"] = [
        accuracy.detectable(seeds.get(t, []), seeds.get(baseline, []), comparison.tolerance)
        if t != baseline else float("nan") for t in table["topology"]]
    table = table.sort_values(["world_size", "num_nodes"], kind="stable")
    table = table[list(SUMMARY_COLUMNS) + [accuracy_metric, "accuracy_delta", "accuracy_held", "accuracy_test",
                                           "accuracy_bound", "accuracy_detectable"] + list(SPREAD_COLUMNS)
                  + list(COMPUTE_COLUMNS) + list(CAVEAT_COLUMNS) + list(MEASURE_COLUMNS)
                  + list(INTERVAL_COLUMNS)].reset_index(drop=True)
    return table


STATUS_OK = "ok"


def run_status(finished: int, expected: int, log_tail: str | None) -> str:
    """'ok', 'k of N repeats finished', 'failed: <last log line>' or 'not run'."""
    if finished >= expected:
        return STATUS_OK
    if finished > 0:
        return f"{finished} of {expected} repeats finished"
    if log_tail is not None:
        return f"failed: {log_tail}" if log_tail else "failed (empty log)"
    return "not run"


def last_line(log: Path) -> str | None:
    """The last non-empty line of a log, usually the error; None when there is no log."""
    if not log.exists():
        return None
    return cause_line(log.read_text(encoding="utf-8", errors="replace"))[:200]


def add_missing(summary: pd.DataFrame, expected: list[str], repeats: int,
                log_tails: dict[str, str | None]) -> pd.DataFrame:
    """Every expected topology appears: a status per row, and rows for those that never finished."""
    counts = dict(zip(summary["topology"], summary["repeats"]))
    table = summary.copy()
    table["status"] = [run_status(int(counts[t]), repeats, None) for t in table["topology"]]
    extra = []
    for name in expected:
        if name in counts:
            continue
        topo = parse_topology(name)
        extra.append({"topology": topo.name, "num_nodes": topo.num_nodes,
                      "devices_per_node": topo.devices_per_node, "world_size": topo.world_size,
                      "repeats": 0, "simulated": bool(summary["simulated"].any()),
                      "status": run_status(0, repeats, log_tails.get(name))})
    if extra:
        table = pd.concat([table, pd.DataFrame(extra)], ignore_index=True)
        table = table.sort_values(["world_size", "num_nodes"], kind="stable").reset_index(drop=True)
        for col in ("num_nodes", "devices_per_node", "world_size", "repeats", "batch_per_device",
                    "effective_batch"):
            table[col] = table[col].astype("Int64")  # NaN rows would turn counts into floats
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
_ROUNDING = {"fit_time_s": 3, "time_per_epoch_s": 3, "gpu_hours": 6, "held_gpu_hours": 6,
             "time_speedup": 3, "gpu_seconds_per_sample": 9, "throughput_half_width": 2, "throughput_spread": 4,
             "accuracy_delta": 4, "accuracy_bound": 4, "accuracy_detectable": 4,
             **{col: 3 if col.startswith("fit") else 2 for col in SPREAD_COLUMNS}}
# The figures with an interval, rounded with their bounds to the places the interval supports
# (fmt.supported) and otherwise to the places the tables show (efficiency in percent), so the TSV
# holds the digits the page shows: (interval columns' stem, places, scale shown in).
_WITH_INTERVAL = {"throughput_samples_s": ("throughput", 0, 1), "speedup": ("speedup", 2, 1),
                  "efficiency": ("efficiency", 0, 100)}


def rounded(summary: pd.DataFrame, metric: str) -> pd.DataFrame:
    out = summary.copy()
    for col, places in _ROUNDING.items():
        out[col] = out[col].round(places)
    for col, (name, places, scale) in _WITH_INTERVAL.items():
        shown = [supported(v * scale, lo * scale, hi * scale, places)
                 for v, lo, hi in zip(out[col], out[f"{name}_low"], out[f"{name}_high"])]
        for k, key in enumerate((col, f"{name}_low", f"{name}_high")):
            # already rounded: only the division's binary noise is cut
            out[key] = [round(s[k] / scale, 12) for s in shown]
    out[metric] = out[metric].round(4)
    return out
