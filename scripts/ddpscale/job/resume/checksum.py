"""A checkpoint's checksum: size and sha256 in a sidecar (last.ckpt.sha256), written once the
checkpoint is complete, and checked before a run resumes from it.

Lightning writes a checkpoint in place, so a kill mid-write leaves a truncated file, and bytes
damaged later (a disk, a copy) still load: torch's mmap load reads the structure, not the
tensors, and the run resumed with NaN weights at every rerun. A checksum written after the file
is complete tells a whole checkpoint from any other. The one before it is kept under another
name (rotate), so an interrupted save leaves one to resume from.

Torch-free: hashlib, read in chunks, so a checkpoint of gigabytes never sits in memory.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from ddpscale.core.io import set_aside, write_json_atomic

SIDECAR = ".sha256"
CHUNK = 1 << 20
UNSIGNED = "no checksum"  # a checkpoint without a sidecar: cut short, or not written by ddpscale; never resumed


def sidecar(path: str | os.PathLike) -> Path:
    path = Path(path)
    return path.with_name(path.name + SIDECAR)


def digest(path: str | os.PathLike) -> dict:
    """{"size": bytes, "sha256": hex} of a file, read in chunks."""
    sha = hashlib.sha256()
    size = 0
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK):
            sha.update(chunk)
            size += len(chunk)
    return {"size": size, "sha256": sha.hexdigest()}


def sign(path: str | os.PathLike) -> None:
    """Write path's sidecar, atomically: only once path is complete (after the save's barrier)."""
    write_json_atomic(sidecar(path), digest(path))


def mismatch(path: str | os.PathLike) -> str | None:
    """Why path is not the file its sidecar describes; None where it is; UNSIGNED without a
    sidecar. Size first: a truncated file is told without reading it."""
    try:
        wanted = json.loads(sidecar(path).read_text())
    except FileNotFoundError:
        return UNSIGNED
    except (OSError, ValueError):
        return f"its checksum file {sidecar(path).name} is unreadable"
    if not (isinstance(wanted, dict) and isinstance(wanted.get("size"), int) and isinstance(wanted.get("sha256"), str)):
        return f"its checksum file {sidecar(path).name} is not one ddpscale writes"
    size = Path(path).stat().st_size
    if size != wanted["size"]:
        return f"{size} bytes, but {wanted['size']} were written"
    if digest(path)["sha256"] != wanted["sha256"]:
        return "its bytes differ from those written (sha256 mismatch)"
    return None


def rotate(path: str | os.PathLike, previous: str | os.PathLike) -> None:
    """Before a save overwrites path: keep it, with its sidecar, as previous. Each step is an
    atomic rename and a kill between them leaves previous unsigned, never wrongly signed."""
    path, previous = Path(path), Path(previous)
    if not path.exists():
        return
    sidecar(previous).unlink(missing_ok=True)
    os.replace(path, previous)
    if sidecar(path).exists():
        os.replace(sidecar(path), sidecar(previous))


def put_aside(path: str | os.PathLike) -> Path:
    """A damaged checkpoint renamed path.damaged (numbered after an earlier one), its sidecar
    with it; returns the new name. Kept, not deleted: it may still tell what went wrong."""
    if sidecar(path).exists():
        set_aside(sidecar(path), ".damaged")
    return set_aside(path, ".damaged")


def remove(path: str | os.PathLike) -> None:
    """A checkpoint and its sidecar, where they exist."""
    Path(path).unlink(missing_ok=True)
    sidecar(path).unlink(missing_ok=True)
