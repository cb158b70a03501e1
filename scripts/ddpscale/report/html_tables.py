"""The report's tables, one function each: (heading, note, table HTML), or None when not applicable.

Every value from the data goes through escape(): host, model and file names are not ours.
"""
from __future__ import annotations

from html import escape

import pandas as pd

from ddpscale.report import accuracy
from ddpscale.report.analysis import hours_label, run_facts
from ddpscale.report.breakdown import AGREE_STEP, PROBE_OK, TERMS, measured
from ddpscale.report.verdict import OVER_SOCKETS, SIMULATED_NODES, flag, label, oversubscription


def num(value, places: int) -> str:
    return "n/a" if value is None or pd.isna(value) else f"{value:,.{places}f}"


def pct(value, places: int = 0) -> str:
    return "n/a" if value is None or pd.isna(value) else f"{value:.{places}%}"


def _table(heads: list[str], rows: list[tuple[str, list[str]]], text_cols: tuple = ()) -> str:
    """rows: (tr class, cells as ready HTML). The first column and text_cols are left-aligned."""
    def align(i):
        return "l" if i == 0 or i in text_cols else ""

    head = "".join(f'<th class="{align(i)}">{h}</th>' for i, h in enumerate(heads))
    body = "".join(f'<tr class="{cls}">' + "".join(
        f'<td class="{align(i)}">{c}</td>' for i, c in enumerate(cells)) + "</tr>"
        for cls, cells in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _with_spread(row, col: str, places: int) -> str:
    """Median, then [min-max] and the 95% interval when there are enough repeats."""
    text = num(row[col], places)
    if row.get("repeats", 0) and row["repeats"] > 1:
        text += (f'<br><span class="spread">{num(row[col + "_min"], places)}&ndash;'
                 f'{num(row[col + "_max"], places)}</span>')
        if pd.notna(row.get(col + "_ci_low")):
            text += (f'<br><span class="spread">95% CI {num(row[col + "_ci_low"], places)}&ndash;'
                     f'{num(row[col + "_ci_high"], places)}</span>')
    return text


def _held(row, tolerance: float, way: str) -> str:
    held = row.get("accuracy_held")
    if row.get("status") != "ok" and pd.isna(row.get("throughput_samples_s")):
        return ""
    if held is None or pd.isna(held):
        return '<span class="na">not logged</span>'
    if bool(held):
        return '<span class="held">&#10003; held</span>'
    change = "drop" if way == "max" else "rise"
    return f'<span class="failed">&#10007; not held ({change} &gt; {escape(f"{tolerance:g}")})</span>'


def scaling_table(data):
    s = data.summary
    metric = s.attrs.get("accuracy_metric", "accuracy")
    tol = s.attrs.get("tolerance", 0.0)
    way = s.attrs.get("accuracy_direction", "max")
    heads = ["Topology", "Devices", "Status", "Repeats", "Speedup", "Efficiency",
             "Throughput (samples/s)", "Fit time (s)", "Time / epoch (s)",
             f'{escape(metric)}<br><span class="spread">{escape(accuracy.better(way))}</span>',
             "&Delta; vs baseline", "Accuracy"]
    rows = []
    for _, r in s.iterrows():
        held = r.get("accuracy_held")
        over = oversubscription(r)
        cls = ("missing-row" if r["status"] != "ok" and pd.isna(r["throughput_samples_s"])
               else "failed-row" if held is not None and pd.notna(held) and not bool(held)
               else "caveat-row" if over else "")
        status = escape(str(r["status"]))
        status = status if r["status"] == "ok" else f'<span class="failed">{status}</span>'
        if over:  # it finished, but what it measured is contention
            marker = f'<span class="caveat">{escape(over)}: excluded</span>'
            status = marker if r["status"] == "ok" else f"{status}<br>{marker}"
        name = escape(str(r["topology"]))
        if flag(r, "simulated_nodes_on_one_host"):
            name += f' <span class="caveat tag">({escape(SIMULATED_NODES)})</span>'
        if flag(r, "nccl_over_sockets"):
            name += f' <span class="caveat tag">({escape(OVER_SOCKETS)})</span>'
        if isinstance(r.get("transport"), str):  # the network its collectives crossed
            name += f'<br><span class="spread">{escape(r["transport"])}</span>'
        rows.append((cls, [
            name, str(int(r["world_size"])), status,
            str(int(r["repeats"])), f"{num(r['speedup'], 2)}x", pct(r["efficiency"]),
            _with_spread(r, "throughput_samples_s", 0), _with_spread(r, "fit_time_s", 1),
            num(r["time_per_epoch_s"], 2), num(r.get(metric), 4),
            "n/a" if pd.isna(r.get("accuracy_delta")) else f"{r['accuracy_delta']:+.4f}",
            _held(r, tol, way)]))
    text_cols = (2, 11)
    warm = ", ".join(dict.fromkeys(str(w) for w in data.runs["warmup_epochs"]))
    note = (f"Median over repeats; below it the range (min&ndash;max) and, with 3 or more repeats, "
            f"the 95% interval of the mean. Throughput leaves out the first {escape(warm)} "
            "warm-up epoch(s). Rows in red failed the accuracy check and are excluded from "
            "the recommendation; grey rows did not finish.")
    if any(flag(r, "oversubscribed") for _, r in s.iterrows()):
        note += (" Yellow rows were oversubscribed (more ranks on a host than usable cores): they "
                 "measured contention, not scaling, and are excluded from the recommendation.")
    return "Scaling", note, _table(heads, rows, text_cols)


def cost_table(data):
    cost = data.cost
    if cost.empty:
        return None
    label = escape(hours_label(data.summary))
    heads = ["Topology", "Devices", "Speedup", f"{label} per run", f"{label} per epoch",
             f"Extra {label} over baseline", "Extra (%)"]
    rows = [("", [escape(str(r["topology"])), str(int(r["world_size"])), f"{num(r['speedup'], 2)}x",
                  num(r["gpu_hours"], 5), num(r["gpu_hours_per_epoch"], 6),
                  num(r["extra_gpu_hours"], 5), num(r["extra_pct"], 0)])
            for _, r in cost.iterrows()]
    note = (f"{label} = wall time x devices held. The extra over the baseline is what the "
            "speedup costs for the same training: zero at perfect efficiency.")
    return "Cost", note, _table(heads, rows)


def _term(seconds, fraction) -> str:
    return "unknown" if pd.isna(seconds) else f"{num(seconds * 1e3, 2)} ms ({pct(fraction)})"


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
            cells.append("" if r["probe"] == PROBE_OK else f'<span class="failed">{escape(r["probe"])}</span>')
        rows.append(("", cells))
    # one method per kind of probe (one device has no DDP to switch off)
    methods = dict.fromkeys(str(p["step"].get("method", "")).rstrip(".") for _, p in
                            sorted(measured(data.probes).items(), key=lambda kv: -kv[1]["world_size"]))
    method = ". For one device: ".join(m for m in methods if m)
    note = ("Per training step, on the topology's own ranks. " + (f"Method: {escape(method)}. " if method else "")
            + "Lightning's per-step sync: in DDP, Lightning broadcasts a SIGTERM flag and reads it "
            "back (.item()) before every training batch; the probe times synchronised steps with and "
            "without it (none on one device). Framework overhead is the training run's measured "
            "step time minus the four probed terms (the rest of Lightning's loop, callbacks, logging).")
    if failed:
        heads.append("Probe")
        note += (" A probe that failed left its topology's terms unknown (the run trained anyway); "
                 "the last column says why.")
    return "Where the time goes", note, _table(heads, rows, text_cols=(7,))


def prediction_table(data):
    pred = data.prediction
    if pred.empty:
        return None
    heads = ["Topology", "Predicted efficiency", "Measured efficiency", "Predicted step (ms)",
             "Measured step (ms)", "Step off by", "Which term is off"]
    rows = [("", [escape(str(r["topology"])), pct(r["predicted_efficiency"]),
                  pct(r["measured_efficiency"]), num(r["predicted_step_s"] * 1e3, 2),
                  num(r["measured_step_s"] * 1e3, 2),
                  "n/a" if pd.isna(r.get("step_error")) else f"{r['step_error']:+.0%}",
                  f'<span class="off">{escape(r["explanation"])}</span>'])
            for _, r in pred.iterrows()]
    note = ("Prediction: the baseline's compute timed at this topology's per-device batch (scaled "
            "linearly with the batch only where the baseline's probe could not time it, as the last "
            "column then says) and its data wait scaled by the batch, plus this topology's measured "
            "all-reduce of the whole gradient (no overlap assumed), its own Lightning per-step sync "
            "and its own framework overhead. The baseline's prediction is the baseline. Prediction and "
            f"measurement agree when the predicted step is within {AGREE_STEP:.0%} of the measured one.")
    return "Predicted vs measured", note, _table(heads, rows, text_cols=(6,))


def _mb(value) -> str:
    return "n/a" if value is None or pd.isna(value) else f"{value:,.0f} MiB"


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
        util = r.get("gpu_utilization_pct")
        rows.append(("", [escape(label(facts.loc[i])), str(int(r["repeat"])), escape(name),
                          str(int(r["world_size"])), escape(", ".join(map(str, r["hosts"] or []))),
                          _mb(r.get("gpu_peak_memory_mb")),
                          "n/a" if util is None or pd.isna(util) else f"{util:.0f}%",
                          num(r.get("achieved_tflops"), 4), pct(r.get("mfu"), 1)]))
    note = ("Peak memory is the largest torch.cuda.max_memory_allocated over the ranks; utilisation "
            "the mean of nvidia-smi samples taken every second during training (GPU runs only). "
            "TFLOP/s = training FLOPs per sample (matrix multiplies of one forward + backward, "
            "counted by torch's FlopCounterMode) x steady-state throughput, over all devices; MFU = "
            "TFLOP/s / (the GPU's dense peak for the precision x devices), n/a on CPU or an "
            "unknown GPU.")
    return "Devices", note, _table(heads, rows, text_cols=(2, 4))


def allreduce_table(data):
    rows = []
    summary = data.summary.set_index("topology", drop=False)
    for name, p in sorted(measured(data.probes).items(), key=lambda kv: kv[1]["world_size"]):
        if p["world_size"] < 2 or not p["allreduce"]:
            continue
        r = max(p["allreduce"], key=lambda x: x["bytes"])
        shown = label(summary.loc[name]) if name in summary.index else name
        rows.append(("", [escape(shown), str(p["world_size"]), escape(str(p.get("backend"))),
                          f"{r['bytes']:,}", num(r["time_s"] * 1e6, 1),
                          num(r["algbw_gbps"], 3), num(r["busbw_gbps"], 3)]))
    if not rows:
        return None
    heads = ["Topology", "Ranks", "Backend", "Gradient (bytes)", "All-reduce (&micro;s)",
             "algbw (GB/s)", "busbw (GB/s)"]
    note = ("All-reduce of the model's gradient size; algbw = bytes / time, busbw = algbw x "
            "2(n-1)/n as nccl-tests defines them. Every size is in the bus bandwidth plot.")
    return "All-reduce at the gradient size", note, _table(heads, rows)


def comparison_table(data):
    cmp = data.comparison
    if cmp is None:
        return None
    heads = ["Topology", "In", "Throughput earlier", "Throughput now", "Change",
             "Efficiency earlier", "Efficiency now", "Fit time earlier (s)", "Fit time now (s)"]
    rows = [("", [escape(str(r["topology"])), escape(r["present"]),
                  num(r["throughput_samples_s_earlier"], 0), num(r["throughput_samples_s_now"], 0),
                  "n/a" if pd.isna(r["throughput_samples_s_change_pct"])
                  else f"{r['throughput_samples_s_change_pct']:+.1f}%",
                  pct(r["efficiency_earlier"]), pct(r["efficiency_now"]),
                  num(r["fit_time_s_earlier"], 1), num(r["fit_time_s_now"], 1)])
            for _, r in cmp.iterrows()]
    note = f"Against {escape(str(data.compared_with))}."
    return "Change since the earlier run", note, _table(heads, rows)


TABLES = (scaling_table, cost_table, breakdown_table, prediction_table, allreduce_table,
          devices_table, comparison_table)
