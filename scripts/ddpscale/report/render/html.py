"""Build the single self-contained report.html.

Everything is inline (CSS, the overview as SVG, PNGs as data URIs) so the file can be mailed or
opened on an air-gapped cluster; only each figure's SVG and PDF for papers are files beside it,
linked by name, which a copy of the page alone does without. The first screen answers
(firstscreen: the answer, its caveats as badges, the overview plot, the decision table); each
section after it folds away behind a one-line summary (summaries), its methods at its end. The
markup is templates/report.html.j2, rendered with autoescaping (templating.py): host and model
names are not ours to trust, so every value is text unless it is Markup built here from escaped
parts.
"""
from __future__ import annotations

import base64

import pandas as pd
from markupsafe import Markup

from ddpscale.core.io import text_safe
from ddpscale.report.figures import accuracy, boundness
from ddpscale.report.figures.scaling import Comparison, device_word, hours_label
from ddpscale.report.load import description, records
from ddpscale.report.render import plots, summaries
from ddpscale.report.render.html_tables import TABLES, _table, legend, reason_badge, tta_table
from ddpscale.report.render.templating import render
from ddpscale.report.verdict import decision, firstscreen
from ddpscale.report.verdict.caveats import RECOMPILES_ALLOWED, markers

BANNER = ("These runs used CPU processes standing in for GPUs ({backend} backend). "
          "They check the pipeline, not GPU performance; do not read them as GPU results.")


def headline(summary: pd.DataFrame, comparison: Comparison) -> str:
    """The largest run's figures with their intervals, and accuracy in a clause (with the test's
    power where it held; not repeated where the recommendation already says it was not tested)."""
    metric, baseline = comparison.metric, comparison.baseline
    top = summary.iloc[-1]  # sorted by world size, then nodes: the biggest run
    n = int(top["world_size"])
    devices = "; ".join([f"{n} {device_word(summary, n)}", *markers(top)])
    if len(summary) == 1:
        text = (f"Only the baseline {top['topology']} ({devices}) "
                f"ran; add more topologies to measure scaling")
    else:
        text = (f"{top['topology']} ({devices}) reached "
                f"{decision.speedup_text(top)} speedup, {decision.efficiency_text(top)} efficiency "
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
        # the recommendation says it, once: by speed alone, accuracy not tested
        return text + (f"; accuracy not logged in {', '.join(missing)}" if missing else "")
    elif unclear or untested:
        acc = "accuracy held where tested" + "".join(
            f"; {what} in {', '.join(names)}" for what, names in (("inconclusive", unclear), ("not tested", untested))
            if names)
    else:
        acc = "accuracy held in all topologies" + (" where logged" if missing else "") + power(others, comparison)
    if missing and len(missing) < len(summary):
        acc += f" (not logged in {', '.join(missing)})"
    return f"{text}; {acc}"


def power(rows: pd.DataFrame, comparison: Comparison) -> str:
    """' (3 seeds each: a drop of 0.045 or more would have shown, 80% power)', from the weakest test."""
    catches = pd.to_numeric(rows.get("accuracy_detectable", pd.Series(dtype=float)), errors="coerce").dropna()
    if catches.empty:
        return ""
    seeds = accuracy.seeds_word(int(rows["repeats"].min()))
    return (f" ({seeds} each: {accuracy.change_word(comparison.direction)} {catches.max():.3g} or more would have "
            "shown, 80% power)")


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


def _facts(runs: pd.DataFrame) -> list[tuple[str, str]]:
    """What the runs ran on and with, as the methods' last items."""
    hosts = sorted({str(h) for hs in runs["hosts"] for h in hs})
    versions = {", ".join(f"{k} {v}" for k, v in (vs or {}).items()) for vs in runs["versions"]}
    facts = [("Hosts", ", ".join(hosts) or "unknown"),
             ("Devices", f"{', '.join(_unique(runs, 'device_name'))} ({', '.join(_unique(runs, 'backend'))} backend)"),
             ("Training settings", _settings(runs)),
             ("Versions", "; ".join(sorted(versions)) or "unknown")]
    resumed = runs[runs["resumed_from_epoch"].notna()]
    if len(resumed):
        facts.append(("Resumed from a checkpoint",
                      ", ".join(f"{t} repeat {r}" for t, r in zip(resumed["topology"], resumed["repeat"]))))
    return facts


def _methods(data, time_to_accuracy: bool) -> Markup:
    """How each figure is computed (templates/methods.html.j2), in the runs' own settings."""
    runs, comparison = data.runs, data.comparison
    batches = {"weak": "batch_per_device", "strong": "effective_batch"}
    modes = [(mode, ", ".join(_unique(runs[runs["scaling"] == mode], batches.get(mode, "scaling"))))
             for mode in _unique(runs, "scaling")]
    windows = None
    if comparison.throughput_mode:
        each = records.rules(runs)

        def setting(key, form=str):
            return ", ".join(dict.fromkeys(form(getattr(r, key)) for r in each if getattr(r, key) is not None))

        windows = {"steps": setting("window_steps") or "none", "max_steps": setting("max_steps") or "none",
                   "max_minutes": setting("max_minutes") or "none",
                   "precision": setting("precision", lambda p: f"{p:.0%}") or "n/a"}
    accuracy_rule = {"metric": comparison.metric, "direction": comparison.direction,
                     "tolerance": str(comparison.tolerance), "better": accuracy.better(comparison.direction)}
    return render("methods.html.j2", scaling_modes=modes, windows=windows,
                  warmup_epochs=", ".join(_unique(runs, "warmup_epochs")) or "0",
                  baseline=comparison.baseline, hours=hours_label(data.summary), accuracy=accuracy_rule,
                  time_to_accuracy=time_to_accuracy, simulated=bool(data.summary["simulated"].any()),
                  compute_share_min=f"{boundness.COMPUTE_SHARE_MIN:.0%}",
                  gpu_utilization_min=f"{boundness.GPU_UTILIZATION_MIN_PCT:.0f}",
                  recompiles_allowed=RECOMPILES_ALLOWED, facts=_facts(runs))


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


# The section each table opens, and the plots that belong with it (a plot the runs did not make
# is left out). Ids are the page's anchors: the overview links to #methods.
SECTIONS = {"Scaling": ("scaling", ("speedup.png", "efficiency.png", "throughput.png")),
            "Cost": ("cost", ()), "The full training, projected": ("projection", ()),
            "Where the time goes": ("breakdown", ("breakdown.png",)),
            "Predicted vs measured": ("prediction", ()),
            "All-reduce at the gradient size": ("allreduce", ("busbw.png",)), "Devices": ("devices", ()),
            "Change since the earlier run": ("earlier", ()), "Time to accuracy": ("timetoacc", ())}


def _tables(data, tta) -> list:
    """(heading, note, table) of every table that applies, the time-to-accuracy table (tta) last."""
    return [made for made in (*(make(data) for make in TABLES), tta) if made is not None]


# What each plot shows, for a reader who cannot see it (the caption then says how it is made).
ALTS = {"speedup.png": "Plot: speedup per world size, measured against ideal and predicted",
        "efficiency.png": "Bar chart: parallel efficiency per topology, with the recommendation's threshold",
        "throughput.png": "Bar chart: steady-state samples per second per device, per topology",
        "breakdown.png": "Stacked bars: fractions of one training step per topology",
        "busbw.png": "Plot: all-reduce bus bandwidth against message size, per topology"}


def _files(stem: str) -> list[tuple[str, str]]:
    """(format, file name) of a figure's copies for papers, which scripts/report.py writes beside
    report.html: linked by relative name, so the links work while the page stays in its folder."""
    return [("SVG", f"{stem}.svg"), ("PDF", f"{stem}.pdf")]


def _figures(images: dict[str, bytes], names) -> list:
    return [(ALTS.get(name, name.removesuffix(".png")),
             "data:image/png;base64," + base64.b64encode(images[name]).decode("ascii"),
             CAPTIONS.get(name, ""), _files(name.removesuffix(".png"))) for name in names if name in images]


def _sections(data, images: dict[str, bytes], tta, methods: Markup) -> list[dict]:
    """Every section after the first screen, in reading order: the tables with their plots, then
    what was measured and the methods. A plot no table claims still gets shown, in the first."""
    out = []
    for heading, note, table in _tables(data, tta):
        key, names = SECTIONS.get(heading, (heading.lower().replace(" ", "-"), ()))
        out.append({"id": key, "heading": heading, "line": summaries.of_table(heading, data), "body": table,
                    "figures": _figures(images, names), "note": note, "title": ""})
    shown = {n for names in (SECTIONS.get(s["heading"], ("", ()))[1] for s in out) for n in names}
    if out:  # a plot whose table did not apply (no probe: no breakdown table) still shows, in the first
        out[0]["figures"] += _figures(images, [n for n in images if n not in shown])
    # a list of facts, not a data table: two reports of different workloads never look alike
    facts = Markup('<dl id="measured">{}</dl>').format(Markup("").join(
        Markup("<dt>{}</dt><dd>{}</dd>").format(description.LABELS[k], str(v)) for k, v in data.description.items()))
    out.append({"id": "what-was-measured", "heading": "What was measured", "line": summaries.measured(data),
                "body": facts, "figures": [], "note": "", "title": "The workload and its settings"})
    out.append({"id": "methods", "heading": "How these numbers are computed", "line": summaries.methods(data),
                "body": Markup("<ul>{}</ul>").format(methods), "figures": [], "note": "",
                "title": "Each figure's definition, and the runs' hosts and versions"})
    return out


DECISION_HEADS = ["Topology", "Devices", Markup("Speedup<br>(95% interval)"), Markup("Efficiency<br>(95% interval)"),
                  Markup("Full training<br>(projected)"), "GPU-hours (projected)", "Accuracy"]


def _two_lines(text: str) -> Markup:
    """'1.90x (1.87–1.93)' as the figure over its interval, smaller: a narrow column keeps both
    whole instead of breaking the interval across lines."""
    figure, _, interval = text.partition(" (")
    if not interval.endswith(")"):
        return Markup("{}").format(text)
    return Markup('{}<br><span class="spread">{}</span>').format(figure, interval[:-1])


def _decision(data) -> tuple[Markup, Markup]:
    """The decision table and the legend of the reason badges it uses (each reason named once)."""
    rows, used = [], {}
    heads = [h if h != "GPU-hours (projected)" else Markup("{}<br>(projected)").format(hours_label(data.summary))
             for h in DECISION_HEADS]
    for r in firstscreen.decision_rows(data):
        speedup = _two_lines(r["speedup"]) + reason_badge(r["row"], used)
        if r["interval"]:  # no interval: why ('too short to tell')
            speedup += Markup('<br><span class="caveat">{}</span>').format(r["interval"])
        cls = "" if r["finished"] else "unfinished-row"  # the scaling table's rows are the missing-row ones
        accuracy_cell = r["accuracy"] if r["finished"] else Markup('<span class="failed">{}</span>').format(r["status"])
        rows.append((cls, [r["topology"], str(r["devices"]), speedup, _two_lines(r["efficiency"]),
                           _two_lines(r["time"]), _two_lines(r["hours"]), accuracy_cell]))
    return _table(heads, rows, text_cols=(6,)), legend(used)


OVERVIEW_CAPTION = ("Left: speedup of steady-state throughput over the baseline, measured (filled, with its 95% "
                    "interval), ideal (dashed) and predicted from the baseline step plus the measured all-reduce "
                    "(hollow squares). Right: parallel efficiency = speedup / device ratio, with its interval; the "
                    "dotted line is the threshold the recommendation uses.")


def build_report(data, images: dict[str, bytes]) -> str:
    """The whole page: the first screen (answer, caveat badges, overview plot, decision table), then
    each section folded behind its one-line summary, what was measured and the methods last."""
    tta = tta_table(data)  # its table, and its definition in the methods where it is shown
    verdict = _verdict(data)
    decision, decision_legend = _decision(data)
    overview = plots.overview_figure(data) if len(data.finished) else None
    page = str(render("report.html.j2", title=description.headline(data.description),
                      answer=firstscreen.answer(data), recommendation=verdict["recommendation"],
                      headline=verdict["headline"], badges=firstscreen.badges(verdict["notes"], verdict["banner"]),
                      failed=verdict["failed"], unfinished=verdict["unfinished"],
                      overview=Markup(plots.inline_svg(overview, "Speedup and parallel efficiency per topology"))
                      if overview is not None else "", overview_caption=OVERVIEW_CAPTION,
                      overview_files=_files("overview"),
                      decision=decision, decision_legend=decision_legend,
                      sections=_sections(data, images, tta, _methods(data, tta is not None)))) + "\n"
    # a control character in a name is escaped as text: inert in a browser, it would act on a
    # terminal that shows the file and makes the inline SVG malformed XML
    return text_safe(page)
