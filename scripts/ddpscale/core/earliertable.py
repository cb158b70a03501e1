"""An earlier scaling.tsv to compare with (config report.compare_with): the columns the
comparison reads (ddpscale.report.load.earlier), and a check of the file's header that needs no
pandas, so the workflow refuses a file that is not one while it parses, before any job, instead
of in the report job (which Snakemake starts by deleting the previous report)."""

from __future__ import annotations

import csv
import io
import os
from pathlib import Path

COMPARED = ("throughput_samples_s", "efficiency", "fit_time_s")
# A scaling.tsv holds a row per topology; a bigger file is something else named by mistake.
MAX_TABLE_BYTES = 1 << 22
# The numeric columns the report reads from an earlier table (time to accuracy: its baseline's
# final epoch metric, ddpscale.report.figures.timetoacc).
NUMERIC = (*COMPARED, "epoch_metric_final")
# How pandas writes a missing number (an empty cell) and reads one back.
MISSING = {"", "nan", "NaN", "NA", "N/A", "null", "None"}


def problem(path: str | os.PathLike) -> str | None:
    """Why path is not a ddpscale scaling.tsv the report can compare with, or None: its header,
    then every row (a duplicate topology or a cell that is no number would stop the report job,
    after Snakemake deleted the previous report)."""
    path = Path(path)
    try:
        if path.stat().st_size > MAX_TABLE_BYTES:
            return f"{path} is not a ddpscale scaling.tsv (larger than {MAX_TABLE_BYTES >> 20} MiB)"
        with open(path, "rb") as handle:
            data = handle.read(MAX_TABLE_BYTES + 1)
    except OSError as exc:
        return f"{path} cannot be read ({exc.strerror or exc})"
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return f"{path} is not a ddpscale scaling.tsv (not UTF-8 text)"
    rows = list(csv.reader(io.StringIO(text), delimiter="\t"))
    header = rows[0] if rows else []
    missing = [c for c in ("topology", *COMPARED) if c not in header]
    if missing:
        return f"{path} is not a ddpscale scaling.tsv (no column {', '.join(missing)})"
    return rows_problem(path, header, rows[1:])


def rows_problem(path, header: list[str], rows: list[list[str]]) -> str | None:
    """The first row of the table that the comparison cannot read, or None."""
    seen = set()
    numeric = [(header.index(name), name) for name in NUMERIC if name in header]
    for line, row in enumerate(rows, start=2):
        if not any(cell.strip() for cell in row):
            continue
        if len(row) != len(header):
            return f"{path} line {line} has {len(row)} cells but the header {len(header)}"
        topology = row[header.index("topology")]
        if topology in seen:
            return f"{path} line {line}: topology {topology!r} is listed twice (one row per topology)"
        seen.add(topology)
        for index, name in numeric:
            if not number(row[index]):
                return f"{path} line {line}: {name} is {row[index]!r}, which is not a number"
    return None


def number(cell: str) -> bool:
    """Whether a cell reads as a number or a missing one, as pandas reads it."""
    if cell.strip() in MISSING:
        return True
    try:
        float(cell)
    except ValueError:
        return False
    return True
