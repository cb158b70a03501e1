"""What changed since an earlier run (config report.compare_with): an earlier scaling.tsv read
and compared per topology, e.g. after a driver, NCCL or code change. Pure pandas."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from ddpscale.core.earliertable import COMPARED, problem
from ddpscale.report.load import tsv


def read_earlier(path: str | Path) -> pd.DataFrame:
    path = Path(path)
    if not path.exists():
        raise ValueError(f"earlier scaling table {path} does not exist; fix report.compare_with "
                         "in config/config.yaml (a scaling.tsv from an earlier run) or set it to null")
    found = problem(path)
    if found:
        raise ValueError(found)
    return tsv.read(path)


def compare(summary: pd.DataFrame, earlier: pd.DataFrame) -> pd.DataFrame:
    """Per topology: earlier and current value of each compared figure and the change in %."""
    now = summary.set_index("topology")
    before = earlier.set_index("topology")
    names = list(now.index) + [t for t in before.index if t not in now.index]
    rows = []
    for name in names:
        row = {"topology": name,
               "present": "both" if name in now.index and name in before.index
               else ("only now" if name in now.index else "only earlier")}
        for col in COMPARED:
            old = before[col].get(name, float("nan"))
            new = now[col].get(name, float("nan"))
            row[f"{col}_earlier"], row[f"{col}_now"] = old, new
            row[f"{col}_change_pct"] = (new / old - 1.0) * 100.0 if old and pd.notna(old) else float("nan")
        rows.append(row)
    return pd.DataFrame(rows)
