"""The one line each collapsed section shows under its heading: what is inside, in figures, so a
reader knows whether to open it. Pure functions of the report's data; None where the section
has nothing to sum up in a line (its heading then stands alone).
"""
from __future__ import annotations

from ddpscale.report.figures import breakdown
from ddpscale.report.figures.projection import cost_sentence
from ddpscale.report.figures.scaling import hours_label
from ddpscale.report.fmt import known, pct, sig, times
from ddpscale.report.load import description
from ddpscale.report.verdict import firstscreen
from ddpscale.report.verdict.decision import speedup_text


def _range(values, write) -> str:
    values = [v for v in values if known(v)]
    if not values:
        return "n/a"
    low, high = min(values), max(values)
    return write(low) if write(low) == write(high) else f"{write(low)} to {write(high)}"


def _speedups(rows) -> str:
    """'1.0x to 6.8x': the smallest and largest speedup of rows, each in the digits its interval
    supports."""
    known_rows = rows[rows["speedup"].notna()]
    if known_rows.empty:
        return "n/a"
    low, high = (speedup_text(known_rows.loc[i], bounds=False)
                 for i in (known_rows["speedup"].idxmin(), known_rows["speedup"].idxmax()))
    return low if low == high else f"{low} to {high}"


def scaling(data) -> str:
    done = data.finished
    speedups = _speedups(done)
    return (f"{len(data.summary)} topologies, {int(data.summary['repeats'].max())} repeat(s) at most; speedup "
            f"{speedups}; each figure's 95% interval, placement noise, fit time and accuracy per topology")


def cost(data) -> str:
    return cost_sentence(data.spent, hours_label(data.summary))


def projection(data) -> str | None:
    top = firstscreen.choice(data)
    said = firstscreen.full_training(data, str(top["topology"])) if top is not None else None
    return f"For {top['topology']}: {said}; every topology's projection and how it is made" if said else None


def where_time_goes(data) -> str | None:
    steps = data.steps
    base = steps[steps["topology"] == data.comparison.baseline] if len(steps) else steps
    if base.empty or not known(base.iloc[0].get("compute_frac")):
        return "Data wait, compute, exposed communication and overhead per training step"
    return (f"Compute is {pct(base.iloc[0]['compute_frac'])} of the baseline's step; data wait, exposed "
            "communication and overhead per topology")


def prediction(data) -> str | None:
    pred = data.prediction.dropna(subset=["predicted_step_s", "measured_step_s"])
    if pred.empty:
        return None
    agree = sum(bool(breakdown.agrees(r)) for _, r in pred.iterrows())
    return (f"Baseline step + measured all-reduce predicts {agree} of {len(pred)} topologies' steps within "
            f"{breakdown.AGREE_STEP:.0%}")


def allreduce(data) -> str | None:
    sizes = [max(p["allreduce"], key=lambda x: x["bytes"]) for p in breakdown.measured(data.probes).values()
             if p["world_size"] > 1 and p["allreduce"]]
    return f"Bus bandwidth at the gradient size: {_range([s.get('busbw_gbps') for s in sizes], lambda v: sig(v, 3))} GB/s"


def devices(data) -> str:
    names = ", ".join(dict.fromkeys(str(n) for n in data.runs["device_name"]))
    return f"{names}: memory, utilisation, TFLOP/s and MFU per run"


def time_to_accuracy(data) -> str | None:
    tta = data.timetoacc
    if tta is None or tta.empty:
        return None
    if data.comparison.throughput_mode:
        return "Not measured (throughput mode): no run trained to the end of its configured epochs"
    if not known(data.tta_target.value):
        return f"Not measured: {data.tta_target.why_none}"
    reached = tta[tta["status"].astype(str).str.startswith("reached")]
    return (f"{len(reached)} of {len(tta)} topologies reached the target; time-to-accuracy speedup "
            f"{_range(reached['tta_speedup'], times)}")


def earlier(data) -> str | None:
    return f"Against {data.compared_with}" if data.compared_with else None


def measured(data) -> str:
    keys = ("model_class", "model_parameters", "dataset", "precision")
    facts = [f"{description.LABELS[k]} {data.description[k]}" for k in keys if k in data.description]
    return "; ".join(facts) if facts else "The workload, data and settings the runs used"


def methods(data) -> str:
    return "How each figure is computed, and the hosts, devices and versions the runs used"


def of_table(heading: str, data) -> str | None:
    """The summary of the section holding the table under `heading` (html_tables' headings)."""
    made = {"Scaling": scaling, "Cost": cost, "The full training, projected": projection,
            "Where the time goes": where_time_goes, "Predicted vs measured": prediction,
            "All-reduce at the gradient size": allreduce, "Devices": devices,
            "Change since the earlier run": earlier, "Time to accuracy": time_to_accuracy}
    return made[heading](data) if heading in made else None
