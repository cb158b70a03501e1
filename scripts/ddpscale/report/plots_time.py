"""Figures of where the time goes: step breakdown (stacked bars) and all-reduce bus bandwidth."""
from __future__ import annotations

from pathlib import Path

from ddpscale.report.breakdown import TERM_WORDS, TERMS, measured
from ddpscale.report.figure import new_axes, save, title

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
