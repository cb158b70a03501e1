"""metrics.json, the record of one training run: its schema version, the keys every reader
relies on, and the one writer and reader of the file.

The job writes it once, atomically and last (its presence marks the run done); the report reads
it. The version changes with every change of the keys or of what a value holds, and a record of another version is
refused in one line that says how to regenerate it: ddpscale is pre-1.0 and keeps no readers
for older shapes, so the report's code reads exactly what the job's code writes.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ddpscale.core.io import write_json_atomic

SCHEMA_VERSION = 3

# Keys the report reads without a check of its own: train.py (ddpscale.job.runinfo and the
# timing callbacks) writes every one of them in both measure modes, on one device and several,
# some as null where a run has no value (backend and transport on one rank, the GPU figures on
# a CPU run). Not listed, because not every run writes them: the probe (a topology's first
# repeat, when probed) and the compile statistics (only a run with torch.compile).
REQUIRED_KEYS = (
    "schema_version", "topology", "repeat", "num_nodes", "devices_per_node",
    "world_size", "device_kind", "device_name", "simulated", "backend", "scaling",
    "batch_per_device", "effective_batch", "accumulate_grad_batches", "warmup_epochs", "epoch_times_s",
    "fit_time_s", "throughput_samples_s", "time_per_epoch_s", "hosts",
    "versions", "identity",
    # where and on what it ran
    "usable_cores", "oversubscribed", "simulated_nodes_on_one_host", "transport", "site_interconnect",
    "resumed_from_epoch", "attempts",
    # what it trained: the report's description
    "model_class", "model_parameters", "data_class", "max_epochs", "configured_epochs", "precision",
    "compile", "optimizers", "trainer_settings", "module_callbacks", "ddp", "loggers",
    # how it was measured and what it cost
    "measure", "stop_reason", "throughput_half_width", "target_precision", "window_steps", "min_windows",
    "max_steps", "max_minutes",
    "window_seconds", "window_samples", "window_throughput_samples_s", "warmup_excess_s", "steps_measured",
    "samples_per_epoch", "samples_trained", "samples_uncounted", "early_stop", "held_s", "held_devices",
    "probe_s", "checkpoint_s", "checkpoint_save_s", "epoch_overhead_s", "epoch_overheads_s",
    "validates", "check_val_every_n_epoch", "validation_s", "after_stop_validation_s",
    "after_stop_checkpoint_s",
    # compute and the GPU
    "flops_per_sample", "achieved_tflops", "mfu", "peak_tflops_per_device", "peak_precision",
    "gpu_utilization_pct", "gpu_utilization_reason", "gpu_peak_memory_mb",
    # accuracy: every scalar the module logged, and the epoch metric's history (time to accuracy).
    # Which metric the report compares is the user's choice, and one no run logged is reported,
    # not refused.
    "logged_metrics", "val_history", "val_history_metric", "val_history_reason",
)


def write(path: str | os.PathLike, record: dict) -> None:
    """The run's record, stamped with this schema version, written atomically."""
    write_json_atomic(path, {**record, "schema_version": SCHEMA_VERSION})


def validate(record: object, source: str) -> dict:
    """record if it is a metrics record of this schema version, else ValueError in one line."""
    if not isinstance(record, dict):
        raise ValueError(f"{source}: expected a JSON object, got {type(record).__name__}")
    version = record.get("schema_version")
    if version != SCHEMA_VERSION:
        raise ValueError(
            f"{source}: a run record of schema_version {version!r}, and this ddpscale reads version "
            f"{SCHEMA_VERSION} only; regenerate it: delete that file and run the workflow again (it "
            "retrains that run), or report it with the ddpscale version that wrote it")
    missing = [k for k in REQUIRED_KEYS if k not in record]
    if missing:
        raise ValueError(f"{source}: missing required key(s): {', '.join(missing)}; this ddpscale's "
                         "train.py writes them all: delete that file and run the workflow again")
    return record


def read(path: str | os.PathLike) -> dict:
    """The validated record of one metrics.json, or ValueError naming the file."""
    path = Path(path)
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None
    return validate(record, str(path))
