"""The report's figures, one function each, as PNG: speedup, efficiency and throughput per
device (scaling), the step breakdown and the all-reduce bus bandwidth (where the time goes),
and the list of every figure (figures()).

Figures are built on matplotlib.figure.Figure with an explicit Agg canvas instead of pyplot:
no global backend switch, no display needed, and no figure left open in a long-lived process.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from ddpscale.report.analysis import baseline_world_size, device_word
from ddpscale.report.breakdown import TERM_WORDS, TERMS, measured


FIGSIZE = (6.0, 4.0)
DPI = 110


def title(summary: pd.DataFrame, what: str) -> str:
    # Simulated numbers must never be mistaken for GPU results, even when a
    # figure is copied out of the report on its own.
    if bool(summary["simulated"].any()):
        return f"{what} (CPU-simulated devices)"
    return what


def new_axes():
    fig = Figure(figsize=FIGSIZE, dpi=DPI)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.grid(True, alpha=0.4)
    ax.set_axisbelow(True)
    return fig, ax


def save(fig: Figure, path: str | Path) -> None:
    fig.tight_layout()
    # format given explicitly so callers may write to a temp name first.
    fig.savefig(path, format="png", dpi=DPI)


# At one world size the topologies (1x2, 2x1) sit side by side, this far apart in x (a fraction
# of the smallest gap between world sizes), and each node count has its own marker: drawn at
# the same point their labels printed over each other ("1x2" on "2x1" read as "2x2").
DODGE = 0.12
NODE_MARKERS = ("o", "^", "D", "v", "P", "X")


def _dodged(frame: pd.DataFrame, xs: list[float]) -> pd.Series:
    """x of each row: its world size, moved apart from other topologies of that world size."""
    gaps = [b - a for a, b in zip(xs, xs[1:])]
    step = DODGE * (min(gaps) if gaps else 1.0)
    out = frame["world_size"].astype(float).copy()
    for _, group in frame.groupby("world_size"):
        order = group.sort_values(["num_nodes", "topology"]).index
        for k, i in enumerate(order):
            out[i] += (k - (len(order) - 1) / 2) * step
    return out


def speedup_figure(data):
    """Measured throughput speedup against the ideal line and the prediction."""
    summary = data.finished
    fig, ax = new_axes()
    base_ws = baseline_world_size(summary, data.comparison.baseline)
    xs = sorted(set(summary["world_size"].astype(float)) | {float(base_ws)})
    ax.plot(xs, [x / base_ws for x in xs], "--", color="grey", label="ideal (linear)")
    at = dict(zip(summary["topology"], _dodged(summary, xs)))
    pred = data.prediction
    if len(pred):
        pred = pred.dropna(subset=["predicted_efficiency"])  # a topology whose probe failed: unknown
    if len(pred):
        pred = pred.assign(x=[at.get(t, w) for t, w in zip(pred["topology"], pred["world_size"])])
        pred = pred.sort_values("x")
        ax.plot(pred["x"], pred["predicted_efficiency"] * pred["world_size"] / base_ws,
                "s:", color="tab:purple", markersize=6, label="predicted (baseline + all-reduce)")
    for k, (count, group) in enumerate(summary.groupby("num_nodes")):
        ax.plot([at[t] for t in group["topology"]], group["speedup"],
                NODE_MARKERS[k % len(NODE_MARKERS)], color="tab:blue", markersize=7,
                label=f"measured, {int(count)} node{'s' if count != 1 else ''}")
    right = max(xs)
    ax.set_xlim(0, right + max(1.0, 0.1 * right))
    ax.set_ylim(bottom=0)
    ax.set_xlabel(f"world size (number of {device_word(summary)})")
    ax.set_ylabel("speedup (x, steady-state throughput)")
    ax.set_xticks(xs)
    ax.legend(loc="upper left", fontsize=9)
    ax.set_title(title(summary, "Speedup: measured vs ideal and predicted"), fontsize=11)
    _label_points(ax, summary, at, right)
    return fig


LABEL_GAP_PT = 13  # a 9-point label is about 10.5 points tall


def _label_points(ax, summary: pd.DataFrame, at: dict, right: float) -> None:
    """One label per point, at its height beside its world size's points (left of them at the
    largest world size, so none runs past the right edge), each moved down only as far as it
    must to clear the label above it, or up where the stack would leave the axes."""
    ax.figure.tight_layout()  # the offsets are in points: measure them on the final layout
    to_pt = 72.0 / ax.figure.dpi
    bottom = ax.get_window_extent().y0 * to_pt
    for world_size, group in summary.groupby("world_size"):
        last = world_size >= right
        xs = [at[t] for t in group["topology"]]
        anchor = min(xs) if last else max(xs)
        rows = group.sort_values("speedup", ascending=False)
        ys = [ax.transData.transform((anchor, v))[1] * to_pt for v in rows["speedup"]]
        tops = []
        for y in ys:
            tops.append(min(y + 5, tops[-1] - LABEL_GAP_PT) if tops else y + 5)
        lift = max(0.0, bottom + LABEL_GAP_PT - tops[-1])
        for (_, row), y, top in zip(rows.iterrows(), ys, tops):
            ax.annotate(str(row["topology"]), (anchor, row["speedup"]), textcoords="offset points",
                        xytext=(-8 if last else 8, top + lift - y), ha="right" if last else "left",
                        va="top", fontsize=9)


def plot_speedup(data, path: str | Path) -> None:
    save(speedup_figure(data), path)


def _bar(summary: pd.DataFrame, values, color: str):
    fig, ax = new_axes()
    labels = summary["topology"].astype(str).tolist()
    bars = ax.bar(labels, values, color=color)
    ax.set_xlabel("topology (nodes x devices per node)")
    return fig, ax, bars


def efficiency_figure(data):
    """Parallel efficiency per topology; 1.0 means perfect linear scaling."""
    summary = data.finished
    fig, ax, bars = _bar(summary, summary["efficiency"], "tab:green")
    ax.axhline(1.0, color="grey", linestyle="--", label="ideal (1.0)")
    ax.axhline(data.threshold, color="tab:red", linestyle=":", label=f"threshold ({data.threshold:.0%})")
    ax.bar_label(bars, labels=[f"{v:.0%}" for v in summary["efficiency"]], fontsize=9, padding=2)
    top = max(1.0, float(summary["efficiency"].max()))
    ax.set_ylim(0, top * 1.15)
    ax.set_ylabel("parallel efficiency (speedup / device ratio)")
    # right of the axes: inside, any corner can hide a bar (the first bar stands at lower left)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9, borderaxespad=0)
    ax.set_title(title(summary, "Parallel efficiency"), fontsize=11)
    return fig


def plot_efficiency(data, path: str | Path) -> None:
    save(efficiency_figure(data), path)


def plot_throughput(data, path: str | Path) -> None:
    """Steady-state throughput per device: flat bars mean every device stays as busy."""
    summary = data.finished
    per_device = summary["throughput_samples_s"] / summary["world_size"]
    fig, ax, bars = _bar(summary, per_device, "tab:orange")
    ax.bar_label(bars, labels=[f"{v:,.0f}" for v in per_device], fontsize=9, padding=2)
    ax.set_ylim(0, float(per_device.max()) * 1.15)
    ax.set_ylabel("samples/s per device (steady state)")
    ax.set_title(title(summary, "Throughput per device"), fontsize=11)
    save(fig, path)


def figures() -> dict:
    """File name -> plot function, in the order the report shows them."""
    return {"speedup.png": plot_speedup, "efficiency.png": plot_efficiency,
            "throughput.png": plot_throughput, "breakdown.png": plot_breakdown,
            "busbw.png": plot_busbw}


COLORS = {"data": "tab:olive", "compute": "tab:blue", "comm": "tab:red", "loop_sync": "tab:orange",
          "overhead": "tab:gray"}


def plot_breakdown(data, path: str | Path) -> None:
    """Fractions of a training step per topology, measured by the probe and the training run."""
    fig, ax = new_axes()
    steps = data.steps.dropna(subset=["step_s"]) if len(data.steps) else data.steps  # n/a probes: no bars
    if steps.empty:
        ax.text(0.5, 0.5, "no probe results", ha="center", va="center", transform=ax.transAxes)
    else:
        labels = steps["topology"].astype(str).tolist()
        bottom = [0.0] * len(steps)
        for term in TERMS:
            values = steps[f"{term}_frac"].tolist()
            ax.bar(labels, values, bottom=bottom, color=COLORS[term], label=TERM_WORDS[term])
            bottom = [b + v for b, v in zip(bottom, values)]
        for i, (_, row) in enumerate(steps.iterrows()):
            ax.annotate(f"{row['step_s'] * 1e3:.1f} ms", (i, 1.0), ha="center",
                        textcoords="offset points", xytext=(0, 3), fontsize=8)
        ax.set_ylim(0, 1.1)  # room for the step times above the bars
    ax.set_xlabel("topology (nodes x devices per node)")
    if not steps.empty:
        # below the axes: five terms inside them covered the step times and the top of the bars
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, fontsize=7.5, borderaxespad=0)
    ax.set_ylabel("fraction of a training step")
    ax.set_title(title(data.summary, "Where a training step's time goes"), fontsize=11)
    save(fig, path)


def plot_busbw(data, path: str | Path) -> None:
    """All-reduce bus bandwidth against message size, one line per multi-device topology."""
    fig, ax = new_axes()
    drawn = 0
    grad_bytes = None
    for name, probe in sorted(measured(data.probes).items(), key=lambda kv: kv[1]["world_size"]):
        rows = [r for r in probe["allreduce"] if r.get("busbw_gbps")]
        if probe["world_size"] < 2 or not rows:
            continue
        ax.plot([r["bytes"] for r in rows], [r["busbw_gbps"] for r in rows], "o-",
                markersize=4, label=f"{name} ({probe['backend']})")
        grad_bytes = probe["gradient_bytes"]
        drawn += 1
    if drawn:
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.axvline(grad_bytes, color="grey", linestyle=":", label="gradient size")
        ax.legend(loc="upper left", fontsize=8)
    else:
        ax.text(0.5, 0.5, "no multi-device topology was probed", ha="center", va="center",
                transform=ax.transAxes)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s, nccl-tests definition)")
    ax.set_title(title(data.summary, "All-reduce bus bandwidth"), fontsize=11)
    save(fig, path)
