"""Small file helpers shared by the scripts."""

from __future__ import annotations

import json
import os
from pathlib import Path


def atomic_write(path: str | os.PathLike, write) -> None:
    """write(tmp_path), then rename: a reader, or Snakemake after a killed job, never sees
    half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_json_atomic(path: str | os.PathLike, data) -> None:
    def dump(tmp: Path) -> None:
        with open(tmp, "w") as handle:
            json.dump(data, handle, indent=2, sort_keys=True)
            handle.flush()
            os.fsync(handle.fileno())

    atomic_write(path, dump)


def last_nonempty_line(text: str) -> str:
    """The last non-empty line of a log, stripped (usually the error); "" when it has none."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""
