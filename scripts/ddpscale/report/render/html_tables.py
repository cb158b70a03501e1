"""The report's tables, one function each: (heading, note, table HTML), or None when not applicable,
and the cells that say more than a number (a median with its spread over repeats, a throughput
with its interval within the run, whether accuracy held).

Host, model and file names are not ours: heads, cells and notes are text, escaped by the
template (templates/table.html.j2), unless they are Markup built with Markup(...).format(...),
which escapes its arguments. markupsafe's escape() returns Markup, so escaped text is never
escaped twice.
"""
from __future__ import annotations

import math
import re

import pandas as pd
from markupsafe import Markup, escape

from ddpscale.report.figures import accuracy, timetoacc
from ddpscale.report.figures.breakdown import AGREE_STEP, PROBE_OK, TERMS, measured, unexplained_shown
from ddpscale.report.figures.cost import time_speedup_note
from ddpscale.report.figures.projection import cost_sentence, projected_hours, projected_time, sentence, what
from ddpscale.report.figures.scaling import hours_label, run_facts
from ddpscale.report.fmt import duration, estimate, hours, known, num, pct, times
from ddpscale.report.render.templating import render
from ddpscale.report.verdict.caveats import OVER_SOCKETS, SIMULATED_NODES, flag, label, oversubscription
from ddpscale.report.verdict.decision import efficiency_text, speedup_text
from ddpscale.report.verdict.firstscreen import STOP_REASONS, stopped_short


def repeats_cell(row, col: str, write) -> Markup | str:
    """The spread over repeats, in its own column: min-max and, with 3 or more repeats, the 95%
    interval of the mean (the figure beside it is a median; this interval is of the mean, and says so)."""
    if not (row.get("repeats", 0) and row["repeats"] > 1) or not known(row.get(col + "_min")):
        return ""
    text = Markup("{}&ndash;{}").format(write(row[col + "_min"]), write(row[col + "_max"]))
    if known(row.get(col + "_ci_low")):
        text += Markup('<br><span class="spread">mean&rsquo;s 95% CI {}&ndash;{}</span>').format(
            write(row[col + "_ci_low"]), write(row[col + "_ci_high"]))
    return text


def reason_badge(row, used: dict | None = None) -> Markup:
    """The short words of why a run's figure is weaker than asked ('step cap', 'not steady'), each
    with its meaning in the title and, once per table, in the legend under it (`used` collects them)."""
    out = Markup("")
    for reason in stopped_short(row):
        word, why = STOP_REASONS.get(reason, (reason, reason))
        if used is not None:
            used[word] = why
        out += Markup(' <span class="reason" title="{}">{}</span>').format(why, word)
    return out


def legend(reasons: dict[str, str]) -> Markup:
    """Each reason badge a table uses, named once and explained."""
    if not reasons:
        return Markup("")
    return Markup('<dl class="legend">{}</dl>').format(Markup("").join(
        Markup('<dt><span class="reason">{}</span></dt><dd>{}</dd>').format(word, why) for word, why in reasons.items()))


def throughput_cell(row, throughput_mode: bool, used: dict | None = None) -> Markup:
    """One figure and its 95% interval ('74,770 (71,300–78,400)', in the digits the interval
    supports), or why it has none ('too short to tell'); in throughput mode with a reason badge
    where the run stopped short of its precision."""
    if pd.isna(row.get("throughput_samples_s")):
        return escape("n/a")
    text = estimate(row["throughput_samples_s"], row.get("throughput_low"), row.get("throughput_high"), 0)
    if not known(row.get("throughput_low")) and isinstance(row.get("interval_from"), str):
        text += f" ({row['interval_from']})"
    return escape(text) + reason_badge(row, used)


def held_cell(row, tolerance: float, way: str, throughput_mode: bool = False) -> Markup | str:
    value, test = row.get("accuracy_held"), row.get("accuracy_test")
    if row.get("status") != "ok" and pd.isna(row.get("throughput_samples_s")):
        return ""
    if throughput_mode:
        return Markup('<span class="na">{}</span>').format(accuracy.THROUGHPUT_MODE)
    change = "drop" if way == "max" else "rise"
    bound = row.get("accuracy_bound")
    if test == accuracy.REFERENCE:
        return Markup('<span class="na">baseline</span>')
    if value is None or pd.isna(value):
        if test == accuracy.INCONCLUSIVE:
            return Markup('<span class="caveat">inconclusive (a {} of up to {} &gt; {})</span>').format(
                change, f"{bound:.3g}", f"{tolerance:g}")
        if isinstance(test, str) and test.endswith(": not tested"):
            return Markup('<span class="na">{}</span>').format(test)
        return Markup('<span class="na">not logged</span>')
    if bool(value):
        catches = row.get("accuracy_detectable")
        power = (Markup("; {} {} or more would have shown, 80% power").format(accuracy.change_word(way),
                                                                             f"{catches:.3g}")
                 if known(catches) else "")
        return Markup('<span class="held">&#10003; held (a {} of at most {} &le; {}{})</span>').format(
            change, f"{max(bound, 0.0):.3g}", f"{tolerance:g}", power)
    return Markup('<span class="failed">&#10007; not held (a {} of at least {} &gt; {})</span>').format(
        change, f"{bound:.3g}", f"{tolerance:g}")


# What every interval in the scaling and decision tables is, said once under each.
INTERVALS = Markup(
    "Beside each throughput its 95% interval: the wider of the run's own (of its steady windows' samples "
    "over their seconds, allowing for windows that move together) and, with 3 or more repeats, the median's over "
    "repeats; <i>too short to tell</i> where a run had too few steady windows for any. Speedup and efficiency "
    "carry both their own and the baseline's uncertainty, on the log scale, so no bound falls below zero; the "
    "baseline's own interval is its throughput's, around 1. Each figure is written to the digits its interval "
    "supports.")


def throughput_note() -> Markup:
    """The scaling table's note in throughput mode: which spread is which, and what is n/a."""
    return Markup("Median over repeats. Throughput mode: each run timed windows of training steps and "
                  "stopped once its throughput was known, so no whole epoch was timed (time per steady epoch "
                  "n/a; the full training is projected in its own table) and accuracy is not compared. ") + INTERVALS \
        + Markup(" A badge says why where a run stopped at a cap before reaching the precision "
                 "asked for (the legend under the table explains each). In its own column <i>placement noise</i>, "
                 "the spread between repeats, each a separate allocation (min&ndash;max and, with 3 or more "
                 "repeats, the 95% interval of the mean). Fit time is what each run trained before it "
                 "stopped. Grey rows did not finish.")


def _table(heads: list, rows: list[tuple[str, list]], text_cols: tuple = ()) -> Markup:
    """rows: (tr class, cells); a head or cell is text unless it is Markup. The first column
    and text_cols are left-aligned."""
    return render("table.html.j2", heads=heads, rows=rows, text_cols=text_cols)


def scaling_table(data):
    s, comparison = data.summary, data.comparison
    metric, tol, way = comparison.metric, comparison.tolerance, comparison.direction
    windows = comparison.throughput_mode
    heads = ["Topology", "Devices", "Status", "Repeats", Markup("Speedup<br>(95% interval)"),
             Markup("Efficiency<br>(95% interval)"), Markup("Throughput (samples/s)<br>(95% interval)"),
             "Placement noise (samples/s)" if windows else "Throughput over repeats", "Fit time",
             "Fit time over repeats", "Time / steady epoch",
             Markup('{}<br><span class="spread">{}</span>').format(metric, accuracy.better(way)),
             Markup("&Delta; vs baseline"), "Accuracy"]
    rows, used = [], {}
    for _, r in s.iterrows():
        held = r.get("accuracy_held")
        over = oversubscription(r)
        cls = ("missing-row" if r["status"] != "ok" and pd.isna(r["throughput_samples_s"])
               else "failed-row" if held is not None and pd.notna(held) and not bool(held)
               else "caveat-row" if over else "")
        status = escape(str(r["status"]))
        status = status if r["status"] == "ok" else Markup('<span class="failed">{}</span>').format(status)
        if over:  # it finished, but what it measured is contention
            marker = Markup('<span class="caveat">{}: excluded</span>').format(over)
            status = marker if r["status"] == "ok" else status + Markup("<br>") + marker
        name = escape(str(r["topology"]))
        if flag(r, "simulated_nodes_on_one_host"):
            name += Markup(' <span class="caveat tag">({})</span>').format(SIMULATED_NODES)
        if flag(r, "nccl_over_sockets"):
            name += Markup(' <span class="caveat tag">({})</span>').format(OVER_SOCKETS)
        if isinstance(r.get("transport"), str):  # the network its collectives crossed
            name += Markup('<br><span class="spread">{}</span>').format(r["transport"])
        rows.append((cls, [
            name, str(int(r["world_size"])), status,
            str(int(r["repeats"])), speedup_text(r), efficiency_text(r),
            throughput_cell(r, windows, used), repeats_cell(r, "throughput_samples_s", lambda v: num(v, 0)),
            duration(r["fit_time_s"]), repeats_cell(r, "fit_time_s", duration), duration(r["time_per_epoch_s"]),
            accuracy.THROUGHPUT_MODE if windows else num(r.get(metric), 4),
            "n/a" if pd.isna(r.get("accuracy_delta")) else f"{r['accuracy_delta']:+.4f}",
            held_cell(r, tol, way, windows)]))
    text_cols = (2, 13)
    warm = ", ".join(dict.fromkeys(str(w) for w in data.runs["warmup_epochs"]))
    note = Markup("Median over repeats; in the columns <i>over repeats</i> the range (min&ndash;max) and, "
                  "with 3 or more repeats, the 95% interval of the mean. Throughput and time per steady epoch (the "
                  "mean epoch, training + validation) leave out the first {} warm-up epoch(s). {} Rows "
                  "in red failed the accuracy check and are excluded from the recommendation; grey "
                  "rows did not finish.").format(warm, INTERVALS) if not windows else throughput_note()
    if any(flag(r, "oversubscribed") for _, r in s.iterrows()):
        note += (" Yellow rows were oversubscribed (more ranks on a host than usable cores): they "
                 "measured contention, not scaling, and are excluded from the recommendation.")
    return "Scaling", note, _table(heads, rows, text_cols) + legend(used)


def cost_table(data):
    cost = data.cost
    if cost.empty:
        return None
    label = hours_label(data.summary)
    seconds = label.replace("hours", "seconds")

    def per_thousand(value) -> str:  # 3 significant digits: from 0.0123 (CPU) to 1,230 (a large model)
        if value is None or pd.isna(value) or value <= 0:
            return "n/a"
        return num(value, max(0, 2 - math.floor(math.log10(value))))

    heads = ["Topology", "Devices", "Speedup", f"{seconds} per 1,000 samples", "Extra over baseline (%)",
             f"Extra {label} for the baseline's samples", "Time speedup", f"Training {label}", f"Held {label}"]
    rows = [("", [str(r["topology"]), str(int(r["world_size"])), speedup_text(r, bounds=False),
                  per_thousand(r["gpu_seconds_per_sample"] * 1e3), num(r["extra_pct"], 0),
                  hours(r["extra_gpu_hours"]), "" if pd.isna(r["time_speedup"]) else times(r["time_speedup"]),
                  hours(r["gpu_hours"]), hours(r["held_gpu_hours"])])
            for _, r in cost.iterrows()]
    note = (f"Cost per sample: {seconds} = devices / steady-state throughput. The extra over the baseline is "
            "what the speedup costs for the same samples, 1 / efficiency - 1: zero at perfect efficiency; "
            f"in {label}, for the samples the baseline trained. Time speedup = the baseline's fit time / "
            f"this fit time, where both trained the same samples. Training {label} = the epochs' wall time "
            f"x devices; held {label} = the time the job held its devices x devices, from the SLURM job's "
            "start (else the training process's) to the metrics record: start-up, process-group set-up, "
            "probe, checkpoint writes and test pass included.")
    blank = time_speedup_note(data.summary, data.comparison.baseline)
    if blank:
        note += " " + blank
    return "Cost", note, _table(heads, rows)


def _term(seconds, fraction) -> str:
    return "unknown" if pd.isna(seconds) else f"{num(seconds * 1e3, 2)} ms ({pct(fraction)})"


def _clauses(text: str) -> list[str]:
    return [c.strip() for c in re.split(r"[,;](?![^()]*\))", text) if c.strip()]


def _once(methods) -> str:
    """The first method in full, then of each other only what differs ("For one device: one rank,
    no DDP"): the probe's method for one device repeats most of the multi-device one word for word."""
    methods = list(methods)
    if not methods:
        return ""
    first = _clauses(methods[0])
    rest = [", ".join(c for c in _clauses(m) if c not in first) for m in methods[1:]]
    return ". For one device: ".join([methods[0], *(r for r in rest if r)])


def breakdown_table(data):
    steps = data.steps
    if steps.empty:
        return None
    failed = "probe" in steps and (steps["probe"] != PROBE_OK).any()
    heads = ["Topology", "Step (ms)", "Data wait", "Compute", "Exposed comm.", "Lightning's per-step sync",
             "Framework overhead"]
    rows = []
    for _, r in steps.iterrows():
        cells = [escape(str(r["topology"])), num(r["step_s"] * 1e3, 2)]
        cells += [_term(r[f"{t}_s"], r[f"{t}_frac"]) for t in TERMS]
        if failed:
            cells.append("" if r["probe"] == PROBE_OK else Markup('<span class="failed">{}</span>').format(r["probe"]))
        rows.append(("", cells))
    # one method per kind of probe (one device has no DDP to switch off)
    methods = dict.fromkeys(str(p["step"].get("method", "")).rstrip(".") for _, p in
                            sorted(measured(data.probes).items(), key=lambda kv: -kv[1]["world_size"]))
    method = _once(m for m in methods if m)
    note = ("Per training step, on the topology's own ranks. " + (f"Method: {method}. " if method else "")
            + "Lightning's per-step sync: in DDP, Lightning broadcasts a SIGTERM flag and reads it "
            "back (.item()) before every training batch; the probe times synchronised steps with and "
            "without it (none on one device). Framework overhead is the training run's measured "
            "step time minus the four probed terms (the rest of Lightning's loop, callbacks, logging).")
    note += probe_costs(measured(data.probes))
    if failed:
        heads.append("Probe")
        note += (" A probe that failed left its topology's terms unknown (the run trained anyway); "
                 "the last column says why.")
    return "Where the time goes", note, _table(heads, rows, text_cols=(7,))


def probe_costs(probes: dict[str, dict]) -> str:
    """' Probe size and time: 1x1 20 steps x 5 rounds, 0.4 s; ...' (sized to the run:
    ddpscale.job.probe.record.sized), or nothing for no probe."""
    said = [f"{name} {str(p['sized']).split(',')[0]}, {p['probe_wall_s']:.1f} s"
            for name, p in sorted(probes.items(), key=lambda kv: kv[1]["world_size"])]
    if not said:
        return ""
    return (" Probe size and time (each sized to a share of its run's planned training; a run's log says which): "
            + "; ".join(said) + ".")


def _unexplained(r) -> str:
    if pd.isna(r.get("unexplained_s")):
        return "n/a"
    ms, share = unexplained_shown(r)
    return f"{ms:.2f} ms ({share:.0%})"


def prediction_table(data):
    pred = data.prediction
    if pred.empty:
        return None
    heads = ["Topology", "Predicted efficiency", "Measured efficiency", "Predicted step (ms)",
             "Measured step (ms)", "Unexplained (ms, share of the step)", "Which term is off"]
    rows = [("", [escape(str(r["topology"])), pct(r["predicted_efficiency"]),
                  pct(r["measured_efficiency"]), num(r["predicted_step_s"] * 1e3, 2),
                  num(r["measured_step_s"] * 1e3, 2), _unexplained(r),
                  Markup('<span class="off">{}</span>').format(r["explanation"])])
            for _, r in pred.iterrows()]
    note = ("Prediction: the baseline's compute timed at this topology's per-device batch (scaled "
            "linearly with the batch only where the baseline's probe could not time it, as the last "
            "column then says), its data wait scaled by the batch and its framework overhead per step, "
            "plus this topology's measured all-reduce of the gradient in DDP's buckets (no overlap "
            "assumed) and the Lightning per-step sync its probe timed; nothing is taken from this "
            "topology's measured step. The baseline's prediction is the baseline. Unexplained = measured "
            "step - predicted step (negative: faster than predicted). Prediction and measurement agree "
            f"when the unexplained time is within {AGREE_STEP:.0%} of the measured step; otherwise the "
            "last column names the term this topology's probe finds furthest from its prediction.")
    return "Predicted vs measured", note, _table(heads, rows, text_cols=(6,))


def _mb(value) -> str:
    return "n/a" if value is None or pd.isna(value) else f"{value:,.0f} MiB"


def _utilisation(util, why) -> str:
    if util is not None and not pd.isna(util):
        return f"{util:.0f}%"
    return Markup('<span title="{}">n/a</span>').format(why) if isinstance(why, str) and why else "n/a"


def _mfu(mfu, used, hfu=None) -> str:
    shown = pct(mfu, 1)
    if isinstance(used, str) and used:
        shown += f" ({used})"  # the peak it was divided by: bf16, tf32, 32, ...
    if hfu is not None and not pd.isna(hfu):
        shown += f"; HFU {pct(hfu, 1)} with recomputation"  # activation checkpointing's, not model FLOPs
    if mfu is not None and not pd.isna(mfu) and mfu > 1:
        shown = Markup('<span class="failed">{}: over 100%, see caveats</span>').format(shown)
    return shown


def devices_table(data):
    runs = data.runs.sort_values(["world_size", "topology", "repeat"])
    facts = run_facts(runs)
    heads = ["Topology", "Repeat", "Device", "Count", "Hosts", "Peak memory", "Utilisation",
             "TFLOP/s", "MFU"]
    rows = []
    for i, r in runs.iterrows():
        name = str(r["device_name"])
        if r["simulated"] and "simulated" not in name:
            name += " (CPU-simulated)"
        util, why = r["gpu_utilization_pct"], r["gpu_utilization_reason"]
        rows.append(("", [escape(label(facts.loc[i])), str(int(r["repeat"])), escape(name),
                          str(int(r["world_size"])), escape(", ".join(map(str, r["hosts"] or []))),
                          _mb(r["gpu_peak_memory_mb"]),
                          _utilisation(util, why),
                          num(r["achieved_tflops"], 4), _mfu(r["mfu"], r["peak_precision"], r.get("hfu"))]))
    note = ("Peak memory is the largest torch.cuda.max_memory_allocated over the ranks; utilisation "
            "the mean of NVML's readings of each rank's GPU (by UUID), every second, in the training "
            "phase of steady epochs only: not warm-up, validation or checkpoint writes (GPU runs "
            "only; hover over n/a for why). "
            "TFLOP/s = model FLOPs per sample (matrix multiplies, convolutions and attention of "
            "forward + backward, counted by torch's FlopCounterMode inside the fit on rank 0's first "
            "training batches, warm-up steps no figure is timed on: their FLOPs over their samples) x "
            "steady-state throughput, over all devices; MFU (model FLOPs utilisation) = TFLOP/s / (the "
            "GPU's dense datasheet peak x devices), n/a on CPU or an unknown GPU. Forward work that "
            "activation checkpointing recomputes in backward is not model FLOPs: where there was some, "
            "HFU (hardware FLOPs utilisation) counts it too. The "
            "peak follows the arithmetic in effect, named in brackets: for 32-true the TF32 peak where "
            "matmuls (torch.set_float32_matmul_precision('high'/'medium')) or, for convolutions, "
            "cuDNN (on by default) ran in TF32 on an Ampere or later GPU, else FP32; 64-true the FP64 "
            "(Tensor Core) peak, n/a where the datasheet gives none.")
    return "Devices", note, _table(heads, rows, text_cols=(2, 4))


def allreduce_table(data):
    rows = []
    summary = data.summary.set_index("topology", drop=False)
    for name, p in sorted(measured(data.probes).items(), key=lambda kv: kv[1]["world_size"]):
        if p["world_size"] < 2 or not p["allreduce"]:
            continue
        r = max(p["allreduce"], key=lambda x: x["bytes"])
        shown = label(summary.loc[name]) if name in summary.index else name
        rows.append(("", [escape(shown), str(p["world_size"]), escape(str(p["backend"])),
                          f"{r['bytes']:,}", num(r["time_s"] * 1e6, 1),
                          num(r["algbw_gbps"], 3), num(r["busbw_gbps"], 3)]))
    if not rows:
        return None
    heads = ["Topology", "Ranks", "Backend", "Gradient (bytes)", Markup("All-reduce (&micro;s)"),
             "algbw (GB/s)", "busbw (GB/s)"]
    note = ("All-reduce of the model's gradient size; algbw = bytes / time, busbw = algbw x "
            "2(n-1)/n as nccl-tests defines them. Every size is in the bus bandwidth plot.")
    return "All-reduce at the gradient size", note, _table(heads, rows)


def comparison_table(data):
    cmp = data.versus_earlier
    if cmp is None:
        return None
    heads = ["Topology", "In", "Throughput earlier", "Throughput now", "Change",
             "Efficiency earlier", "Efficiency now", "Fit time earlier", "Fit time now"]
    rows = [("", [escape(str(r["topology"])), escape(r["present"]),
                  num(r["throughput_samples_s_earlier"], 0), num(r["throughput_samples_s_now"], 0),
                  "n/a" if pd.isna(r["throughput_samples_s_change_pct"])
                  else f"{r['throughput_samples_s_change_pct']:+.1f}%",
                  pct(r["efficiency_earlier"]), pct(r["efficiency_now"]),
                  duration(r["fit_time_s_earlier"]), duration(r["fit_time_s_now"])])
            for _, r in cmp.iterrows()]
    note = f"Against {data.compared_with}."
    return "Change since the earlier run", note, _table(heads, rows)


def projection_table(data):
    table = data.projection
    if table is None or table.empty:
        return None
    label = hours_label(data.summary)
    full = not data.comparison.throughput_mode
    heads = ["Topology", "Devices", "Projected training", "Projected time", f"Projected {label}",
             f"Projected {label} held"]
    heads += ["Measured time", "Projection off by"] if full else []
    limited = "job_limit_s" in table and table["job_limit_s"].notna().any()  # a cluster profile's time limit
    heads += ["Jobs (time limit)"] if limited else []
    why = table["why_na"].notna().any()  # a column of its own only where a row needs it
    heads += ["Not projected because"] if why else []
    rows = []
    for _, r in table.iterrows():
        cells = [str(r["topology"]), str(int(r["world_size"])), what(r), projected_time(r),
                 projected_hours(r), hours(r["projected_held_device_hours"])]
        if limited:
            cells += [f"{r['jobs']:.0f} ({duration(r['job_limit_s'])})" if pd.notna(r["jobs"]) else "n/a"]
        if full:
            cells += [duration(r["measured_s"]), "n/a" if pd.isna(r["error"]) else f"{r['error']:+.1%}"]
        cells += [r["why_na"] or ""] if why else []
        rows.append(("", cells))
    epochs = ", ".join(dict.fromkeys(num(v, 0) for v in data.runs["configured_epochs"] if pd.notna(v)))
    said = sentence(table, label)
    note = (f"{cost_sentence(data.spent, label)} " + (f"{said[:1].upper()}{said[1:]}. " if said else "")
            + f"Projected time of the configured training ({epochs or 'n/a'} epoch(s)) = epochs x samples per "
            "epoch / steady window throughput + the seconds no training step took: per epoch the loader's start "
            "and hooks, and each validation and checkpoint save as often as the trainer makes them "
            "(check_val_every_n_epoch), warm, with the first one's cold excess once + the "
            f"warm-up's excess over the steady rate; {label} = that x devices; held = that plus the seconds the "
            "run held its devices outside training (start-up, process group and data set-up, the test pass; "
            f"the probe left out), as the answer's cost counts them"
            + ("; a training longer than its job time limit runs as that many jobs, each after the first "
               "paying the start-up, the warm-up and the cold first validation and save again (and half an "
               "epoch lost on average where the site sends no warning before the limit)" if limited else "")
            + "; median over repeats. Each projection's 95% interval is that of the throughput it was made "
            "from (the steps' seconds scale with 1 / throughput; the rest was measured). "
            "This answer's cost is the time every run held its devices x devices, summed.")
    if full:
        steps = ", ".join(dict.fromkeys(num(v, 0) for v in table["from_steps"] if pd.notna(v))) or "n/a"
        note += (f" Each full run is projected from its first part only, the {steps} training steps where "
                 "throughput mode's stopping rule would have stopped (its windows replayed), so the check "
                 "tests the extrapolation. Measured time = the run's fit time + its checkpoint writes; "
                 "projection off by = projected / measured - 1.")
    else:
        note += " Training every topology in full = one projected full training of each topology, summed."
    return "The full training, projected", note, render("table.html.j2", heads=heads, rows=rows,
                                                        text_cols=(2, len(heads) - 1))


def _way(goal: timetoacc.Target) -> str:
    """The comparison a value must make with the target."""
    return Markup("&ge;") if goal.direction != "min" else Markup("&le;")


def tta_table(data):
    tta = data.timetoacc
    if tta is None or tta.empty:
        return None
    heads = ["Topology", "Devices", "Epochs to target", "Time to accuracy", "Time-to-accuracy speedup",
             "Throughput speedup", "Status"]
    summary = data.summary.set_index("topology", drop=False)
    rows = []
    for _, r in tta.iterrows():
        status = escape(str(r["status"]))
        if not str(r["status"]).startswith("reached"):
            status = Markup('<span class="na">{}</span>').format(status)
        shown = summary.loc[r["topology"]] if r["topology"] in summary.index else r
        rows.append(("", [escape(str(r["topology"])), str(int(r["world_size"])), num(r["epochs_to_target"], 0),
                          duration(r["time_to_accuracy_s"]), times(r["tta_speedup"]), speedup_text(shown, bounds=False),
                          status]))
    goal = data.tta_target
    if data.comparison.throughput_mode:
        note = ("Not measured (throughput mode): each run stopped once its throughput was known, so none "
                "trained to a target; measure: full trains the configured epochs and times it.")
    elif pd.notna(goal.value):
        compare = _way(goal)
        note = Markup("Target: {} {} {} ({}). Time to accuracy = the training time (training + validation of "
                      "the epochs so far) until the first epoch that reaches it; over repeats the median, "
                      "and from {} repeats MLPerf's score (the fastest and slowest dropped, the rest averaged; "
                      "one run that never reached it counts as the slowest, two make it not reached). The "
                      "speedup is the baseline's time / this one. A larger global batch can need more epochs, "
                      "so it can fall short of the throughput speedup.").format(
            goal.metric, compare, f"{goal.value:.4g}", goal.source, timetoacc.OLYMPIC_FROM)
    elif goal.direction is not None:  # a metric, but no target fixed before these runs
        note = Markup("No target: {}.").format(goal.why_none)
    else:
        note = "No target: the baseline recorded no epoch metric (see its status)."
    return "Time to accuracy", note, _table(heads, rows, text_cols=(6,))


TABLES = (scaling_table, cost_table, projection_table, breakdown_table, prediction_table, allreduce_table,
          devices_table, comparison_table)
