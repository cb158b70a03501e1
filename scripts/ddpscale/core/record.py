"""What a run records for its readers: the progress line rank 0 writes to its log after every
epoch, and metrics.json, the record of the whole run: its schema version, every key it holds
(SECTIONS, with kinds and units; the job's recorder assembles the record from them), and the one
writer and reader of the file and of final.json, the same record kept for a retry of the job.

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

from ddpscale.core.io import read_json_dict, read_regular, write_json_atomic
from ddpscale.core.layout import run_of
from ddpscale.core.steadystate import Rule

SCHEMA_VERSION = 5

# The JSON kinds a field may hold. bool is not a number here, though Python counts it as an int.
INT, NUM, STR, BOOL, LIST, DICT, NULL = "integer", "number", "text", "true/false", "list", "mapping", "null"
# a list element that is itself a pair, as checkpoint_save_s and validation_s hold them
PAIR = "[epoch, seconds]"


@dataclass(frozen=True)
class Field:
    """One key of the record: the JSON kinds its value may be, what a list's elements may be
    (the report and the workflow sum, sort and index them, so ["a"] in a list of seconds would
    crash them later), its unit where it has one, and whether every run writes it (required:
    the report reads it without a check of its own; the others are written by some runs only,
    or read by no one but a person, and are checked where present)."""

    kinds: tuple[str, ...]
    unit: str | None = None
    elements: tuple[str, ...] | None = None
    required: bool = True


def _f(*kinds: str, unit: str | None = None, of: tuple[str, ...] | None = None, required: bool = True) -> Field:
    return Field(tuple(kinds), unit, of, required)


def _some(*kinds: str, unit: str | None = None, of: tuple[str, ...] | None = None) -> Field:
    return _f(*kinds, unit=unit, of=of, required=False)


S, SPS, SAMPLES, FLOP = "s", "samples/s", "samples", "FLOP/sample"

# The record, section by section, each written by the one concept that owns it (the job's
# recorder, ddpscale.job.record, assembles them and refuses a key its section does not declare):
# every key the job writes, null where a run has no value (backend and transport on one rank,
# the GPU figures on a CPU run, the caps throughput mode was not given). Not required, because
# not every run writes them: the probe (a topology's first repeat, when probed) and the compile
# statistics (only a run with torch.compile); nor those no reader relies on.
SECTIONS: dict[str, dict[str, Field]] = {
    # what ran, where and on what code (ddpscale.job.record): the report's description
    "run": {
        "schema_version": _f(INT), "topology": _f(STR), "repeat": _f(INT), "seed": _some(INT),
        "num_nodes": _f(INT), "devices_per_node": _f(INT), "world_size": _f(INT),
        "node_ranks": _some(LIST, of=(INT,)), "hosts": _f(LIST, of=(STR,)),
        "simulated_nodes_on_one_host": _f(BOOL), "slurm_job_id": _some(STR, NULL), "scaling": _f(STR),
        "batch_per_device": _f(INT, unit=SAMPLES), "effective_batch": _f(INT, unit=SAMPLES),
        "accumulate_grad_batches": _f(INT), "precision": _f(STR), "max_epochs": _f(INT),
        "model_class": _f(STR), "model_parameters": _f(INT), "model_trainable_parameters": _some(INT),
        "optimizers": _f(LIST, of=(STR,)), "trainer_settings": _f(DICT), "ddp": _f(DICT), "data_class": _f(STR),
        "versions": _f(DICT), "identity": _f(DICT), "launched_from": _some(STR), "started_at": _some(STR),
        "finished_at": _some(STR), "early_stop": _f(DICT, NULL), "module_callbacks": _f(LIST, of=(STR,)),
        "loggers": _f(LIST, of=(STR,)), "held_devices": _f(INT), "fit_wall_s": _some(NUM, unit=S),
    },
    # the devices, as torch and the job's host saw them (ddpscale.job.device.gpu)
    "device": {
        "device_kind": _f(STR), "device_name": _f(STR), "simulated": _f(BOOL), "usable_cores": _f(INT),
        "oversubscribed": _f(BOOL), "gpu_peak_memory_mb": _f(NUM, NULL, unit="MB"),
        "gpu_utilization_pct": _f(NUM, NULL, unit="%"), "gpu_utilization_samples": _some(INT),
        "gpu_utilization_reason": _f(STR, NULL),
    },
    # each rank's place (ddpscale.job.launch.placement)
    "placement": {"placement": _some(LIST, of=(DICT,)), "gpu_per_rank": _some(BOOL)},
    # the process group and what carried it (ddpscale.job.device.transport)
    "transport": {"backend": _f(STR, NULL), "transport": _f(LIST, NULL, of=(DICT,)), "site_interconnect": _f(STR)},
    # the run's clock: epochs, attempts, held time (ddpscale.job.measure.timing)
    "timing": {
        "epochs_completed": _some(INT), "warmup_epochs": _f(INT), "epoch_times_s": _f(LIST, unit=S, of=(NUM,)),
        "train_times_s": _some(LIST, unit=S, of=(NUM,)), "fit_time_s": _f(NUM, unit=S),
        "samples_trained": _f(INT, NULL, unit=SAMPLES), "samples_uncounted": _f(STR, NULL),
        "held_s": _f(NUM, NULL, unit=S), "held_from": _some(STR), "steady_samples": _some(INT, NULL, unit=SAMPLES),
        "steady_time_s": _some(NUM, unit=S), "steady_epochs": _some(LIST, of=(INT,)),
        "epoch_attempts": _some(LIST, of=(INT,)), "attempts": _f(INT), "resumed_from_epoch": _f(INT, NULL),
        "resumed_mid_epoch": _some(BOOL),
    },
    # the epochs' checkpoint saves (ddpscale.job.resume.checkpoint)
    "checkpoint": {"checkpoint_s": _f(NUM, unit=S), "checkpoint_saves": _some(INT),
                   "checkpoint_save_s": _f(LIST, unit=S, of=(PAIR,))},
    # the timed windows, the stopping rule and the epoch's overheads (ddpscale.job.measure.windows);
    # what a sample is: each training loader's share of an epoch, the mode that combines them, and
    # DistributedSampler's padding repeats, trained but not counted (ddpscale.job.measure.samplecount)
    "windows": {
        "window_throughput_samples_s": _f(NUM, NULL, unit=SPS), "throughput_half_width": _f(NUM, NULL, unit=SPS),
        "windows_warmup": _some(INT), "windows_steady": _some(INT),
        "windows_settled": _some(BOOL), "window_seconds": _f(LIST, unit=S, of=(NUM,)),
        "window_samples": _f(LIST, unit=SAMPLES, of=(INT,)), "steps_measured": _f(INT),
        "stop_reason": _f(STR), "warmup_excess_s": _f(NUM, NULL, unit=S),
        # the stopping rule's settings by their config names (config throughput:, steadystate.Rule)
        "throughput": _f(DICT),
        "samples_per_epoch": _f(INT, NULL, unit=SAMPLES), "samples_per_epoch_from": _f(STR, NULL),
        "padding_per_epoch": _f(INT, NULL, unit=SAMPLES), "train_loaders_mode": _f(STR, NULL),
        "train_loaders": _f(LIST, of=(DICT,)), "stop_steps_by_rank": _some(LIST, NULL, of=(INT,)),
        "epoch_overhead_s": _f(NUM, NULL, unit=S), "epochs_timed": _some(INT),
        "epoch_overheads_s": _f(LIST, unit=S, of=(NUM,)), "validation_s": _f(LIST, unit=S, of=(PAIR,)),
        "check_val_every_n_epoch": _f(INT, NULL), "validates": _f(BOOL),
        "after_stop_validation_s": _f(LIST, unit=S, of=(NUM,)), "after_stop_checkpoint_s": _f(LIST, unit=S, of=(NUM,)),
    },
    # the run's headline figure, steady epochs' or windows' (ddpscale.job.measure.windows.headline)
    "throughput": {
        "measure": _f(STR), "configured_epochs": _f(INT), "throughput_samples_s": _f(NUM, NULL, unit=SPS),
        "time_per_epoch_s": _f(NUM, NULL, unit=S), "throughput_from": _some(STR),
    },
    # the topology's probe, when this run probed (ddpscale.job.probe)
    "probe": {"probe_s": _f(NUM, unit=S), "probe": _some(DICT, NULL)},
    # accuracy: every scalar the module logged, and the epoch metric's history (time to accuracy).
    # Which metric the report compares is the user's choice, and one no run logged is reported,
    # not refused (ddpscale.job.measure.accuracy)
    "accuracy": {
        "val_loss": _some(NUM, NULL), "val_acc": _some(NUM, NULL), "test_acc": _some(NUM, NULL),
        "logged_metrics": _f(DICT), "val_history": _f(LIST, of=(DICT,)), "val_history_metric": _f(STR, NULL),
        "val_history_reason": _f(STR, NULL),
    },
    # torch.compile: the setting as it was, and dynamo's statistics where it compiled (ddpscale.job.device.compiling)
    "compile": {
        "compile": _f(STR), "compile_graphs": _some(INT), "compile_graph_breaks": _some(INT),
        "compile_recompiles": _some(INT), "compile_recompile_reasons": _some(LIST, of=(STR,)),
    },
    # the FLOP count: recomputation apart, how many batches, their spread, the float32 arithmetic
    # in effect, model and hardware FLOPs utilisation (the latter with the recomputation), why
    # it is n/a (ddpscale.job.device.flops)
    "flops": {
        "flops_per_sample": _f(NUM, NULL, unit=FLOP), "flops_recomputed_per_sample": _f(NUM, NULL, unit=FLOP),
        "flops_conv_share": _some(NUM, NULL), "flops_per_sample_min": _f(NUM, NULL, unit=FLOP),
        "flops_per_sample_max": _f(NUM, NULL, unit=FLOP), "flops_batches": _f(INT),
        "flops_per_sample_analytic": _some(NUM, NULL, unit=FLOP), "flops_reason": _f(STR, NULL),
        "float32_matmul_precision": _some(STR, NULL), "cuda_matmul_allow_tf32": _some(BOOL, NULL),
        "cudnn_allow_tf32": _some(BOOL, NULL), "achieved_tflops": _f(NUM, NULL, unit="TFLOP/s"),
        "peak_tflops_per_device": _f(NUM, NULL, unit="TFLOP/s"), "peak_precision": _f(STR, NULL),
        "mfu": _f(NUM, NULL, unit="fraction"), "hfu": _f(NUM, NULL, unit="fraction"),
    },
}
# every key a record may hold, and its declaration
DECLARED: dict[str, Field] = {key: f for section in SECTIONS.values() for key, f in section.items()}
assert len(DECLARED) == sum(map(len, SECTIONS.values())), "a key declared in two sections"
# The fields the report reads without a check of its own, each with the kinds it may hold: the
# job writes every one of them in both measure modes, on one device and several.
FIELDS = {key: f.kinds for key, f in DECLARED.items() if f.required}
REQUIRED_KEYS = tuple(FIELDS)
# What each list field's elements may be, beside its kinds.
ELEMENTS = {key: f.elements for key, f in DECLARED.items() if f.elements}
UNITS = {key: f.unit for key, f in DECLARED.items() if f.unit}


def section(name: str, values: dict) -> dict:
    """values as section `name` of the record, or ValueError naming what the section does not
    declare or misses: what the job's recorder assembles the record from, so no key is written
    that a reader was not told of."""
    declared = SECTIONS[name]
    undeclared = sorted(set(values) - set(declared))
    missing = [key for key, f in declared.items() if f.required and key not in values and key != "schema_version"]
    if undeclared or missing:
        raise ValueError(f"record section {name!r}: " + "; ".join(
            ([f"undeclared key(s) {', '.join(undeclared)} (declare them in ddpscale.core.record.SECTIONS)"]
             if undeclared else []) + ([f"missing key(s) {', '.join(missing)}"] if missing else [])))
    return dict(values)


def assemble(sections: dict[str, dict]) -> dict:
    """The record of a run from its sections (name: values), each checked against its declaration."""
    record: dict = {}
    for name, values in sections.items():
        record.update(section(name, values))
    return record


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
    undeclared = sorted(k for k in record if k not in DECLARED)
    if undeclared:
        return (f"undeclared key(s): {', '.join(undeclared)}",
                f"this ddpscale's train.py never writes them: {RERUN}")
    present = [k for k in DECLARED if k in record]
    wrong = [f"{k} is {kind(record[k])}, not {' or '.join(DECLARED[k].kinds)}" for k in present
             if not _fits(record[k], DECLARED[k].kinds)]
    wrong += [f"{k} holds {found}, not {' or '.join(ELEMENTS[k])}" for k in present if k in ELEMENTS
              and kind(record[k]) == LIST and (found := _wrong_element(record[k], ELEMENTS[k]))]
    if kind(record.get("throughput")) == DICT:
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


# -- final.json: the record of a finished run, kept for a retry of the same job -----------------

def write_final(path: str | os.PathLike, fingerprint: str, record: dict) -> None:
    """The run's record beside the fingerprint of what it ran (ddpscale.job.resume.checkpoint),
    stamped with this schema version as metrics.json is (write)."""
    write_json_atomic(path, {"fingerprint": fingerprint,
                             "record": finite({**record, "schema_version": SCHEMA_VERSION})})


def read_final(path: str | os.PathLike) -> tuple[str | None, dict] | None:
    """(its fingerprint, its record) of a final.json whose record is one of this schema version,
    else None: a record of another shape or version is as good as none (the run trains again)."""
    data = read_json_dict(path)
    if data is None or problem(data.get("record")) is not None:
        return None
    fingerprint = data.get("fingerprint")
    return (fingerprint if isinstance(fingerprint, str) else None), data["record"]


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
