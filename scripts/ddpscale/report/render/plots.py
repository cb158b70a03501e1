"""The report's figures, one function each: speedup, efficiency and throughput per device
(scaling), the step breakdown and the all-reduce bus bandwidth (where the time goes), the first
screen's overview (speedup and efficiency side by side), and the list of every figure
(figures()). Each is written as PNG for the page and as SVG and PDF beside it, for papers
(for_papers()).

Colours are Okabe and Ito's colour-blind-safe palette; measured points are filled markers with
error bars from their 95% intervals, predicted ones hollow on a dotted line, so neither colour
nor shape alone tells them apart.

Figures are built on matplotlib.figure.Figure with an explicit Agg canvas instead of pyplot:
no global backend switch, no display needed, and no figure left open in a long-lived process.
"""
from __future__ import annotations

import io
import re
from pathlib import Path

import matplotlib
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from ddpscale.core.io import text_safe
from ddpscale.report.figures.breakdown import TERM_WORDS, TERMS, measured
from ddpscale.report.figures.scaling import baseline_world_size, device_word
from ddpscale.report.fmt import known

# Okabe & Ito (2008), "Color Universal Design": told apart with every common colour-vision deficiency.
OKABE_ITO = {"black": "#000000", "orange": "#E69F00", "sky": "#56B4E9", "green": "#009E73",
             "yellow": "#F0E442", "blue": "#0072B2", "vermillion": "#D55E00", "purple": "#CC79A7"}
MEASURED, PREDICTED, IDEAL = OKABE_ITO["blue"], OKABE_ITO["vermillion"], "#777777"


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


# matplotlib names clip paths and markers by a hash salted with a fresh uuid4 unless told a salt:
# a fixed one keeps the ids, and so the file, the same while the figure is.
SVG_SALT = "ddpscale"


def svg(fig: Figure) -> str:
    """The figure as SVG text with its words as <text> (not outlines), so a reader can select and
    search them, a screen reader can read them, and a test can measure each label's box; no
    date in it and fixed ids, so an unchanged figure writes the same file."""
    buf = io.BytesIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": SVG_SALT}):
        fig.savefig(buf, format="svg", metadata={"Date": None}, bbox_inches="tight")
    # XML allows no control character but tab, newline and CR: a name with ESC in it would leave
    # a file no browser draws
    return text_safe(buf.getvalue().decode("utf-8"))


def pdf(fig: Figure) -> bytes:
    """The figure as PDF with its words as text in an embedded TrueType font (fonttype 42), not
    Type 3 glyph drawings: a reader can select and search them and a journal's checks find real
    fonts; no creation date, so an unchanged figure writes the same bytes."""
    buf = io.BytesIO()
    with matplotlib.rc_context({"pdf.fonttype": 42}):
        fig.savefig(buf, format="pdf", metadata={"CreationDate": None}, bbox_inches="tight")
    return buf.getvalue()


def inline_svg(fig: Figure, label: str) -> str:
    """An <svg> to put into the page: the XML prologue dropped, a role and a label for screen readers."""
    text = svg(fig)
    text = text[text.index("<svg"):]
    # HTML needs no namespaces and no metadata; without them the page names no URL at all
    text = re.sub(r"<metadata>.*?</metadata>\s*", "", text, count=1, flags=re.S)
    text = re.sub(r'\s+xmlns(:\w+)?="[^"]*"', "", text)
    return re.sub(r"<svg\b", f'<svg role="img" aria-label="{_attr(label)}"', text, count=1)


def _attr(text: str) -> str:
    return text.replace("&", "&amp;").replace('"', "&quot;").replace("<", "&lt;")


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
    fig, ax = new_axes()
    draw_speedup(ax, data)
    return fig


def draw_speedup(ax, data, labels: bool = True):
    """The speedup plot on ax; labels=False leaves the points' labels to the caller (label_points
    measures the final layout, so a figure that lays out after drawing labels after that)."""
    summary = data.finished
    base_ws = baseline_world_size(summary, data.comparison.baseline)
    xs = sorted(set(summary["world_size"].astype(float)) | {float(base_ws)})
    ax.plot(xs, [x / base_ws for x in xs], "--", color=IDEAL, label="ideal (linear)")
    at = dict(zip(summary["topology"], _dodged(summary, xs)))
    pred = data.prediction
    if len(pred):
        pred = pred.dropna(subset=["predicted_efficiency"])  # a topology whose probe failed: unknown
    if len(pred):
        pred = pred.assign(x=[at.get(t, w) for t, w in zip(pred["topology"], pred["world_size"])])
        pred = pred.sort_values("x")
        ax.plot(pred["x"], pred["predicted_efficiency"] * pred["world_size"] / base_ws,
                "s:", color=PREDICTED, markerfacecolor="white", markersize=6,
                label="predicted (baseline + all-reduce)")
    for k, (count, group) in enumerate(summary.groupby("num_nodes")):
        low, high = _error_bars(group, "speedup")
        ax.errorbar([at[t] for t in group["topology"]], group["speedup"], yerr=[low, high],
                    fmt=NODE_MARKERS[k % len(NODE_MARKERS)], color=MEASURED, markersize=7, capsize=3,
                    label=f"measured, {int(count)} node{'s' if count != 1 else ''}")
    right = max(xs)
    ax.set_xlim(0, right + max(1.0, 0.1 * right))
    ax.set_ylim(bottom=0)
    ax.set_xlabel(f"world size (number of {device_word(summary)})")
    ax.set_ylabel("speedup (x, steady-state throughput)")
    ax.set_xticks(xs)
    ax.legend(loc="upper left", fontsize=9)
    ax.set_title(title(summary, "Speedup: measured vs ideal and predicted"), fontsize=11)
    if labels:
        ax.figure.tight_layout()
        label_points(ax, summary, at, right)
    return summary, at, right


def _error_bars(rows: pd.DataFrame, figure: str) -> tuple[list[float], list[float]]:
    """Below and above each figure (speedup or efficiency), from its 95% interval as the tables
    show it (scaling.add_intervals: the baseline's is its own throughput's; 0 where there is none)."""
    low, high = [], []
    for _, r in rows.iterrows():
        has = known(r.get(f"{figure}_low")) and known(r.get(f"{figure}_high"))
        low.append(r[figure] - r[f"{figure}_low"] if has else 0.0)
        high.append(r[f"{figure}_high"] - r[figure] if has else 0.0)
    return low, high


LABEL_GAP_PT = 13  # a 9-point label is about 10.5 points tall


def label_points(ax, summary: pd.DataFrame, at: dict, right: float) -> None:
    """One label per point, at its height beside its world size's points (left of them at the
    largest world size, so none runs past the right edge), each moved down only as far as it
    must to clear the label above it, or up where the stack would leave the axes."""
    # the offsets are in points: the caller has laid the figure out already
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
    fig, ax = new_axes()
    draw_efficiency(ax, data)
    # right of the axes: inside, any corner can hide a bar (the first bar stands at lower left)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9, borderaxespad=0)
    return fig


def draw_efficiency(ax, data) -> None:
    """Bars with 95% intervals, the ideal and the recommendation's threshold; each bar's figure
    inside it, where no error bar or line can cross it."""
    summary = data.finished
    labels = summary["topology"].astype(str).tolist()
    bars = ax.bar(labels, summary["efficiency"], color=OKABE_ITO["green"], yerr=_error_bars(summary, "efficiency"),
                  error_kw={"ecolor": "black", "capsize": 3, "elinewidth": 1})
    ax.set_xlabel("topology (nodes x devices per node)")
    ax.axhline(1.0, color=IDEAL, linestyle="--", label="ideal (1.0)")
    ax.axhline(data.threshold, color=PREDICTED, linestyle=":", label=f"threshold ({data.threshold:.0%})")
    ax.bar_label(bars, labels=[f"{v:.0%}" for v in summary["efficiency"]], fontsize=9, label_type="center",
                 color="white", fontweight="bold")
    highs = summary["efficiency_high"] if "efficiency_high" in summary else summary["efficiency"]
    top = max(1.0, float(summary["efficiency"].max()), float(highs.fillna(0).max()))
    ax.set_ylim(0, top * 1.15)
    ax.set_ylabel("parallel efficiency (speedup / device ratio)")
    ax.set_title(title(summary, "Parallel efficiency"), fontsize=11)


def overview_figure(data):
    """The first screen's picture: speedup (left) and efficiency (right), one legend below both."""
    fig = Figure(figsize=(9.0, 3.9), dpi=DPI)
    FigureCanvasAgg(fig)
    left, right = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1.15, 1]})
    for ax in (left, right):
        ax.grid(True, alpha=0.4)
        ax.set_axisbelow(True)
    placed = draw_speedup(left, data, labels=False)
    draw_efficiency(right, data)
    for ax, short in ((left, "Speedup"), (right, "Efficiency")):
        ax.set_title(title(data.summary, short), fontsize=10)
        ax.xaxis.label.set_size(9)
        ax.yaxis.label.set_size(9)
    left.set_ylabel("speedup (x)")
    right.set_ylabel("parallel efficiency")
    handles = [*left.get_legend_handles_labels()[0], *right.get_legend_handles_labels()[0][1:]]
    names = [*left.get_legend_handles_labels()[1], *right.get_legend_handles_labels()[1][1:]]
    left.get_legend().remove()
    fig.legend(handles, names, loc="lower center", ncol=3, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.14, 1, 1))
    label_points(left, *placed)
    return fig


def plot_efficiency(data, path: str | Path) -> None:
    save(efficiency_figure(data), path)


def throughput_figure(data):
    """Steady-state throughput per device: flat bars mean every device stays as busy."""
    summary = data.finished
    per_device = summary["throughput_samples_s"] / summary["world_size"]
    fig, ax, bars = _bar(summary, per_device, OKABE_ITO["orange"])
    ax.bar_label(bars, labels=[f"{v:,.0f}" for v in per_device], fontsize=9, padding=2)
    ax.set_ylim(0, float(per_device.max()) * 1.15)
    ax.set_ylabel("samples/s per device (steady state)")
    ax.set_title(title(summary, "Throughput per device"), fontsize=11)
    return fig


def plot_throughput(data, path: str | Path) -> None:
    save(throughput_figure(data), path)


def figures() -> dict:
    """File name -> plot function, in the order the report shows them."""
    return {"speedup.png": plot_speedup, "efficiency.png": plot_efficiency,
            "throughput.png": plot_throughput, "breakdown.png": plot_breakdown,
            "busbw.png": plot_busbw}


def _laid_out(data):
    """(name, figure) of the overview and of each PNG's figure, laid out as save() lays out the PNG."""
    made = {"overview": overview_figure, "speedup": speedup_figure, "efficiency": efficiency_figure,
            "throughput": throughput_figure, "breakdown": breakdown_figure, "busbw": busbw_figure}
    for name, figure in made.items():
        fig = figure(data)
        if name != "overview":  # the overview lays itself out around its legend
            fig.tight_layout()
        yield name, fig


def for_papers(data) -> dict[str, bytes]:
    """File name -> the bytes of every figure and the overview as SVG and as PDF, to write beside
    the report: each figure built once for both."""
    out = {}
    for name, fig in _laid_out(data):
        out[f"{name}.svg"] = svg(fig).encode("utf-8")
        out[f"{name}.pdf"] = pdf(fig)
    return out


COLORS = {"data": OKABE_ITO["yellow"], "compute": OKABE_ITO["blue"], "comm": OKABE_ITO["vermillion"],
          "loop_sync": OKABE_ITO["orange"], "overhead": "#999999"}


def breakdown_figure(data):
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
    return fig


def plot_breakdown(data, path: str | Path) -> None:
    save(breakdown_figure(data), path)


def busbw_figure(data):
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
    return fig


def plot_busbw(data, path: str | Path) -> None:
    save(busbw_figure(data), path)
