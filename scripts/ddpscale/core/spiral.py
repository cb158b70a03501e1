"""The reference workload of the MPCDF Raven tutorial: two interleaved spirals, stored once by prepare_data.

Generation uses NumPy only, so the prepare_data job does not import torch.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import zipfile
from pathlib import Path

import numpy as np

from ddpscale.core.io import atomic_write, write_json_atomic

SPLITS = ("train", "val", "test")


def make_spirals(samples: int, noise: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Two spiral arms, one per class, with Gaussian noise; features standardised."""
    rng = np.random.default_rng(seed)
    labels = np.arange(samples) % 2
    # sqrt spreads points evenly along the arm instead of crowding the centre
    turn = np.sqrt(rng.uniform(0.0, 1.0, samples)) * 3 * np.pi
    angle = turn + labels * np.pi
    points = np.stack([turn * np.cos(angle), turn * np.sin(angle)], axis=1)
    points = points / (3 * np.pi) + noise * rng.standard_normal((samples, 2)) / 3
    order = rng.permutation(samples)
    return points[order].astype(np.float32), labels[order].astype(np.int64)


def split_sizes(samples: int, fractions: list[float]) -> dict[str, int]:
    train = int(round(samples * fractions[0]))
    val = int(round(samples * fractions[1]))
    return {"train": train, "val": val, "test": samples - train - val}


def sha256(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def write_dataset(path: str, manifest_path: str, samples: int, noise: float, seed: int,
                  split: list[float]) -> dict:
    """Write the arrays and a manifest (shape, split sizes, checksum); both atomically."""
    x, y = make_spirals(samples, noise, seed)
    sizes = split_sizes(samples, split)
    arrays, start = {}, 0
    for name in SPLITS:
        stop = start + sizes[name]
        arrays[f"x_{name}"], arrays[f"y_{name}"] = x[start:stop], y[start:stop]
        start = stop
    atomic_write(path, lambda tmp: write_npz_reproducibly(tmp, arrays))
    manifest = {
        "workload": "spiral",
        "file": os.path.basename(path),
        "sha256": sha256(path),
        "features": int(x.shape[1]),
        "classes": 2,
        "samples": samples,
        "splits": sizes,
        "generator": {"samples": samples, "noise": noise, "seed": seed, "split": split},
    }
    write_json_atomic(manifest_path, manifest)
    return manifest


def write_npz_reproducibly(path: str, arrays: dict[str, np.ndarray]) -> None:
    """An .npz that np.load reads, byte-identical for identical arrays.

    np.savez stamps each member with the current time; a regenerated file would then differ,
    and Snakemake reruns every training run whose input's checksum changed.
    """
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as archive:
        for name, array in arrays.items():
            buffer = io.BytesIO()
            np.lib.format.write_array(buffer, np.ascontiguousarray(array), allow_pickle=False)
            archive.writestr(zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0)), buffer.getvalue())


def manifest_path_for(data_file: str) -> str:
    return str(Path(data_file).with_name("manifest.json"))


def _regenerate_hint(data_file: str) -> str:
    return f"delete {Path(data_file).parent}/ and run the workflow again to regenerate it"


def corruption(data_file: str) -> str | None:
    """Why an existing data file cannot be trusted, or None. Cheap: one checksum."""
    try:
        with open(manifest_path_for(data_file)) as handle:
            expected = json.load(handle)["sha256"]
    except (OSError, ValueError, KeyError):
        return f"the manifest of {data_file} is missing or unreadable; {_regenerate_hint(data_file)}"
    if sha256(data_file) != expected:
        return f"data file {data_file} does not match its manifest checksum (corrupt); {_regenerate_hint(data_file)}"
    return None


def load_checked(data_file: str) -> dict[str, np.ndarray]:
    """Load the arrays after checking them against the manifest; errors name the fix."""
    regenerate = _regenerate_hint(data_file)
    if not os.path.exists(data_file):
        raise FileNotFoundError(f"data file {data_file} is missing; {regenerate}")
    problem = corruption(data_file)
    if problem:
        raise ValueError(problem)
    with open(manifest_path_for(data_file)) as handle:
        manifest = json.load(handle)
    with np.load(data_file) as archive:
        arrays = {key: archive[key] for key in archive.files}
    for name in SPLITS:
        if len(arrays[f"y_{name}"]) != manifest["splits"][name]:
            raise ValueError(f"data file {data_file}: split '{name}' size differs from the manifest; {regenerate}")
    return arrays
