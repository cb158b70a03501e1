"""Small file helpers shared by the scripts."""

from __future__ import annotations

import json
import os
from pathlib import Path


def write_json_atomic(path: str | os.PathLike, data) -> None:
    """Write JSON so that a reader never sees half a file (temporary file + rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w") as handle:
        json.dump(data, handle, indent=2, sort_keys=True)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
