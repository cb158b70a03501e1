"""The report's table of the full training, projected (report.projection), in the shape of
html_tables' tables: (heading, note, table HTML), or None when nothing was projected."""
from __future__ import annotations

import pandas as pd

from ddpscale.report.analysis import hours_label
from ddpscale.report.html_cells import num
from ddpscale.report.projection import cost_sentence, duration, hours, sentence, what
from ddpscale.report.templating import render


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
        cells = [str(r["topology"]), str(int(r["world_size"])), what(r), duration(r["projected_s"]),
                 hours(r["projected_device_hours"]), hours(r["projected_held_device_hours"])]
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
            + "; median over repeats. "
            f"This answer's cost is the time every run held its devices x devices, summed.")
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
