"""The three report figures, one function each, written as PNG.

Figures are built on matplotlib.figure.Figure with an explicit Agg canvas
instead of pyplot: no global backend switch, no display needed, and no
figure left open in a long-lived process.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from ddpscale.analysis import baseline_world_size, device_word

FIGSIZE = (6.0, 4.0)
DPI = 110


def _title(summary: pd.DataFrame, what: str) -> str:
    # Simulated numbers must never be mistaken for GPU results, even when a
    # figure is copied out of the report on its own.
    if bool(summary["simulated"].any()):
        return f"{what} (CPU-simulated devices)"
    return what


def _new_axes():
    fig = Figure(figsize=FIGSIZE, dpi=DPI)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.grid(True, alpha=0.4)
    ax.set_axisbelow(True)
    return fig, ax


def _save(fig: Figure, path: str | Path) -> None:
    fig.tight_layout()
    # format given explicitly so callers may write to a temp name first.
    fig.savefig(path, format="png", dpi=DPI)


def plot_speedup(summary: pd.DataFrame, path: str | Path) -> None:
    """Measured throughput speedup against the ideal linear line."""
    fig, ax = _new_axes()
    base_ws = baseline_world_size(summary)
    ws = summary["world_size"].astype(float)
    xs = sorted(set(ws) | {float(base_ws)})
    ax.plot(xs, [x / base_ws for x in xs], "--", color="grey", label="ideal (linear)")
    ax.plot(ws, summary["speedup"], "o", color="tab:blue", markersize=7,
            label="measured")
    for _, row in summary.iterrows():
        ax.annotate(str(row["topology"]), (row["world_size"], row["speedup"]),
                    textcoords="offset points", xytext=(6, -10), fontsize=9)
    ax.set_xlabel(f"world size (number of {device_word(summary)})")
    ax.set_ylabel("speedup (x, steady-state throughput)")
    ax.set_xticks(xs)
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.legend(loc="upper left")
    ax.set_title(_title(summary, "Speedup vs ideal"), fontsize=11)
    _save(fig, path)


def _bar(summary: pd.DataFrame, column: str, color: str):
    fig, ax = _new_axes()
    labels = summary["topology"].astype(str).tolist()
    bars = ax.bar(labels, summary[column], color=color)
    ax.set_xlabel("topology (nodes x devices per node)")
    return fig, ax, bars


def plot_efficiency(summary: pd.DataFrame, path: str | Path) -> None:
    """Parallel efficiency per topology; 1.0 means perfect linear scaling."""
    fig, ax, bars = _bar(summary, "efficiency", "tab:green")
    ax.axhline(1.0, color="grey", linestyle="--", label="ideal (1.0)")
    ax.bar_label(bars, labels=[f"{v:.0%}" for v in summary["efficiency"]],
                 fontsize=9, padding=2)
    top = max(1.0, float(summary["efficiency"].max()))
    ax.set_ylim(0, top * 1.15)
    ax.set_ylabel("parallel efficiency (speedup / device ratio)")
    ax.legend(loc="lower left")
    ax.set_title(_title(summary, "Parallel efficiency"), fontsize=11)
    _save(fig, path)


def plot_throughput(summary: pd.DataFrame, path: str | Path) -> None:
    """Steady-state training throughput (all ranks) per topology."""
    fig, ax, bars = _bar(summary, "throughput_samples_s", "tab:orange")
    ax.bar_label(bars, labels=[f"{v:,.0f}" for v in summary["throughput_samples_s"]],
                 fontsize=9, padding=2)
    ax.set_ylim(0, float(summary["throughput_samples_s"].max()) * 1.15)
    ax.set_ylabel("throughput (samples/s, steady state)")
    ax.set_title(_title(summary, "Steady-state throughput"), fontsize=11)
    _save(fig, path)


FIGURES = {
    "speedup.png": plot_speedup,
    "efficiency.png": plot_efficiency,
    "throughput.png": plot_throughput,
}
