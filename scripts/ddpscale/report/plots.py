"""The scaling figures (speedup, efficiency, throughput per device), one function each, as PNG,
and the list of every report figure (figures())."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from ddpscale.report.analysis import baseline_world_size, device_word
from ddpscale.report.figure import new_axes, save, title
from ddpscale.report.plots_time import plot_breakdown, plot_busbw


def plot_speedup(data, path: str | Path) -> None:
    """Measured throughput speedup against the ideal line and the prediction."""
    summary = data.finished
    fig, ax = new_axes()
    base_ws = baseline_world_size(summary)
    ws = summary["world_size"].astype(float)
    xs = sorted(set(ws) | {float(base_ws)})
    ax.plot(xs, [x / base_ws for x in xs], "--", color="grey", label="ideal (linear)")
    pred = data.prediction
    if len(pred):
        pred = pred.dropna(subset=["predicted_efficiency"])  # a topology whose probe failed: unknown
    if len(pred):
        pred = pred.sort_values("world_size")
        ax.plot(pred["world_size"], pred["predicted_efficiency"] * pred["world_size"] / base_ws,
                "s:", color="tab:purple", markersize=6, label="predicted (baseline + all-reduce)")
    ax.plot(ws, summary["speedup"], "o", color="tab:blue", markersize=7, label="measured")
    for _, row in summary.iterrows():
        ax.annotate(str(row["topology"]), (row["world_size"], row["speedup"]),
                    textcoords="offset points", xytext=(6, -10), fontsize=9)
    ax.set_xlabel(f"world size (number of {device_word(summary)})")
    ax.set_ylabel("speedup (x, steady-state throughput)")
    ax.set_xticks(xs)
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.legend(loc="upper left", fontsize=9)
    ax.set_title(title(summary, "Speedup: measured vs ideal and predicted"), fontsize=11)
    save(fig, path)


def _bar(summary: pd.DataFrame, values, color: str):
    fig, ax = new_axes()
    labels = summary["topology"].astype(str).tolist()
    bars = ax.bar(labels, values, color=color)
    ax.set_xlabel("topology (nodes x devices per node)")
    return fig, ax, bars


def plot_efficiency(data, path: str | Path) -> None:
    """Parallel efficiency per topology; 1.0 means perfect linear scaling."""
    summary = data.finished
    fig, ax, bars = _bar(summary, summary["efficiency"], "tab:green")
    ax.axhline(1.0, color="grey", linestyle="--", label="ideal (1.0)")
    ax.axhline(data.threshold, color="tab:red", linestyle=":", label=f"threshold ({data.threshold:.0%})")
    ax.bar_label(bars, labels=[f"{v:.0%}" for v in summary["efficiency"]], fontsize=9, padding=2)
    top = max(1.0, float(summary["efficiency"].max()))
    ax.set_ylim(0, top * 1.15)
    ax.set_ylabel("parallel efficiency (speedup / device ratio)")
    ax.legend(loc="lower left", fontsize=9)
    ax.set_title(title(summary, "Parallel efficiency"), fontsize=11)
    save(fig, path)


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
