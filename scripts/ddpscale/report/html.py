"""Build the single self-contained report.html.

Everything is inline (CSS, PNGs as data URIs) so the file can be mailed or
opened on an air-gapped cluster; every string from the data goes through
escape() because host and model names are not ours to trust.
"""
from __future__ import annotations

import base64
from html import escape

import pandas as pd

from ddpscale.report import accuracy, boundness, measured
from ddpscale.report.analysis import device_word, hours_label
from ddpscale.report.html_tables import TABLES
from ddpscale.report.verdict import RECOMPILES_ALLOWED, markers, times

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
.na{color:#777} code{background:#f6f8fa;padding:0 .25em}
#verdict{border:2px solid #0969da;border-radius:6px;padding:.6em 1.2em;margin:1em 0;background:#f6faff}
.recommendation{font-size:1.25em;font-weight:600;margin:.3em 0}
tr.failed-row td{background:#ffebe9} tr.missing-row td{background:#f6f8fa;color:#555}
.spread{color:#666;font-size:.85em} .off{color:#9a6700}
figure{display:inline-block;margin:.5em;vertical-align:top;width:480px}
figure img{width:100%} figcaption{font-size:.85em;color:#444}
h2{margin-top:1.4em;border-bottom:1px solid #ddd} p.note{font-size:.9em;color:#444;margin:.2em 0}
.caveat{color:#9a6700;font-weight:600} tr.caveat-row td{background:#fff8c5}
p.caveat{color:#222;font-weight:normal;border-left:4px solid #d39e00;padding-left:.6em}
.tag{display:block;min-width:10em;font-size:.85em} p.caveat code{white-space:nowrap}
#measured{display:grid;grid-template-columns:max-content 1fr;gap:.1em .9em;font-size:.85em;margin:.4em 0 1em}
#measured dt{font-weight:600} #measured dd{margin:0}
"""


def _cap(text: str) -> str:
    # str.capitalize() would turn "GPU-hours" into "Gpu-hours".
    return text[:1].upper() + text[1:]


def headline(summary: pd.DataFrame) -> str:
    metric = summary.attrs.get("accuracy_metric", "accuracy")
    baseline = summary.attrs.get("baseline")
    top = summary.iloc[-1]  # sorted by world size, then nodes: the biggest run
    n = int(top["world_size"])
    devices = "; ".join([f"{n} {device_word(summary, n)}", *markers(top)])
    if len(summary) == 1:
        text = (f"Only the baseline {top['topology']} ({devices}) "
                f"ran; add more topologies to measure scaling")
    else:
        text = (f"{top['topology']} ({devices}) reached "
                f"{times(top['speedup'])} speedup, {top['efficiency']:.0%} efficiency "
                f"over {baseline}")
    held = summary["accuracy_held"]
    failed = summary.loc[held.fillna(True).eq(False), "topology"].tolist()
    missing = summary.loc[held.isna(), "topology"].tolist()
    if summary.attrs.get("accuracy_not_compared") or len(missing) == len(summary):
        acc = f"accuracy not compared ({metric} not logged)"
    elif failed:
        acc = f"accuracy ({metric}) NOT held in {', '.join(failed)}"
    else:
        acc = "accuracy held in all topologies" + (" where logged" if missing else "")
    if missing and len(missing) < len(summary):
        acc += f" (not logged in {', '.join(missing)})"
    return f"{text}; {acc}"


def _unique(runs: pd.DataFrame, col: str) -> list:
    if col not in runs.columns:
        return []
    return list(dict.fromkeys(str(v) for v in runs[col] if v is not None and not
                              (isinstance(v, float) and pd.isna(v))))


def _settings(runs: pd.DataFrame) -> str:
    """Precision and torch.compile as the runs recorded them (runs before compile existed: none)."""
    text = f"precision {', '.join(_unique(runs, 'precision')) or 'unknown'}; torch.compile "
    text += ", ".join(_unique(runs, "compile")) or "none"
    if "compile_graph_breaks" in runs.columns and runs["compile_graph_breaks"].notna().any():
        text += (f" ({', '.join(_unique(runs, 'compile_graphs'))} graph(s), "
                 f"{', '.join(_unique(runs, 'compile_graph_breaks'))} graph break(s)")
        recompiles = pd.to_numeric(runs.get("compile_recompiles", pd.Series(dtype=float)),
                                   errors="coerce")
        if recompiles.notna().any():  # runs without the key make the column float: show ints
            counts = dict.fromkeys(str(int(v)) for v in recompiles.dropna())
            text += f", {', '.join(counts)} recompilation(s)"
        text += " per run)"
    return text


def _accuracy_rule(summary: pd.DataFrame) -> str:
    metric = escape(str(summary.attrs.get("accuracy_metric")))
    tol = escape(str(summary.attrs.get("tolerance")))
    way = summary.attrs.get("accuracy_direction", "max")
    rule = (f"{metric} &minus; baseline value &ge; &minus;{tol}" if way == "max"
            else f"{metric} &minus; baseline value &le; {tol}")
    return (f"<b>Accuracy held</b> = {rule} ({escape(accuracy.better(way))}; a change the better way is "
            "fine); &ldquo;not logged&rdquo; when the run has no such value. Any metric the module logs "
            "can be compared (config <code>accuracy.metric</code>, <code>accuracy.mode</code>).")


def _caveat_rules(summary: pd.DataFrame) -> str:
    """How the verdict decides what a number cannot mean (verdict.caveats, boundness)."""
    rules = []
    if bool(summary["simulated"].any()):
        rules.append("a CPU-simulated run with more ranks on one host than usable cores is "
                     "<i>oversubscribed</i> (its ranks took turns on the cores: contention, not "
                     "scaling) and left out of the recommendation")
    rules += [
        "a topology whose nodes were simulated on one host crossed no network",
        "the workload is called <i>overhead-bound</i> when compute is under "
        f"{boundness.COMPUTE_SHARE_MIN:.0%} of the baseline's step (probe) or, on GPUs, the "
        f"baseline's mean utilisation is under {boundness.GPU_UTILIZATION_MIN_PCT:.0f}%",
        f"more than {RECOMPILES_ALLOWED} torch.compile recompilation in a topology is named",
    ]
    return "<b>Caveats</b>: " + "; ".join(rules) + "."


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
        _accuracy_rule(summary),
    ]
    items.append(_caveat_rules(summary))
    hosts = sorted({str(h) for hs in runs.get("hosts", []) for h in (hs or [])})
    items.append(f"<b>Hosts:</b> {escape(', '.join(hosts) or 'unknown')}.")
    items.append(f"<b>Devices:</b> {escape(', '.join(_unique(runs, 'device_name')))} "
                 f"({escape(', '.join(_unique(runs, 'backend')))} backend).")
    items.append(f"<b>Training settings:</b> {escape(_settings(runs))}.")
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


CAPTIONS = {
    "speedup.png": "Speedup of steady-state throughput over the baseline: measured (a marker per "
                   "node count; 1x2 and 2x1 side by side), "
                   "ideal linear scaling (dashed) and predicted from the baseline step plus the "
                   "measured all-reduce (squares).",
    "efficiency.png": "Parallel efficiency = speedup / device ratio; the dotted line is the "
                      "threshold the recommendation uses.",
    "throughput.png": "Steady-state samples per second per device; equal bars mean perfect scaling.",
    "breakdown.png": "Fractions of one training step: data wait, compute, exposed gradient "
                     "communication and framework overhead (label: step time).",
    "busbw.png": "All-reduce bus bandwidth over message sizes from 1 KB to the gradient size.",
}


def _verdict(data) -> str:
    summary = data.summary
    finished = data.finished
    parts = [f'<p class="recommendation">{escape(data.recommendation)}.</p>']
    if len(finished):
        parts.append(f"<p>{escape(headline(finished))}.</p>")
    command = escape(f"--configfile {boundness.TRANSFORMER_CONFIG}")
    parts += [f'<p class="caveat">{escape(note).replace(command, f"<code>{command}</code>")}</p>'
              for note in data.notes]
    failed = finished.loc[finished["accuracy_held"].fillna(True).eq(False), "topology"].tolist()
    if failed:
        parts.append(f'<p class="failed">Accuracy fell more than the tolerance in '
                     f'{escape(", ".join(failed))}: excluded from the recommendation.</p>')
    unfinished = summary[summary["status"] != "ok"]
    if len(unfinished):
        items = "; ".join(f"{t}: {s}" for t, s in zip(unfinished["topology"], unfinished["status"]))
        parts.append(f'<p class="failed">Not complete: {escape(items)}.</p>')
    if bool(summary["simulated"].any()):
        sim = data.runs[data.runs["simulated"].astype(bool)]
        backend = ", ".join(_unique(sim, "backend")) or "gloo"
        parts.append(f'<div class="banner">{escape(BANNER.format(backend=backend))}</div>')
    return '<section id="verdict"><h2>Verdict</h2>' + "".join(parts) + "</section>"


def _tables(data) -> str:
    out = []
    for make in TABLES:
        made = make(data)
        if made is not None:
            heading, note, table = made
            out.append(f'<h2>{escape(heading)}</h2><p class="note">{note}</p>{table}')
    return '<section id="tables">' + "".join(out) + "</section>"


def _plots(images: dict[str, bytes]) -> str:
    figures = "".join(
        f'<figure><img alt="{escape(name.removesuffix(".png"))}" src="data:image/png;base64,'
        f'{base64.b64encode(png).decode("ascii")}"><figcaption>{escape(CAPTIONS.get(name, ""))}'
        "</figcaption></figure>" for name, png in images.items())
    return f'<section id="plots"><h2>Plots</h2>{figures}</section>'


def _measured(description: dict) -> str:
    """What was measured, under the title: two reports of different workloads never look alike."""
    # a list of facts, not a data table: the tables (each under its heading) follow the verdict
    items = "".join(f"<dt>{escape(measured.LABELS[k])}</dt><dd>{escape(str(v))}</dd>" for k, v in description.items())
    return f'<dl id="measured">{items}</dl>'


def build_report(data, images: dict[str, bytes]) -> str:
    """The whole page: what was measured, the verdict, then the tables, the plots and the methods."""
    title = escape(measured.headline(data.description))
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>ddpscale: {title}</title>"
        f"<style>{CSS}</style></head><body>"
        f"<h1>ddpscale: {title}</h1>{_measured(data.description)}"
        f"{_verdict(data)}{_tables(data)}{_plots(images)}"
        f'<section id="methods"><h2>How these numbers are computed</h2>'
        f"{_methods(data.summary, data.runs)}</section>"
        "</body></html>\n")
