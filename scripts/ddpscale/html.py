"""Build the single self-contained report.html.

Everything is inline (CSS, PNGs as data URIs) so the file can be mailed or
opened on an air-gapped cluster; every string from the data goes through
escape() because host and model names are not ours to trust.
"""
from __future__ import annotations

import base64
from html import escape

import pandas as pd

from ddpscale.analysis import device_word, hours_label

BANNER = ("These runs used CPU processes standing in for GPUs ({backend} backend). "
          "They check the pipeline, not GPU performance; do not read them as GPU results.")

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;
 max-width:1100px;margin:2em auto;padding:0 1em;color:#222;line-height:1.45}
h1{font-size:1.6em;margin-bottom:.2em} .headline{font-size:1.2em;margin:.4em 0 1em}
.banner{background:#fff3cd;border:2px solid #d39e00;padding:.8em 1em;
 font-weight:600;border-radius:4px;margin:1em 0}
table{border-collapse:collapse;font-size:.92em;margin:1em 0}
th,td{border:1px solid #ccc;padding:.3em .6em;text-align:right}
th{background:#f2f2f2} td.l,th.l{text-align:left}
.held{color:#1a7f37;font-weight:600} .failed{color:#cf222e;font-weight:600}
.na{color:#777} figure{display:inline-block;margin:.5em} img{max-width:100%}
code{background:#f6f8fa;padding:0 .25em}
"""


def _cap(text: str) -> str:
    # str.capitalize() would turn "GPU-hours" into "Gpu-hours".
    return text[:1].upper() + text[1:]


def _num(value, places: int) -> str:
    return "n/a" if pd.isna(value) else f"{value:,.{places}f}"


def _held_cell(held, tolerance: float) -> str:
    if pd.isna(held):
        return '<td class="l na">not logged</td>'
    if bool(held):
        return '<td class="l held">&#10003; held</td>'
    return (f'<td class="l failed">&#10007; not held (drop &gt; '
            f'{escape(f"{tolerance:g}")})</td>')


def headline(summary: pd.DataFrame) -> str:
    metric = summary.attrs.get("accuracy_metric", "accuracy")
    baseline = summary.attrs.get("baseline")
    top = summary.iloc[-1]  # sorted by world size, then nodes: the biggest run
    n = int(top["world_size"])
    if len(summary) == 1:
        text = (f"Only the baseline {top['topology']} ({n} {device_word(summary, n)}) "
                f"ran; add more topologies to measure scaling")
    else:
        text = (f"{top['topology']} ({n} {device_word(summary, n)}) reached "
                f"{top['speedup']:.1f}x speedup, {top['efficiency']:.0%} efficiency "
                f"over {baseline}")
    held = summary["accuracy_held"]
    failed = summary.loc[held.fillna(True).eq(False), "topology"].tolist()
    missing = summary.loc[held.isna(), "topology"].tolist()
    if len(missing) == len(summary):
        acc = f"accuracy ({metric}) not logged"
    elif failed:
        acc = f"accuracy ({metric}) NOT held in {', '.join(failed)}"
    else:
        acc = "accuracy held in all topologies" + (" where logged" if missing else "")
    if missing and len(missing) < len(summary):
        acc += f" (not logged in {', '.join(missing)})"
    return f"{text}; {acc}"


def format_table(summary: pd.DataFrame) -> str:
    metric = summary.attrs.get("accuracy_metric", "accuracy")
    tol = summary.attrs.get("tolerance", 0.0)
    heads = ["Topology", "Devices", "Repeats", "Speedup", "Efficiency",
             "Time speedup", "Fit time (s)", "Time / epoch (s)",
             "Throughput (samples/s)", _cap(hours_label(summary)),
             metric, "&Delta; vs baseline", "Accuracy"]
    rows = []
    for _, r in summary.iterrows():
        cells = [f'<td class="l">{escape(str(r["topology"]))}</td>',
                 f"<td>{int(r['world_size'])}</td>", f"<td>{int(r['repeats'])}</td>",
                 f"<td>{_num(r['speedup'], 2)}x</td>",
                 f"<td>{'n/a' if pd.isna(r['efficiency']) else format(r['efficiency'], '.0%')}</td>",
                 f"<td>{_num(r['time_speedup'], 2)}x</td>",
                 f"<td>{_num(r['fit_time_s'], 1)}</td>",
                 f"<td>{_num(r['time_per_epoch_s'], 2)}</td>",
                 f"<td>{_num(r['throughput_samples_s'], 0)}</td>",
                 f"<td>{_num(r['gpu_hours'], 4)}</td>",
                 f"<td>{_num(r[metric], 4)}</td>",
                 f"<td>{'n/a' if pd.isna(r['accuracy_delta']) else format(r['accuracy_delta'], '+.4f')}</td>",
                 _held_cell(r["accuracy_held"], tol)]
        rows.append("<tr>" + "".join(cells) + "</tr>")
    head = "".join(f"<th>{h if h.startswith('&') else escape(h)}</th>" for h in heads)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def _unique(runs: pd.DataFrame, col: str) -> list:
    if col not in runs.columns:
        return []
    return list(dict.fromkeys(str(v) for v in runs[col] if v is not None and not
                              (isinstance(v, float) and pd.isna(v))))


def _methods(summary: pd.DataFrame, runs: pd.DataFrame) -> str:
    base = escape(str(summary.attrs.get("baseline")))
    hours = hours_label(summary)
    items = []
    for mode in _unique(runs, "scaling"):
        sub = runs[runs["scaling"] == mode]
        if mode == "weak":
            what = (f"fixed batch per device ({', '.join(_unique(sub, 'batch_per_device'))} samples); "
                    "the global batch grows with the number of devices")
        elif mode == "strong":
            what = (f"fixed global batch ({', '.join(_unique(sub, 'effective_batch'))} samples); "
                    "the batch per device shrinks as devices are added")
        else:
            what = "unknown mode"
        items.append(f"<b>Scaling mode: {escape(mode)}</b> = {escape(what)}.")
    warm = ", ".join(_unique(runs, "warmup_epochs")) or "0"
    items += [
        f"<b>Steady-state throughput</b> = training samples across all ranks / training "
        f"time, over the epochs after the first {escape(warm)} warmup epoch(s); "
        "validation batches excluded. Repeats of a topology are combined by the median.",
        "<b>Fit time</b> = sum of epoch times (train + validation) of useful work. A run "
        "resumed from a checkpoint counts each finished epoch once; the interrupted "
        "partial epoch is excluded.",
        f"<b>Speedup</b> = throughput / throughput({base}). <b>Efficiency</b> = speedup / "
        f"(world size / world size({base})); 100% is perfect linear scaling. "
        f"<b>Time speedup</b> = fit time({base}) / fit time.",
        f"<b>{escape(_cap(hours))}</b> = fit time (s) &times; world size / 3600.",
        f"<b>Accuracy held</b> = {escape(str(summary.attrs.get('accuracy_metric')))} "
        f"&minus; baseline value &ge; &minus;{escape(str(summary.attrs.get('tolerance')))}"
        " (a gain is fine); &ldquo;not logged&rdquo; when the run has no such value.",
    ]
    hosts = sorted({str(h) for hs in runs.get("hosts", []) for h in (hs or [])})
    items.append(f"<b>Hosts:</b> {escape(', '.join(hosts) or 'unknown')}.")
    items.append(f"<b>Devices:</b> {escape(', '.join(_unique(runs, 'device_name')))} "
                 f"({escape(', '.join(_unique(runs, 'backend')))} backend).")
    versions = {", ".join(f"{k} {v}" for k, v in (vs or {}).items())
                for vs in runs.get("versions", [])}
    items.append(f"<b>Versions:</b> {escape('; '.join(sorted(versions)) or 'unknown')}.")
    if "resumed_from_epoch" in runs.columns:
        resumed = runs[runs["resumed_from_epoch"].notna()]
        if len(resumed):
            names = ", ".join(f"{t} repeat {r}" for t, r in
                              zip(resumed["topology"], resumed["repeat"]))
            items.append(f"<b>Resumed from a checkpoint:</b> {escape(names)}.")
    return "<ul>" + "".join(f"<li>{i}</li>" for i in items) + "</ul>"


def build_report(summary: pd.DataFrame, runs: pd.DataFrame,
                 images: dict[str, bytes]) -> str:
    """images: figure title -> PNG bytes, embedded in the given order."""
    banner = ""
    if bool(summary["simulated"].any()):
        sim = runs[runs["simulated"].astype(bool)]
        backend = ", ".join(_unique(sim, "backend")) or "gloo"
        banner = f'<div class="banner">{escape(BANNER.format(backend=backend))}</div>'
    figures = "".join(
        f'<figure><img alt="{escape(name)}" src="data:image/png;base64,'
        f'{base64.b64encode(data).decode("ascii")}"></figure>'
        for name, data in images.items())
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<title>ddpscale: DDP scaling report</title>"
        f"<style>{CSS}</style></head><body>"
        "<h1>ddpscale: DDP scaling report</h1>"
        f'<p class="headline">{escape(headline(summary))}.</p>{banner}'
        f"<h2>Results</h2>{format_table(summary)}"
        f"<h2>Plots</h2>{figures}"
        f"<h2>How these numbers are computed</h2>{_methods(summary, runs)}"
        "</body></html>\n")
