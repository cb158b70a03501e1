"""What a run's numbers depend on: its data, settings, training code and software versions.

train.py records this "identity" in metrics.json and folds it into the resume checkpoint's
fingerprint, so a checkpoint trained on other data or code is never resumed; the report
compares identities and refuses to mix runs that differ (ddpscale.report.figures.scaling).

Light imports only: the workflow imports this module while it parses (no torch there).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
from pathlib import Path
from typing import Iterable, Mapping

# Settings that differ between the runs of one report by design; every other setting must
# be the same for their numbers to be comparable. The data file's path is covered by the
# data's checksum.
PER_RUN_SETTINGS = ("topology", "num_nodes", "devices_per_node", "cluster_env", "repeat", "data_file")
# The parts the report compares, in the order its messages name them.
PARTS = ("data", "settings", "code", "versions")
PACKAGE = "ddpscale"


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def data_checksums(paths: Iterable[str]) -> dict[str, str | None]:
    """sha256 of each file the run reads, by the path the workflow gave it.

    A missing file is None here: the data module then stops with its own message naming the fix.
    """
    return {str(path): file_sha256(path) if Path(path).is_file() else None for path in paths}


def shared_settings(settings: Mapping) -> dict:
    return {k: v for k, v in settings.items() if k not in PER_RUN_SETTINGS}


def code_files(loaded: Mapping[str, object], root: Path, always: Iterable[Path],
               user_modules: Iterable[str]) -> dict[str, Path]:
    """The training path's source, named so the names do not depend on where the clone lives.

    loaded is sys.modules at a fixed point of train.py (after the user's classes are
    imported): every ddpscale module training uses, and the modules of the user's model and
    data classes. always: files on the training path whether or not this process imported
    them (the local launcher's script: its forked ranks run it, an srun rank does not), so every
    topology of one checkout hashes the same set. Files under
    root (scripts/) are named by their path there, others by module name.
    """
    root = Path(root).resolve()

    def label(path: Path, name: str) -> str:
        try:
            return str(path.resolve().relative_to(root))
        except ValueError:
            return name

    files = {label(Path(p), Path(p).name): Path(p) for p in always}
    wanted = set(user_modules)
    for name, module in list(loaded.items()):
        path = getattr(module, "__file__", None)
        if path and path.endswith(".py") and (name == PACKAGE or name.startswith(PACKAGE + ".") or name in wanted):
            files[label(Path(path), name)] = Path(path)
    return files


def code_hash(files: Mapping[str, Path]) -> str:
    digest = hashlib.sha256()
    for name in sorted(files):
        digest.update(f"{name}\0{file_sha256(files[name])}\n".encode())
    return digest.hexdigest()


def digest(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def identity(data: Mapping[str, str], settings: Mapping, code: str, versions: Mapping) -> dict:
    """The record kept in metrics.json: its parts, and one digest of them all."""
    parts = {"data": dict(data), "settings": shared_settings(settings), "code": code, "versions": dict(versions)}
    return {**parts, "digest": digest(parts)}


def installed_versions() -> dict:
    """torch and Lightning as installed, read without importing them (parse time stays fast)."""
    found = {}
    for key, dist in (("torch", "torch"), ("lightning", "pytorch-lightning")):
        try:
            found[key] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            found[key] = None
    return found


def generated_with_other_settings(manifest_path: str | Path, dataset: Mapping) -> bool:
    """Whether the generated data on disk came from other dataset settings than config's.

    False when there is no (readable) manifest: nothing was generated yet, or the workflow's
    corruption check names the fix.
    """
    try:
        recorded = json.loads(Path(manifest_path).read_text())["generator"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    wanted = {key: dataset.get(key) for key in recorded}
    return json.dumps(recorded, sort_keys=True) != json.dumps(wanted, sort_keys=True)


def differences(records: Mapping[str, object]) -> list[str]:
    """What differs between identities (label -> identity dict or None), in words.

    One entry per differing part, e.g. "data (1x1/r0: 3f2a1b0c; 1x2/r0: 9c8d7e6f)"; settings
    and versions are named key by key. Empty when every known identity agrees.
    """
    known = {label: rec for label, rec in records.items() if isinstance(rec, dict)}
    out = []
    for part in PARTS:
        values = {label: rec.get(part) for label, rec in known.items()}
        if len({json.dumps(v, sort_keys=True) for v in values.values()}) < 2:
            continue
        if part in ("settings", "versions"):
            keys = sorted({k for v in values.values() if isinstance(v, dict) for k in v})
            for key in keys:
                by_label = {label: (v or {}).get(key) for label, v in values.items()}
                if len({json.dumps(x, sort_keys=True) for x in by_label.values()}) > 1:
                    out.append(f"{part}.{key} ({_grouped(by_label, str)})")
        else:
            out.append(f"{part} ({_grouped(values, _short)})")
    return out


def _short(value) -> str:
    """A checksum (or a dict of them) shortened to 8 characters each."""
    if isinstance(value, dict):
        return ", ".join(f"{Path(k).name} {str(v)[:8]}" for k, v in sorted(value.items()))
    return str(value)[:8]


def _grouped(values: Mapping[str, object], show) -> str:
    groups: dict[str, list[str]] = {}
    for label, value in values.items():
        groups.setdefault(show(value), []).append(label)
    return "; ".join(f"{', '.join(labels)}: {shown}" for shown, labels in groups.items())
