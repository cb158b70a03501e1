"""The full training's cost, projected from what a run measured, and what the answer itself cost.

A throughput run stops after a few hundred steps; the user still wants to know what the
configured training would take on each topology before paying for it. Per run:

    projected seconds = configured_epochs x (samples_per_epoch / window throughput
                        + the seconds per epoch no training step took)
                        + the warm-up's excess over the steady rate

where the seconds no step took are measured per epoch the run trained in: the loader's start,
validation, the checkpoint save and the hooks between epochs (a throughput run ends its last
epoch with a validation and a save, so it measures them too).

and x world size / 3600 in device-hours. A full run also measured the real thing (fit time +
checkpoint writes), so there the projection is checked against it. A key a record lacks
(written before throughput mode) leaves its projection n/a with the reason: never a guess.
Pure pandas, unit-tested on hand-made records.
"""
from __future__ import annotations

import math

import pandas as pd

from ddpscale.measuremode import THROUGHPUT
from ddpscale.report.records import column, known, measure_mode

# What one projection needs from a metrics record (the lead's contract for issue 21).
INPUTS = ("configured_epochs", "samples_per_epoch", "window_throughput_samples_s", "epoch_overhead_s",
          "warmup_excess_s")

PROJECTION_COLUMNS = ("topology", "world_size", "repeats", "projected_s", "projected_device_hours",
                      "measured_s", "error", "why_na")


def _number(value) -> float | None:
    try:
        return float(value) if known(value) else None
    except (TypeError, ValueError):
        return None


def project_run(record) -> tuple[float, str | None]:
    """(projected seconds of the configured training, None) or (NaN, why it cannot be projected)."""
    values = {key: _number(record.get(key)) for key in INPUTS}
    missing = [key for key, value in values.items() if value is None]
    if missing:
        return math.nan, f"not recorded: {', '.join(missing)}"
    if values["window_throughput_samples_s"] <= 0:
        return math.nan, "no steady window throughput measured"
    per_epoch = values["samples_per_epoch"] / values["window_throughput_samples_s"] + values["epoch_overhead_s"]
    return values["configured_epochs"] * per_epoch + values["warmup_excess_s"], None


def measured_run(record) -> float:
    """A full run's own full-training seconds: its epochs plus its checkpoint writes."""
    fit, checkpoint = _number(record.get("fit_time_s")), _number(record.get("checkpoint_s"))
    return math.nan if fit is None or checkpoint is None else fit + checkpoint


def per_run(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per run: topology, world_size, projected_s, why_na, measured_s (full mode only)."""
    full = measure_mode(runs) != THROUGHPUT
    rows = []
    for _, record in runs.iterrows():
        projected, why = project_run(record)
        rows.append({"topology": record["topology"], "world_size": int(record["world_size"]),
                     "projected_s": projected, "why_na": why,
                     "measured_s": measured_run(record) if full else math.nan})
    return pd.DataFrame(rows, columns=["topology", "world_size", "projected_s", "why_na", "measured_s"])


def _reasons(values: pd.Series) -> str | None:
    return "; ".join(dict.fromkeys(str(v) for v in values if isinstance(v, str))) or None


def projection(runs: pd.DataFrame) -> pd.DataFrame:
    """Per topology (in world-size order): the median over repeats of the projected and, in full
    mode, the measured full training; error = projected / measured - 1. A topology with a repeat
    that cannot be projected is n/a, with the reason (a median of the rest would hide it).
    attrs: measure, answer_device_hours (+ answer_why_na), full_device_hours (throughput mode:
    one full training of every topology; + full_why_na)."""
    each = per_run(runs)
    rows = []
    for topology, group in each.groupby("topology", sort=False):
        why = _reasons(group["why_na"])
        projected = math.nan if why else float(group["projected_s"].median())
        measured = float(group["measured_s"].median()) if group["measured_s"].notna().all() else math.nan
        world = int(group["world_size"].iloc[0])
        rows.append({"topology": topology, "world_size": world, "repeats": len(group),
                     "projected_s": projected, "projected_device_hours": projected * world / 3600.0,
                     "measured_s": measured, "error": projected / measured - 1.0 if measured else math.nan,
                     "why_na": why})
    table = pd.DataFrame(rows, columns=list(PROJECTION_COLUMNS))
    table = table.sort_values(["world_size"], kind="stable").reset_index(drop=True)
    mode = measure_mode(runs)
    table.attrs["measure"] = mode
    table.attrs["answer_device_hours"], table.attrs["answer_why_na"] = answer_cost(runs)
    table.attrs["full_device_hours"], table.attrs["full_why_na"] = (
        full_cost(table) if mode == THROUGHPUT else (math.nan, None))
    return table


def answer_cost(runs: pd.DataFrame) -> tuple[float, str | None]:
    """What measuring cost: the sum over all runs of the time each held its devices x devices,
    in device-hours; n/a when a run did not record its held time (a partial sum would understate it)."""
    held = pd.to_numeric(column(runs, "held_s"), errors="coerce")
    if held.isna().any():
        names = ", ".join(f"{t}/r{r}" for t, r in zip(runs.loc[held.isna(), "topology"], runs.loc[held.isna(), "repeat"]))
        return math.nan, f"run(s) {names} recorded no held time"
    return float((held * runs["world_size"]).sum() / 3600.0), None


def full_cost(table: pd.DataFrame) -> tuple[float, str | None]:
    """What answering by full training would have cost: one projected full training per topology."""
    missing = table[table["projected_device_hours"].isna()]
    if len(missing):
        return math.nan, f"{', '.join(map(str, missing['topology']))} could not be projected"
    return float(table["projected_device_hours"].sum()), None


def duration(seconds) -> str:
    """Readable: '3.2 s', '45 s', '12 min', '3.1 h'; 'n/a' when not known."""
    if seconds is None or pd.isna(seconds):
        return "n/a"
    if seconds < 10:  # a CPU check: enough places to compare projected and measured
        return f"{seconds:.1f} s"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def hours(value) -> str:
    """Device-hours to 3 significant digits (a CPU check takes 0.000123, a model 1,230)."""
    if value is None or pd.isna(value):
        return "n/a"
    if value <= 0:
        return "0"
    return f"{value:,.{max(0, 2 - math.floor(math.log10(value)))}f}"


def sentence(table: pd.DataFrame, label: str) -> str:
    """'full training on 1x4: 5.0 h, 20 GPU-hours; on 2x4: 3.1 h, 25 GPU-hours' (n/a rows left out)."""
    known_rows = table[table["projected_s"].notna()]
    parts = [f"{r['topology']}: {duration(r['projected_s'])}, {hours(r['projected_device_hours'])} {label}"
             for _, r in known_rows.iterrows()]
    return "full training on " + "; on ".join(parts) if parts else ""


def cost_sentence(table: pd.DataFrame, label: str) -> str:
    """'This answer cost X GPU-hours (held); training every topology in full would take Y GPU-hours.'"""
    spent = table.attrs.get("answer_device_hours", math.nan)
    text = (f"This answer cost {hours(spent)} {label} (held)" if not pd.isna(spent)
            else f"What this answer cost is not known ({table.attrs.get('answer_why_na')})")
    if table.attrs.get("measure") == THROUGHPUT:
        full = table.attrs.get("full_device_hours", math.nan)
        text += (f"; training every topology in full would take {hours(full)} {label}" if not pd.isna(full)
                 else f"; what training every topology in full would take is not known "
                      f"({table.attrs.get('full_why_na')})")
    return text + "."


def rounded(table: pd.DataFrame) -> pd.DataFrame:
    """For projection.tsv: seconds to 0.1 s, device-hours to 6 places (a CPU check lasts seconds)."""
    out = table.copy()
    out["projected_s"], out["measured_s"] = out["projected_s"].round(1), out["measured_s"].round(1)
    out["projected_device_hours"], out["error"] = out["projected_device_hours"].round(6), out["error"].round(4)
    return out
