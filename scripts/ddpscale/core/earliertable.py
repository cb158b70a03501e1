"""An earlier scaling.tsv to compare with (config report.compare_with): the columns the
comparison reads (ddpscale.report.earlier), and a check of the file's header that needs no
pandas, so the workflow refuses a file that is not one while it parses, before any job, instead
of in the report job (which Snakemake starts by deleting the previous report)."""

from __future__ import annotations

import os
from pathlib import Path

COMPARED = ("throughput_samples_s", "efficiency", "fit_time_s")
HEADER_BYTES = 1 << 16


def problem(path: str | os.PathLike) -> str | None:
    """Why path is not a ddpscale scaling.tsv (by its header line), or None."""
    path = Path(path)
    try:
        with open(path, "rb") as handle:
            head = handle.read(HEADER_BYTES)
    except OSError as exc:
        return f"{path} cannot be read ({exc.strerror or exc})"
    try:
        header = head.decode("utf-8").splitlines()[0] if head.strip() else ""
    except UnicodeDecodeError:
        return f"{path} is not a ddpscale scaling.tsv (not UTF-8 text)"
    columns = header.split("\t")
    missing = [c for c in ("topology", *COMPARED) if c not in columns]
    return f"{path} is not a ddpscale scaling.tsv (no column {', '.join(missing)})" if missing else None
