"""The report's tables as TSV files: the one writer and its reader. A text cell (a name from a
record, a cause line from a log) is written by ddpscale.core.io.sheet_cell, so a spreadsheet shows
it as text instead of running it and a terminal shows its control characters; numbers stay numbers
(a column of floats holds no text, and "-0.3" is a value, not a formula)."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from ddpscale.core.io import from_sheet_cell, sheet_cell


def _each_text(table: pd.DataFrame, change) -> pd.DataFrame:
    """table with change applied to every str cell and column name; other cells as they are."""
    out = table.copy()
    for col in out.columns:
        if not pd.api.types.is_numeric_dtype(out[col]):  # object or string: may hold text
            out[col] = [change(v) if isinstance(v, str) else v for v in out[col]]
    return out.rename(columns=lambda c: change(c) if isinstance(c, str) else c)


def sheet_safe(table: pd.DataFrame) -> pd.DataFrame:
    return _each_text(table, sheet_cell)


def write(path: str | Path, table: pd.DataFrame) -> None:
    sheet_safe(table).to_csv(path, sep="\t", index=False, na_rep="")


def read(path: str | Path) -> pd.DataFrame:
    """A table write() wrote, its text cells as they were before the quote (control characters
    stay escaped: they were for showing, and a name is matched by what the report showed)."""
    return _each_text(pd.read_csv(path, sep="\t"), from_sheet_cell)
