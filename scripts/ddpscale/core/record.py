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

# Keys the report reads without a check of its own. Accuracy metrics are deliberately not
# listed: a user's module may log no test step, and that is reported, not refused.
REQUIRED_KEYS = (
    "schema_version", "topology", "repeat", "num_nodes", "devices_per_node",
    "world_size", "device_name", "simulated", "backend", "scaling",
    "batch_per_device", "effective_batch", "warmup_epochs", "epoch_times_s",
    "fit_time_s", "throughput_samples_s", "time_per_epoch_s", "hosts",
    "versions", "identity",
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
        raise ValueError(f"{source}: missing required key(s): {', '.join(missing)}")
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
