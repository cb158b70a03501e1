"""What a run records for its readers: the progress line rank 0 writes to its log after every
epoch, and metrics.json, the record of the whole run: its schema version, the keys every reader
relies on, and the one writer and reader of the file.

The job writes metrics.json once, atomically and last (its presence marks the run done); the
report reads it. The version changes with every change of the keys or of what a value holds, and
a record of another version is refused in one line that says how to regenerate it: ddpscale is
pre-1.0 and keeps no readers for older shapes, so the report's code reads exactly what the job's
code writes. The progress line's writer and reader live here together so the line `make status`
parses is the line training writes; light on purpose (no torch): the status command imports this
module on a login node.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

from ddpscale.core.io import read_regular, write_json_atomic
from ddpscale.core.layout import run_of
from ddpscale.core.steadystate import Rule

SCHEMA_VERSION = 5

# The JSON kinds a field may hold. bool is not a number here, though Python counts it as an int.
INT, NUM, STR, BOOL, LIST, DICT, NULL = "integer", "number", "text", "true/false", "list", "mapping", "null"

# The fields the report reads without a check of its own, each with the kinds it may hold:
# train.py (ddpscale.job.runinfo and the timing callbacks) writes every one of them in both
# measure modes, on one device and several, null where a run has no value (backend and transport
# on one rank, the GPU figures on a CPU run, the caps throughput mode was not given). Not listed,
# because not every run writes them: the probe (a topology's first repeat, when probed) and the
# compile statistics (only a run with torch.compile).
FIELDS = {
    "schema_version": (INT,), "topology": (STR,), "repeat": (INT,), "num_nodes": (INT,),
    "devices_per_node": (INT,), "world_size": (INT,), "device_kind": (STR,), "device_name": (STR,),
    "simulated": (BOOL,), "backend": (STR, NULL), "scaling": (STR,), "batch_per_device": (INT,),
    "effective_batch": (INT,), "accumulate_grad_batches": (INT,), "warmup_epochs": (INT,),
    "epoch_times_s": (LIST,), "fit_time_s": (NUM,), "throughput_samples_s": (NUM, NULL),
    "time_per_epoch_s": (NUM, NULL), "hosts": (LIST,), "versions": (DICT,), "identity": (DICT,),
    # where and on what it ran
    "usable_cores": (INT,), "oversubscribed": (BOOL,), "simulated_nodes_on_one_host": (BOOL,),
    "transport": (LIST, NULL), "site_interconnect": (STR,), "resumed_from_epoch": (INT, NULL),
    "attempts": (INT,),
    # what it trained: the report's description
    "model_class": (STR,), "model_parameters": (INT,), "data_class": (STR,), "max_epochs": (INT,),
    "configured_epochs": (INT,), "precision": (STR,), "compile": (STR,), "optimizers": (LIST,),
    "trainer_settings": (DICT,), "module_callbacks": (LIST,), "ddp": (DICT,), "loggers": (LIST,),
    # how it was measured and what it cost
    "measure": (STR,), "stop_reason": (STR,), "throughput_half_width": (NUM, NULL),
    # the stopping rule's settings by their config names (config throughput:, ddpscale.core.steadystate.Rule)
    "throughput": (DICT,), "window_seconds": (LIST,), "window_samples": (LIST,),
    "window_throughput_samples_s": (NUM, NULL), "warmup_excess_s": (NUM, NULL), "steps_measured": (INT,),
    "samples_per_epoch": (INT, NULL), "samples_per_epoch_from": (STR, NULL), "samples_trained": (INT, NULL),
    "samples_uncounted": (STR, NULL),
    # what a sample is (ddpscale.job.measure.samplecount): each training loader's share of an epoch, the
    # mode that combines them, and DistributedSampler's padding repeats, trained but not counted
    "padding_per_epoch": (INT, NULL), "train_loaders_mode": (STR, NULL), "train_loaders": (LIST,),
    "early_stop": (DICT, NULL), "held_s": (NUM, NULL), "held_devices": (INT,), "probe_s": (NUM,),
    "checkpoint_s": (NUM,), "checkpoint_save_s": (LIST,), "epoch_overhead_s": (NUM, NULL),
    "epoch_overheads_s": (LIST,), "validates": (BOOL,), "check_val_every_n_epoch": (INT, NULL),
    "validation_s": (LIST,), "after_stop_validation_s": (LIST,), "after_stop_checkpoint_s": (LIST,),
    # compute and the GPU
    "flops_per_sample": (NUM, NULL), "achieved_tflops": (NUM, NULL), "mfu": (NUM, NULL),
    "peak_tflops_per_device": (NUM, NULL), "peak_precision": (STR, NULL), "gpu_utilization_pct": (NUM, NULL),
    "gpu_utilization_reason": (STR, NULL), "gpu_peak_memory_mb": (NUM, NULL),
    # the FLOP count (ddpscale.job.device.flops): recomputation apart, how many batches, their spread,
    # hardware FLOPs utilisation (with the recomputation), why it is n/a
    "flops_recomputed_per_sample": (NUM, NULL), "hfu": (NUM, NULL), "flops_batches": (INT,),
    "flops_per_sample_min": (NUM, NULL), "flops_per_sample_max": (NUM, NULL), "flops_reason": (STR, NULL),
    # accuracy: every scalar the module logged, and the epoch metric's history (time to accuracy).
    # Which metric the report compares is the user's choice, and one no run logged is reported,
    # not refused.
    "logged_metrics": (DICT,), "val_history": (LIST,), "val_history_metric": (STR, NULL),
    "val_history_reason": (STR, NULL),
}
REQUIRED_KEYS = tuple(FIELDS)
# What each list field's elements may be, beside FIELDS: the report and the workflow sum, sort
# and index them, so ["a"] in a list of seconds would pass FIELDS and crash them later.
PAIR = "[epoch, seconds]"
ELEMENTS = {
    "epoch_times_s": (NUM,), "hosts": (STR,), "transport": (DICT,), "optimizers": (STR,),
    "module_callbacks": (STR,), "loggers": (STR,), "window_seconds": (NUM,), "window_samples": (INT,),
    "checkpoint_save_s": (PAIR,), "epoch_overheads_s": (NUM,), "validation_s": (PAIR,),
    "after_stop_validation_s": (NUM,), "after_stop_checkpoint_s": (NUM,), "val_history": (DICT,),
    "train_loaders": (DICT,),
}


def kind(value) -> str:
    """The JSON kind of a value as json.loads returns it."""
    if value is None:
        return NULL
    if isinstance(value, bool):
        return BOOL
    if isinstance(value, int):
        return INT
    if isinstance(value, float):
        return NUM
    return {str: STR, list: LIST, dict: DICT}.get(type(value), type(value).__name__)


def _fits(value, kinds: tuple) -> bool:
    found = kind(value)
    if PAIR in kinds and found == LIST and len(value) == 2:
        return _fits(value[0], (INT,)) and _fits(value[1], (NUM,))
    return found in kinds or (found == INT and NUM in kinds)


def _wrong_element(values: list, kinds: tuple) -> str | None:
    """The kind of the first element of values that is none of kinds, or None."""
    return next((kind(value) for value in values if not _fits(value, kinds)), None)


def non_finite(value, where: str) -> str | None:
    """Where value holds a number that is not finite (json.loads reads NaN and Infinity, and
    the report's sums and ratios would carry them into every figure), or None."""
    if isinstance(value, float) and not math.isfinite(value):
        return where
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found = non_finite(item, f"{where}[{key}]" if isinstance(key, int) else f"{where}.{key}")
        if found:
            return found
    return None


def finite(value):
    """value with each number that is not finite replaced by null: what the record writes,
    so every record the job writes passes the reader's check (a metric the module logged as
    inf or NaN is then one it has no value for)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, list):
        return [finite(item) for item in value]
    return value


def write(path: str | os.PathLike, record: dict) -> None:
    """The run's record, stamped with this schema version, written atomically."""
    write_json_atomic(path, finite({**record, "schema_version": SCHEMA_VERSION}))


# the fix that follows each refusal: the workflow sets such a record aside and retrains the run
# (ddpscale.plan.runplan.set_aside_unreadable), which is the only way to a record of this version
RERUN = "run the workflow again: it sets that file aside and retrains that run"


def problem(record: object, run: tuple[str, int] | None = None) -> tuple[str, str] | None:
    """(why record is not a metrics record of this schema version, what to do), or None.
    run: the (topology, repeat) its path says it is (layout.run_of), which it must record."""
    if not isinstance(record, dict):
        return f"expected a JSON object, got {type(record).__name__}", RERUN
    version = record.get("schema_version")
    if version != SCHEMA_VERSION:
        return (f"a run record of schema_version {version!r}, and this ddpscale reads version {SCHEMA_VERSION} "
                f"only", f"regenerate it: {RERUN}, or report it with the ddpscale version that wrote it")
    missing = [k for k in REQUIRED_KEYS if k not in record]
    if missing:
        return f"missing required key(s): {', '.join(missing)}", f"this ddpscale's train.py writes them all: {RERUN}"
    wrong = [f"{k} is {kind(record[k])}, not {' or '.join(FIELDS[k])}" for k in FIELDS
             if not _fits(record[k], FIELDS[k])]
    wrong += [f"{k} holds {found}, not {' or '.join(ELEMENTS[k])}" for k in ELEMENTS
              if kind(record[k]) == LIST and (found := _wrong_element(record[k], ELEMENTS[k]))]
    if kind(record["throughput"]) == DICT:
        try:
            Rule.of(record["throughput"])
        except (TypeError, ValueError) as err:
            wrong.append(f"throughput: {err}")
    where = non_finite(record, "record")
    if where:
        wrong.append(f"{where.removeprefix('record.')} is not a finite number")
    if wrong:
        return "; ".join(wrong), f"this ddpscale's train.py never writes that: {RERUN}"
    if run is not None and (record["topology"], record["repeat"]) != run:
        theirs = f"{record['topology']} repeat {record['repeat']}"
        return f"the record of {theirs} in the folder of {run[0]} repeat {run[1]} (copied there?)", RERUN
    return None


def validate(record: object, source: str) -> dict:
    """record if it is a metrics record of this schema version, else ValueError in one line."""
    found = problem(record)
    if found:
        raise ValueError(f"{source}: {found[0]}; {found[1]}")
    return record


def _load(path: Path) -> tuple[object, tuple[str, str] | None]:
    """Never opens what is not a regular file (a FIFO would block the dry run and make status
    until something wrote to it); the run is the one the path names, where it names one."""
    try:
        data = json.loads(read_regular(path).decode("utf-8"))
    except OSError as exc:
        return None, (f"cannot read: {exc.strerror or exc}", RERUN)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        return None, (f"not valid JSON ({exc})", RERUN)
    return data, problem(data, run_of(path))


def load(path: str | os.PathLike) -> tuple[dict | None, str | None]:
    """(the validated record of one metrics.json, None) or (None, why it is unreadable, in a
    few words and without the fix): what the workflow and make status decide a rerun by."""
    data, found = _load(Path(path))
    return (None, found[0]) if found else (data, None)


def read(path: str | os.PathLike) -> dict:
    """The validated record of one metrics.json, or ValueError naming the file."""
    data, found = _load(Path(path))
    if found:
        raise ValueError(f"{path}: {found[0]}; {found[1]}")
    return data


# -- the progress line, one per finished epoch, in the run's log -----------------------------------

PROGRESS_PREFIX = "ddpscale progress:"
_PROGRESS_LINE = re.compile(
    rf"^{re.escape(PROGRESS_PREFIX)} epoch (?P<epoch>\d+)/(?P<max_epochs>\d+) in (?P<epoch_s>[\d.]+) s, "
    r"(?P<throughput>[\d.]+) samples/s; attempt (?P<attempt>\d+) fit (?P<fit_s>[\d.]+) s; at (?P<at>[\d.]+)$"
)


@dataclass(frozen=True)
class Progress:
    epoch: int  # epochs finished, counting those of earlier attempts (1-based)
    max_epochs: int
    epoch_s: float  # the last epoch's wall time (train + validation)
    throughput: float  # the last epoch's samples per second over all ranks
    attempt: int
    fit_s: float  # this attempt's time in fit when the line was written
    at: float  # Unix time the line was written


def progress_line(p: Progress) -> str:
    return (f"{PROGRESS_PREFIX} epoch {p.epoch}/{p.max_epochs} in {p.epoch_s:.3f} s, {p.throughput:.1f} samples/s; "
            f"attempt {p.attempt} fit {p.fit_s:.1f} s; at {p.at:.1f}")


def last_progress(log_text: str) -> Progress | None:
    """The last progress line of a log, or None before the first epoch ends."""
    for text in reversed(log_text.splitlines()):
        match = _PROGRESS_LINE.match(text.strip())
        if match:
            g = match.groupdict()
            return Progress(int(g["epoch"]), int(g["max_epochs"]), float(g["epoch_s"]), float(g["throughput"]),
                            int(g["attempt"]), float(g["fit_s"]), float(g["at"]))
    return None
