"""Where a training step's time goes, and what the baseline plus the all-reduce predict.

Pure pandas: inputs are the scaling summary (scaling.summarize) and each topology's
probe (metrics.json's `probe`), so every formula here is unit-tested without a cluster.

Per topology the probe measured, per step: data wait (D), compute with DDP's gradient
synchronisation switched off (C), the extra time of a synchronised step over C, which is
communication that backward did not hide (E), and on several ranks the extra time of
Lightning's own per-batch SIGTERM broadcast + .item() (L; ddpscale.job.probe.step.sigterm_broadcast; 0 on
one rank, which Lightning does not broadcast on). The training run measured its own step time
T (per-device batch x world size / throughput); what T has beyond D + C + E + L is framework
overhead outside the probe (O: the rest of Lightning's loop, logging, callbacks).

The prediction of a topology's step takes nothing from that topology's T: whatever T has beyond
the prediction is its own term, unexplained, and only a small one is called agreement.

A "step" here is one per-device batch (a micro-batch). With accumulate_grad_batches = k,
DDP synchronises the gradient once every k batches, so one all-reduce is spread over k steps;
the probe times its steps the same way (ddpscale.job.probe.step).

A probe that could not measure is recorded n/a with its reason (the run trained anyway): its
topology keeps its rows here, every probed term unknown (NaN) and the reason in `probe`, and
the baseline's n/a leaves every prediction unknown. Plots skip those rows.
"""

from __future__ import annotations

import pandas as pd

TERMS = ("data", "compute", "comm", "loop_sync", "overhead")
TERM_WORDS = {"data": "data wait", "compute": "compute (forward + backward + optimizer)",
              "comm": "exposed gradient communication",
              "loop_sync": "Lightning's per-step sync (SIGTERM broadcast)", "overhead": "framework overhead"}
# The terms the prediction derives from elsewhere (the baseline, the all-reduce); loop_sync it
# takes from the topology's own probe (a collective the baseline has none of), so it cannot be off.
PREDICTED_TERMS = ("data", "compute", "comm", "overhead")
# Prediction and measurement agree when the unexplained time (measured step - predicted step) is
# within this fraction of the measured step time.
AGREE_STEP = 0.10
NAN = float("nan")


PROBE_KEYS = ("topology", "world_size", "status", "backend", "step", "allreduce", "allreduce_ddp", "gradient_bytes",
              "sized", "probe_wall_s")
# what the prediction reads of a probe's step (ddpscale.job.probe.step.measure writes them all)
STEP_KEYS = ("data_s", "compute_s", "exposed_comm_s", "loop_sync_s", "accumulate_grad_batches")
NA_KEYS = ("topology", "world_size", "reason")
PROBE_OK = "ok"


def is_na(probe: dict) -> bool:
    """A probe that could not measure (metrics.json 'probe' status n/a)."""
    return probe.get("status") == "n/a"


def measured(probes: dict[str, dict]) -> dict[str, dict]:
    """The probes that measured, by topology (n/a ones have no step or all-reduce)."""
    return {name: p for name, p in probes.items() if not is_na(p)}


def na_text(probe: dict) -> str:
    return f"n/a (probe failed: {probe['reason']})"


def _checked(record: dict, source: str) -> dict:
    for key in NA_KEYS if is_na(record) else PROBE_KEYS:
        if key not in record:
            raise ValueError(f"{source}: missing key '{key}'; rerun its probe")
    for key in () if is_na(record) else STEP_KEYS:
        if key not in record["step"]:
            raise ValueError(f"{source}: missing key 'step.{key}'; rerun its probe")
    return record


def probes_in_runs(runs: pd.DataFrame) -> dict[str, dict]:
    """The probe each topology's first repeat ran before training (metrics.json 'probe')."""
    if "probe" not in runs:
        return {}
    probes = {}
    for _, row in runs.sort_values("repeat").iterrows():
        record = row["probe"]
        if isinstance(record, dict) and row["topology"] not in probes:
            probes[row["topology"]] = _checked(record, f"{row['source']}, probe")
    return probes


def train_step_s(row) -> float:
    """Measured seconds per training step: one per-device batch on every rank."""
    return row["batch_per_device"] * row["world_size"] / row["throughput_samples_s"]


def allreduce_s(probe: dict) -> float:
    """Measured all-reduce time for one synchronisation of the gradient, in the buckets DDP
    sends (probe 'allreduce_ddp')."""
    if probe["world_size"] <= 1:
        return 0.0
    return float(probe["allreduce_ddp"]["time_s"])


def accumulation(probe: dict) -> int:
    """Batches per gradient synchronisation (accumulate_grad_batches)."""
    return int(probe["step"]["accumulate_grad_batches"])


def comm_per_batch_s(probe: dict) -> float:
    """The gradient all-reduce per batch: one every accumulate_grad_batches batches."""
    return allreduce_s(probe) / accumulation(probe)


def measured_terms(row, probe: dict) -> dict:
    step = probe["step"]
    parts = {"data": step["data_s"], "compute": step["compute_s"], "comm": step["exposed_comm_s"],
             "loop_sync": step["loop_sync_s"]}
    total = train_step_s(row)
    parts["overhead"] = max(0.0, total - sum(parts.values()))
    return {**parts, "step": max(total, sum(parts.values()))}


def baseline_compute(probe: dict, base_batch: int, batch: int) -> tuple[float, str | None]:
    """The baseline's compute per step at a per-device batch, and a note when it is a guess:
    timed by the baseline's probe (compute_by_batch), else scaled linearly from its own batch."""
    step = probe["step"]
    if batch == base_batch:
        return step["compute_s"], None
    timed = {r["batch_per_device"]: r for r in step.get("compute_by_batch", [])}
    at = timed.get(batch)
    if at is not None and at.get("compute_s") is not None:
        return at["compute_s"], None
    why = f": {at['reason']}" if at is not None and at.get("reason") else ""
    return (step["compute_s"] * batch / base_batch,
            f"compute scaled linearly from the baseline's batch {base_batch}, not timed at {batch}{why}")


def probe_batches(probe: dict) -> float:
    """The micro-batches each kind of the probe's timed blocks ran (its medians are over these;
    the cost bound may cut them on a busy host: probe 'size'), NaN where the record has no size."""
    timed = (probe.get("size") or {}).get("timed_batches")
    return NAN if timed is None else timed


def breakdown(summary: pd.DataFrame, probes: dict[str, dict]) -> pd.DataFrame:
    """Seconds and fractions of a step per term, one row per topology with a probe; an n/a
    probe's row has every probed term unknown and says why in `probe`; `probe_batches` says how
    many batches its terms were timed over."""
    rows = []
    for _, row in summary.iterrows():
        probe = probes.get(row["topology"])
        if probe is None or pd.isna(row.get("throughput_samples_s")):
            continue
        out = {"topology": row["topology"], "world_size": row["world_size"], "train_step_s": train_step_s(row)}
        if is_na(probe):
            rows.append({**out, "step_s": NAN, **{f"{t}_{unit}": NAN for t in TERMS for unit in ("s", "frac")},
                         "probe": na_text(probe), "probe_batches": NAN})
            continue
        terms = measured_terms(row, probe)
        out["step_s"] = terms["step"]
        for term in TERMS:
            out[f"{term}_s"] = terms[term]
            out[f"{term}_frac"] = terms[term] / terms["step"]
        rows.append({**out, "probe": PROBE_OK, "probe_batches": probe_batches(probe)})
    return pd.DataFrame(rows)


def predict(summary: pd.DataFrame, probes: dict[str, dict], baseline: str) -> pd.DataFrame:
    """Predicted step time and efficiency from the baseline's step and each topology's all-reduce.

    Model: the baseline's compute timed at the topology's per-device batch (scaled linearly with
    the batch only where the baseline's probe did not time it, and the explanation says so), its
    data wait scaled with the batch, its framework overhead per step (unscaled: its probe times
    only compute at other batches, and Lightning's loop, callbacks and logging cost per step, not
    per sample), the gradient all-reduce added whole (no overlap assumed, once per
    accumulate_grad_batches steps) and the Lightning sync the topology's probe timed (a collective
    the baseline does not run). No term comes from the topology's measured step: measured -
    predicted is the row's `unexplained_s` (and `unexplained_frac` of the measured step), so a
    topology slower for a reason the model lacks shows it instead of being predicted as measured.
    The baseline's prediction is the baseline.
    """
    base_rows = summary[summary["topology"] == baseline]
    if base_rows.empty or baseline not in probes or pd.isna(base_rows.iloc[0]["throughput_samples_s"]):
        return pd.DataFrame()
    base = base_rows.iloc[0]
    if is_na(probes[baseline]):
        return pd.DataFrame([_unknown(row, f"n/a (the baseline's probe failed: {probes[baseline]['reason']})")
                             for _, row in summary.iterrows()
                             if row["topology"] in probes and pd.notna(row.get("throughput_samples_s"))])
    base_terms = measured_terms(base, probes[baseline])
    base_rate = base["world_size"] * base["batch_per_device"] / train_step_s(base)
    rows = []
    for _, row in summary.iterrows():
        probe = probes.get(row["topology"])
        if probe is None or pd.isna(row.get("throughput_samples_s")):
            continue
        if is_na(probe):
            rows.append(_unknown(row, na_text(probe)))
            continue
        meas = measured_terms(row, probe)
        note = None
        if row["topology"] == baseline:
            pred = {t: meas[t] for t in TERMS}
            pred_step = train_step_s(row)
        else:
            compute, note = baseline_compute(probes[baseline], base["batch_per_device"], row["batch_per_device"])
            pred = {"data": base_terms["data"] * row["batch_per_device"] / base["batch_per_device"],
                    "compute": compute, "comm": comm_per_batch_s(probe),
                    "loop_sync": meas["loop_sync"], "overhead": base_terms["overhead"]}
            pred_step = sum(pred.values())
        devices = row["world_size"] / base["world_size"]
        pred_speedup = row["world_size"] * row["batch_per_device"] / pred_step / base_rate
        step = train_step_s(row)
        out = {"topology": row["topology"], "world_size": row["world_size"],
               "predicted_efficiency": pred_speedup / devices,
               "measured_efficiency": row["efficiency"],
               "predicted_step_s": pred_step, "measured_step_s": step,
               "step_error": pred_step / step - 1,
               "unexplained_s": step - pred_step, "unexplained_frac": (step - pred_step) / step}
        for term in TERMS:
            out[f"{term}_predicted_s"] = pred[term]
            out[f"{term}_measured_s"] = meas[term]
        out["explanation"] = ("the baseline" if row["topology"] == baseline
                              else explain(out, linear=note is not None) + (f" ({note})" if note else ""))
        rows.append(out)
    return pd.DataFrame(rows)


def _unknown(row, why: str) -> dict:
    """A prediction row whose probed terms are unknown: what the training run measured, and why."""
    return {"topology": row["topology"], "world_size": row["world_size"], "predicted_efficiency": NAN,
            "measured_efficiency": row["efficiency"], "predicted_step_s": NAN, "measured_step_s": train_step_s(row),
            "step_error": NAN, "unexplained_s": NAN, "unexplained_frac": NAN,
            **{f"{t}_{kind}_s": NAN for t in TERMS for kind in ("predicted", "measured")}, "explanation": why}


# Why a term can be off, by direction (measured above or below its prediction).
HINTS = {
    ("compute", True): "per-device compute on this topology's ranks is slower than the baseline's at the "
                       "same batch (CPU-simulated ranks share the host's cores; a busy or slower device)",
    ("compute", False): "per-device compute on this topology's ranks is faster than the baseline's at the "
                        "same batch",
    ("comm", True): "a synchronised step costs more than one all-reduce of the gradient "
                    "(bucketing, a slow link or a straggling rank)",
    ("comm", False): "DDP hid part of the all-reduce behind the backward pass",
    ("data", True): "data loading did not shrink with the per-device batch",
    ("data", False): "data loading got cheaper than the batch size predicts",
    ("overhead", True): "this topology's training loop spends more time outside the probed terms than "
                        "the baseline's (Lightning's loop, callbacks, logging, a straggling rank, or "
                        "a cause nothing here measures)",
    ("overhead", False): "this topology's training loop spends less time outside the probed terms than "
                         "the baseline's",
}
# ...and for compute the baseline's probe did not time at this batch (scaled linearly)
LINEAR_HINTS = {
    ("compute", True): "per-device compute did not shrink with the per-device batch (a small batch "
                       "leaves a GPU underused; CPU-simulated ranks share the host's cores)",
    ("compute", False): "smaller per-device batches ran faster per sample than on the baseline",
}


def off_term(row) -> str:
    """The predicted term whose measurement is furthest (in seconds) from its prediction."""
    return max(PREDICTED_TERMS, key=lambda t: abs(row[f"{t}_measured_s"] - row[f"{t}_predicted_s"]))


def largest_term(row) -> str:
    """The predicted step's largest term and its share: what the prediction says bounds the step."""
    term = max(TERMS, key=lambda t: row[f"{t}_predicted_s"])
    share = row[f"{term}_predicted_s"] / row["predicted_step_s"] if row["predicted_step_s"] > 0 else NAN
    return f"{TERM_WORDS[term]} is the largest term ({share:.0%} of the predicted step)"


def agrees(row) -> bool:
    """|measured - predicted step| within AGREE_STEP of the measured step. Judged on the step
    time, relative: efficiency points shrink with the baseline's share of a large topology's
    step, so a prediction at half the measured step could pass on points."""
    return abs(row["measured_step_s"] - row["predicted_step_s"]) <= AGREE_STEP * row["measured_step_s"]


def unexplained_shown(row) -> tuple[float, float]:
    """The unexplained time in ms and its share of the measured step, rounded as the report prints
    them; + 0.0 so that a float residue of a matching prediction does not print as "-0.00"."""
    return round(row["unexplained_s"] * 1e3, 2) + 0.0, round(row["unexplained_frac"], 2) + 0.0


def unexplained(row) -> str:
    """The measured step's time the prediction does not account for (negative: faster than predicted)."""
    ms, share = unexplained_shown(row)
    return f"unexplained: {ms:.2f} ms, {share:.0%} of the step"


def explain(row, linear: bool = False) -> str:
    """Whether the predicted step agrees with the measured one, the unexplained time, and when they
    do not agree the term that is off and why; linear: the baseline's compute was scaled linearly
    to this batch, not timed at it."""
    if pd.isna(row["measured_step_s"]) or pd.isna(row["predicted_step_s"]):
        return "no measured step"
    if agrees(row):
        said = f"prediction and measurement agree ({unexplained(row)}, within {AGREE_STEP:.0%})"
    else:
        term = off_term(row)
        meas, pred = row[f"{term}_measured_s"], row[f"{term}_predicted_s"]
        ratio = f"{meas / pred:.1f}x" if pred > 0 else "above zero"
        hint = (LINEAR_HINTS if linear and term == "compute" else HINTS)[(term, meas > pred)]
        said = (f"{unexplained(row)}, beyond {AGREE_STEP:.0%}; {TERM_WORDS[term]} is off: {meas * 1e3:.2f} ms "
                f"per step measured vs {pred * 1e3:.2f} ms predicted ({ratio}): {hint}")
    # a multi-device topology says what bounds it, agreeing or not: a user reads "communication"
    # here before buying more nodes
    return f"{said}; {largest_term(row)}" if row["world_size"] > 1 else said
