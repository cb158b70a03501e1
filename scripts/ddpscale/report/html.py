"""Build the single self-contained report.html.

Everything is inline (CSS, PNGs as data URIs) so the file can be mailed or
opened on an air-gapped cluster. The markup is templates/report.html.j2, rendered with
autoescaping (templating.py): host and model names are not ours to trust, so every value is
text unless it is Markup built here from escaped parts.
"""
from __future__ import annotations

import base64

import pandas as pd
from markupsafe import Markup

from ddpscale.report import accuracy, boundness, description
from ddpscale.report.analysis import device_word, hours_label
from ddpscale.report.comparison import Comparison
from ddpscale.report.html_tables import TABLES, tta_method, tta_table
from ddpscale.report.templating import render
from ddpscale.report.verdict import RECOMPILES_ALLOWED, markers, times

BANNER = ("These runs used CPU processes standing in for GPUs ({backend} backend). "
          "They check the pipeline, not GPU performance; do not read them as GPU results.")


def headline(summary: pd.DataFrame, comparison: Comparison) -> str:
    metric, baseline = comparison.metric, comparison.baseline
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
    others = summary[summary["topology"] != baseline]
    failed = summary.loc[held.fillna(True).eq(False), "topology"].tolist()
    missing = summary.loc[accuracy.unlogged(summary), "topology"].tolist()
    untested = others.loc[accuracy.untested(others), "topology"].tolist()
    unclear = others.loc[accuracy.inconclusive(others), "topology"].tolist()
    if not comparison.compared or len(missing) == len(summary):
        acc = f"accuracy not compared ({comparison.why_not_compared()})"
    elif failed:
        acc = f"accuracy ({metric}) NOT held in {', '.join(failed)}"
    elif untested and len(untested) + len(missing) == len(others):
        acc = f"accuracy not tested ({accuracy.seeds_word(int(others['repeats'].min()))} each)"
    elif unclear or untested:
        acc = "accuracy held where tested" + "".join(
            f"; {what} in {', '.join(names)}" for what, names in (("inconclusive", unclear), ("not tested", untested))
            if names)
    else:
        acc = "accuracy held in all topologies" + (" where logged" if missing else "")
    if missing and len(missing) < len(summary):
        acc += f" (not logged in {', '.join(missing)})"
    return f"{text}; {acc}"


def _unique(runs: pd.DataFrame, col: str) -> list:
    return list(dict.fromkeys(str(v) for v in runs[col] if v is not None and not
                              (isinstance(v, float) and pd.isna(v))))


def _settings(runs: pd.DataFrame) -> str:
    """Precision and torch.compile as the runs recorded them."""
    text = f"precision {', '.join(_unique(runs, 'precision'))}; torch.compile "
    text += ", ".join(_unique(runs, "compile"))
    # the compile statistics: only runs with torch.compile count them
    if "compile_graph_breaks" in runs.columns and runs["compile_graph_breaks"].notna().any():
        text += (f" ({', '.join(_unique(runs, 'compile_graphs'))} graph(s), "
                 f"{', '.join(_unique(runs, 'compile_graph_breaks'))} graph break(s)")
        recompiles = pd.to_numeric(runs["compile_recompiles"], errors="coerce")
        if recompiles.notna().any():  # NaN in the rows of runs without compile make the column float: show ints
            counts = dict.fromkeys(str(int(v)) for v in recompiles.dropna())
            text += f", {', '.join(counts)} recompilation(s)"
        text += " per run)"
    return text


def _accuracy_rule(comparison: Comparison) -> Markup:
    way = comparison.direction
    rule = (Markup("{} &minus; baseline value &ge; &minus;{}") if way == "max"
            else Markup("{} &minus; baseline value &le; {}")).format(comparison.metric, str(comparison.tolerance))
    return Markup("<b>Accuracy held</b> = {} ({}; a change the better way is fine); &ldquo;not "
                  "logged&rdquo; when the run has no such value. Any metric the module logs can be "
                  "compared (config <code>accuracy.metric</code>, <code>accuracy.mode</code>)."
                  ).format(rule, accuracy.better(way))


def _caveat_rules(summary: pd.DataFrame) -> Markup:
    """How the verdict decides what a number cannot mean (verdict.caveats, boundness)."""
    rules = []
    if bool(summary["simulated"].any()):
        rules.append(Markup("a CPU-simulated run with more ranks on one host than usable cores is "
                     "<i>oversubscribed</i> (its ranks took turns on the cores: contention, not "
                     "scaling) and left out of the recommendation"))
    rules += [
        "a topology whose nodes were simulated on one host crossed no network",
        Markup("the workload is called <i>overhead-bound</i> when compute is under {} of the "
               "baseline's step (probe) or, on GPUs, the baseline's mean utilisation is under {}%"
               ).format(f"{boundness.COMPUTE_SHARE_MIN:.0%}", f"{boundness.GPU_UTILIZATION_MIN_PCT:.0f}"),
        f"more than {RECOMPILES_ALLOWED} torch.compile recompilation in a topology is named",
    ]
    return Markup("<b>Caveats</b>: {}.").format(Markup("; ").join(rules))


def _fact(name: str, text: str) -> Markup:
    return Markup("<b>{}:</b> {}.").format(name, text)


def _windows_method(runs: pd.DataFrame) -> Markup:
    """What throughput mode measured, in the runs' own settings."""
    def setting(key, unit=""):
        return ", ".join(f"{v}{unit}" for v in _unique(runs, key)) or "none"
    precision = ", ".join(f"{float(p):.0%}" for p in _unique(runs, "target_precision")) or "n/a"
    return Markup("<b>Steady-state throughput (throughput mode)</b> = training samples over all ranks / "
                  "seconds, over steady windows of {} training steps (each window's seconds are the slowest "
                  "rank's); the warm-up windows (compilation, caches, the allocator) were found in the data, as "
                  "the leading windows after which the rest show no trend, and left out. A run stopped once the "
                  "95% interval of the mean, which allows for windows in a row moving together, was within "
                  "&plusmn;{} of the mean, or at a cap ({} steps, {} minutes), "
                  "and says which; that interval is the &plusmn; within the run, the spread between repeats "
                  "(separate allocations) is placement noise. Repeats are combined by the median. "
                  "docs/numbers.md counts how often such an interval covers."
                  ).format(setting("window_steps"), precision, setting("max_steps"), setting("max_minutes"))


def _methods(summary: pd.DataFrame, comparison: Comparison, runs: pd.DataFrame, rules: tuple = ()) -> list[Markup]:
    """rules: further definitions (a table's own module words them), None where not shown."""
    base = comparison.baseline
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
        items.append(Markup("<b>Scaling mode: {}</b> = {}.").format(mode, what))
    warm = ", ".join(_unique(runs, "warmup_epochs")) or "0"
    items += [
        _windows_method(runs) if comparison.throughput_mode else
        Markup("<b>Steady-state throughput</b> = training samples across all ranks / training "
               "time, over the epochs after the first {} warmup epoch(s); validation batches "
               "excluded. Repeats of a topology are combined by the median. <b>Time / steady "
               "epoch</b> = the mean time of those epochs, training + validation.").format(warm),
        Markup("<b>Fit time</b> = sum of epoch times (train + validation) of useful work. A run "
               "resumed from a checkpoint counts each finished epoch once; the interrupted "
               "partial epoch is excluded."),
        Markup("<b>Speedup</b> = throughput / throughput({0}). <b>Efficiency</b> = speedup / "
               "(world size / world size({0})); 100% is perfect linear scaling. "
               "<b>Time speedup</b> = fit time({0}) / fit time, only where both runs trained the same "
               "samples.").format(base),
        Markup("<b>Cost per sample</b> = world size / steady-state throughput; the extra over the "
               "baseline = 1 / efficiency &minus; 1. <b>Training {0}</b> = fit time (s) &times; world "
               "size / 3600; <b>held {0}</b> = the time the job held its devices (from the SLURM job's "
               "start, else the training process's, to the metrics record) &times; world size / "
               "3600.").format(hours),
        _accuracy_rule(comparison),
        *[rule for rule in rules if rule is not None],
        _caveat_rules(summary),
    ]
    hosts = sorted({str(h) for hs in runs["hosts"] for h in hs})
    items.append(_fact("Hosts", ", ".join(hosts) or "unknown"))
    items.append(_fact("Devices", f"{', '.join(_unique(runs, 'device_name'))} "
                                  f"({', '.join(_unique(runs, 'backend'))} backend)"))
    items.append(_fact("Training settings", _settings(runs)))
    versions = {", ".join(f"{k} {v}" for k, v in (vs or {}).items())
                for vs in runs["versions"]}
    items.append(_fact("Versions", "; ".join(sorted(versions)) or "unknown"))
    resumed = runs[runs["resumed_from_epoch"].notna()]
    if len(resumed):
        names = ", ".join(f"{t} repeat {r}" for t, r in zip(resumed["topology"], resumed["repeat"]))
        items.append(_fact("Resumed from a checkpoint", names))
    return items


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


def _caveat(note: str) -> Markup:
    """A caveat note, its command to run (if any) set as code."""
    command = f"--configfile {boundness.TRANSFORMER_CONFIG}"
    return Markup("<code>{}</code>").format(command).join(Markup.escape(note).split(Markup.escape(command)))


def _verdict(data) -> dict:
    summary = data.summary
    finished = data.finished
    failed = finished.loc[finished["accuracy_held"].fillna(True).eq(False), "topology"].tolist()
    unfinished = summary[summary["status"] != "ok"]
    banner = ""
    if bool(summary["simulated"].any()):
        sim = data.runs[data.runs["simulated"].astype(bool)]
        banner = BANNER.format(backend=", ".join(_unique(sim, "backend")) or "gloo")
    return {
        "recommendation": data.recommendation,
        "headline": headline(finished, data.comparison) if len(finished) else "",
        "notes": [_caveat(note) for note in data.notes],
        "failed": ", ".join(failed),
        "unfinished": "; ".join(f"{t}: {s}" for t, s in zip(unfinished["topology"], unfinished["status"])),
        "banner": banner,
    }


def _tables(data) -> list:
    """(heading, note, table) of every table that applies."""
    return [made for made in (make(data) for make in (*TABLES, tta_table)) if made is not None]


def _figures(images: dict[str, bytes]) -> list:
    return [(name.removesuffix(".png"), "data:image/png;base64," + base64.b64encode(png).decode("ascii"),
             CAPTIONS.get(name, "")) for name, png in images.items()]


def build_report(data, images: dict[str, bytes]) -> str:
    """The whole page: what was measured, the verdict, then the tables, the plots and the methods."""
    # a list of facts under the title, not a data table: two reports of different workloads
    # never look alike
    facts = [(description.LABELS[k], str(v)) for k, v in data.description.items()]
    return str(render("report.html.j2", title=description.headline(data.description), measured=facts,
                      **_verdict(data), tables=_tables(data), figures=_figures(images),
                      methods=_methods(data.summary, data.comparison, data.runs, (tta_method(data),)))) + "\n"
