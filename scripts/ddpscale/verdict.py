"""The answer a user came for: which topology to use, what it costs, what did not finish,
and what changed since an earlier run. Pure pandas, unit-tested without a cluster.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from ddpscale.analysis import device_word, hours_label
from ddpscale.topology import parse_topology

STATUS_OK = "ok"


def usable(summary: pd.DataFrame) -> pd.DataFrame:
    """Finished topologies whose accuracy did not fail (not logged is not a failure)."""
    status = summary["status"] if "status" in summary else pd.Series(STATUS_OK, index=summary.index)
    finished = summary[status.eq(STATUS_OK) & summary["throughput_samples_s"].notna()]
    return finished[finished["accuracy_held"].fillna(True).astype(bool)]


def recommendation(summary: pd.DataFrame, threshold: float) -> str:
    """One sentence: the fastest topology, and the largest one above the efficiency threshold."""
    ok = usable(summary)
    where = "On CPU-simulated devices (a pipeline check, not GPU results), " if summary["simulated"].any() else ""
    if ok.empty:
        return f"{where}no topology finished with accuracy held, so there is nothing to recommend"
    fastest = ok.loc[ok["throughput_samples_s"].idxmax()]
    efficient = ok[ok["efficiency"] >= threshold - 1e-9]
    fast = (f"the fastest is {fastest['topology']} ({_devices(summary, fastest)}, "
            f"{fastest['speedup']:.2f}x, {fastest['efficiency']:.0%} efficient)")
    baseline = summary.attrs.get("baseline")
    if efficient.empty:
        keep = f"no topology stays above {threshold:.0%} efficiency"
    else:
        top = efficient.sort_values(["world_size", "throughput_samples_s"]).iloc[-1]
        if top["topology"] == baseline:
            keep = f"none beyond the baseline {baseline} stays above {threshold:.0%} efficiency"
        else:
            keep = (f"the largest that stays above {threshold:.0%} efficiency is "
                    f"{top['topology']} ({_devices(summary, top)}, {top['efficiency']:.0%})")
    sentence = f"{fast}; {keep}"
    return where + sentence if where else sentence[0].upper() + sentence[1:]


def _devices(summary: pd.DataFrame, row) -> str:
    n = int(row["world_size"])
    return f"{n} {device_word(summary, n)}"


def cost_table(summary: pd.DataFrame) -> pd.DataFrame:
    """GPU-hours per run and per epoch, and the extra each topology costs over the baseline."""
    finished = summary[summary["fit_time_s"].notna()]
    base = finished[finished["topology"] == summary.attrs.get("baseline")]
    base_hours = float(base["gpu_hours"].iloc[0]) if len(base) else float("nan")
    out = pd.DataFrame({
        "topology": finished["topology"], "world_size": finished["world_size"],
        "speedup": finished["speedup"],
        "gpu_hours": finished["gpu_hours"],
        "gpu_hours_per_epoch": finished["time_per_epoch_s"] * finished["world_size"] / 3600.0,
        "extra_gpu_hours": finished["gpu_hours"] - base_hours,
        "extra_pct": (finished["gpu_hours"] / base_hours - 1.0) * 100.0,
    })
    out.attrs["hours_label"] = hours_label(summary)
    return out.reset_index(drop=True)


def run_status(finished: int, expected: int, log_tail: str | None) -> str:
    """'ok', 'k of N repeats finished', 'failed: <last log line>' or 'not run'."""
    if finished >= expected:
        return STATUS_OK
    if finished > 0:
        return f"{finished} of {expected} repeats finished"
    if log_tail is not None:
        return f"failed: {log_tail}" if log_tail else "failed (empty log)"
    return "not run"


def last_line(log: Path) -> str | None:
    """The last non-empty line of a log, usually the error; None when there is no log."""
    if not log.exists():
        return None
    lines = [line.strip() for line in log.read_text(encoding="utf-8", errors="replace").splitlines()]
    lines = [line for line in lines if line]
    return lines[-1][:200] if lines else ""


def add_missing(summary: pd.DataFrame, expected: list[str], repeats: int,
                log_tails: dict[str, str | None]) -> pd.DataFrame:
    """Every expected topology appears: a status per row, and rows for those that never finished."""
    attrs = dict(summary.attrs)
    counts = dict(zip(summary["topology"], summary["repeats"]))
    table = summary.copy()
    table["status"] = [run_status(int(counts[t]), repeats, None) for t in table["topology"]]
    extra = []
    for name in expected:
        if name in counts:
            continue
        topo = parse_topology(name)
        extra.append({"topology": topo.name, "num_nodes": topo.num_nodes,
                      "devices_per_node": topo.devices_per_node, "world_size": topo.world_size,
                      "repeats": 0, "simulated": bool(summary["simulated"].any()),
                      "status": run_status(0, repeats, log_tails.get(name))})
    if extra:
        table = pd.concat([table, pd.DataFrame(extra)], ignore_index=True)
        table = table.sort_values(["world_size", "num_nodes"], kind="stable").reset_index(drop=True)
        for col in ("num_nodes", "devices_per_node", "world_size", "repeats", "batch_per_device",
                    "effective_batch"):
            table[col] = table[col].astype("Int64")  # NaN rows would turn counts into floats
    table.attrs.update(attrs)
    return table


COMPARED = ("throughput_samples_s", "efficiency", "fit_time_s")


def read_earlier(path: str | Path) -> pd.DataFrame:
    path = Path(path)
    if not path.exists():
        raise ValueError(f"earlier scaling table {path} does not exist; fix report.compare_with "
                         "in config/config.yaml (a scaling.tsv from an earlier run) or set it to null")
    earlier = pd.read_csv(path, sep="\t")
    missing = [c for c in ("topology", *COMPARED) if c not in earlier.columns]
    if missing:
        raise ValueError(f"{path} is not a ddpscale scaling.tsv (no column {', '.join(missing)})")
    return earlier


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
