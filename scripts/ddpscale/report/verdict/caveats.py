"""Where a number cannot mean what it seems: each row's markers (oversubscribed, nodes simulated on
one host, NCCL over sockets, stopped early, samples not counted) and the verdict's notes that say
so and what to do (accuracy not logged or not tested, the probe that could not measure, a workload
overhead-bound, recompilations, MFU above 100%, FLOPs not plain). Pure pandas, unit-tested without
a cluster.
"""
from __future__ import annotations

import pandas as pd

from ddpscale.report.figures import accuracy, boundness, breakdown, interconnect
from ddpscale.report.figures.scaling import Comparison, device_word
from ddpscale.report.fmt import topology_names

SIMULATED_NODES = "nodes simulated on one host: no network crossed"
OVER_SOCKETS = "NCCL over sockets, not InfiniBand"
# One recompilation is routine (say, the last, smaller batch of an epoch, or the switch to
# evaluation); more than one means shapes or guarded values keep changing from step to step.
RECOMPILES_ALLOWED = 1


def flag(row, key: str) -> bool:
    """True only where the fact was recorded as true; missing or NA is not known, not true."""
    value = row.get(key) if hasattr(row, "get") else None
    try:
        return bool(value) if not pd.isna(value) else False
    except (TypeError, ValueError):
        return False


def oversubscription(row) -> str | None:
    """'oversubscribed: 4 ranks on 2 cores' for a row that measured contention, else None."""
    if not flag(row, "oversubscribed"):
        return None
    ranks, cores = int(row["ranks_per_host"]), int(row["usable_cores"])
    return f"oversubscribed: {ranks} ranks on {cores} core{'' if cores == 1 else 's'}"


def markers(row) -> list[str]:
    """Why a row's numbers do not mean what they seem: oversubscribed, nodes on one host, a
    training a module's callback stopped before its configured epochs, samples that could not
    be counted (its figures per sample n/a)."""
    out = [oversubscription(row)]
    if flag(row, "simulated_nodes_on_one_host"):
        out.append(SIMULATED_NODES)
    if flag(row, "nccl_over_sockets"):
        out.append(OVER_SOCKETS)
    for said in (row.get("early_stop"), row.get("samples_uncounted")):
        if isinstance(said, str) and said:
            out.append(said)
    return [m for m in out if m]


def label(row) -> str:
    """The topology with its markers: '2x1 (nodes simulated on one host: no network crossed)'."""
    found = markers(row)
    return f"{row['topology']} ({'; '.join(found)})" if found else str(row["topology"])


def add_caveats(summary: pd.DataFrame) -> pd.DataFrame:
    """A `caveats` column (markers joined by '; ', empty when none) for the table and the TSV."""
    table = summary.copy()
    table["caveats"] = ["; ".join(markers(row)) for _, row in table.iterrows()]
    return table


def flagged(summary: pd.DataFrame, key: str) -> pd.DataFrame:
    """The rows where `key` was recorded as true."""
    return summary[pd.Series([flag(r, key) for _, r in summary.iterrows()], index=summary.index,
                             dtype=bool)]


def unknown_accuracy_note(summary: pd.DataFrame, comparison: Comparison) -> str | None:
    """Finished rows left out of the recommendation because their metric was not logged."""
    if not comparison.compared:
        return None
    done = summary[summary["throughput_samples_s"].notna()]
    rows = done[accuracy.unlogged(done)]
    if rows.empty:
        return None
    return (f"Left out of the recommendation: {topology_names(rows)}, whose runs did not log {comparison.metric}, so "
            "whether accuracy held there is not known.")


def untested_accuracy_note(summary: pd.DataFrame, comparison: Comparison) -> str | None:
    """Why accuracy has no verdict where seeds were too few or the test was inconclusive."""
    if not comparison.compared:
        return None
    done = summary[summary["throughput_samples_s"].notna()]
    notes = []
    untested = done[accuracy.untested(done)]
    if not untested.empty:
        seeds = int(untested["repeats"].min())
        notes.append(f"Accuracy not tested in {topology_names(untested)}: {accuracy.seeds_word(seeds)} each, and "
                     f"seed noise alone can move a final metric by more than the tolerance; set repeats: "
                     f"{accuracy.MIN_SEEDS} or more (each repeat trains with its own seed) for a test")
    unclear = done[accuracy.inconclusive(done)]
    if not unclear.empty:
        notes.append(f"Accuracy inconclusive in {topology_names(unclear)}: the 95% interval of the change "
                     "reaches past the tolerance but does not lie beyond it; more repeats narrow it")
    return ". ".join(notes) + "." if notes else None


def oversubscribed_note(summary: pd.DataFrame) -> str | None:
    rows = flagged(summary, "oversubscribed")
    if rows.empty:
        return None
    limit = f" ({int(rows['usable_cores'].min())} here)"
    left = ", ".join(f"{r['topology']} ({oversubscription(r)})" for _, r in rows.iterrows())
    return (f"Left out of the recommendation: {left}. With more ranks on a host than usable "
            "cores, the ranks took turns on the same cores, so their numbers measure contention, "
            "not scaling. To measure them, run at most as many ranks per host as it has usable "
            f"cores{limit}, or use a machine with more cores.")


def simulated_nodes_note(summary: pd.DataFrame) -> str | None:
    rows = flagged(summary, "simulated_nodes_on_one_host")
    if rows.empty:
        return None
    return (f"Nodes simulated on one host in {topology_names(rows)}: their traffic between nodes stayed "
            "inside that host (shared memory or loopback on CPU, NVLink or PCIe between GPUs) and "
            "crossed no network, so their numbers say nothing about the interconnect between "
            "real nodes.")


def _first_reason(runs: pd.DataFrame | None, topology) -> str | None:
    """The first recompilation reason a run of this topology recorded (only runs with torch.compile
    record them)."""
    if runs is None or "compile_recompile_reasons" not in runs:
        return None
    for reasons in runs.loc[runs["topology"] == topology, "compile_recompile_reasons"]:
        if isinstance(reasons, (list, tuple)) and reasons:
            return str(reasons[0])[:160]
    return None


def recompile_note(summary: pd.DataFrame, runs: pd.DataFrame | None = None) -> str | None:
    if "compile_recompiles" not in summary:
        return None
    counts = pd.to_numeric(summary["compile_recompiles"], errors="coerce")
    rows = summary[counts.gt(RECOMPILES_ALLOWED).fillna(False).astype(bool)]
    if rows.empty:
        return None
    each = topology_names(pd.DataFrame({"topology": [f"{r['topology']} ({int(r['compile_recompiles'])} times)"
                                             for _, r in rows.iterrows()]}))
    reason = next((r for r in (_first_reason(runs, t) for t in rows["topology"]) if r), None)
    why = f" The first reason recorded: {reason}." if reason else ""
    return (f"torch.compile recompiled more than once in {each}.{why} Each recompilation ran "
            "inside the training epochs: its compile time counts in the fit time, and in the "
            "throughput when it came after the warm-up epoch(s), so their numbers understate "
            "what the compiled code can do. Static shapes avoid it: every batch the same size "
            "(drop_last=True) and no Python values that change from step to step.")


def probe_na_note(probes: dict[str, dict]) -> str | None:
    """Topologies whose probe could not measure: their runs trained and count, their breakdown not."""
    failed = {name: p for name, p in probes.items() if breakdown.is_na(p)}
    if not failed:
        return None
    reasons = list(dict.fromkeys(p["reason"] for p in failed.values()))
    names = topology_names(pd.DataFrame({"topology": list(failed)}))
    return (f"The probe could not measure {names} ({'; '.join(reasons)}): where the step's time goes and the "
            "prediction are unknown there; the runs trained, and their throughput and accuracy are measured.")


def mfu_over_one_note(runs: pd.DataFrame | None) -> str | None:
    """Runs whose MFU exceeds 100%: no run outpaces its GPU's peak, so the peak the MFU was
    divided by (wrong card, or float32 held to the FP32 peak while it ran as TF32) or the
    FLOP count is wrong. Named so the figure is not trusted."""
    if runs is None:
        return None
    over = runs[pd.to_numeric(runs["mfu"], errors="coerce") > 1.0]
    if over.empty:
        return None
    shown = []
    for _, r in over.sort_values(["world_size", "topology", "repeat"]).iterrows():
        peak, used = r["peak_tflops_per_device"], r["peak_precision"]
        against = (f"{peak:g} TFLOP/s per device ({used} peak)"
                   if isinstance(used, str) and not pd.isna(peak) else "its peak")
        shown.append(f"{r['topology']} repeat {int(r['repeat'])} at {float(r['mfu']):.0%} of {against} on "
                     f"{r['device_name']}, {r['precision']}")
    return (f"MFU above 100% ({'; '.join(shown)}): no run is faster than its GPU's peak, so the peak used "
            "(a card missing from the peak table or misnamed, float32 that ran as TF32 without "
            "torch.get_float32_matmul_precision() saying so) or the FLOP count is wrong. Do not trust "
            "these MFU figures.")


def flops_notes(runs: pd.DataFrame | None) -> list[str]:
    """What the FLOP count means where it is not one plain figure: FLOPs per sample that vary
    from batch to batch (by more than 5%), activation recomputation left out of MFU, and runs
    whose FLOPs could not be counted, with why."""
    if runs is None or "flops_batches" not in runs.columns:
        return []
    ordered = runs.sort_values(["world_size", "topology", "repeat"])
    run = lambda r: f"{r['topology']} repeat {int(r['repeat'])}"
    number = lambda column: pd.to_numeric(ordered[column], errors="coerce")
    notes = []
    varying = ordered[number("flops_per_sample_max") > 1.05 * number("flops_per_sample_min")]
    if not varying.empty:
        shown = [f"{run(r)}: {r['flops_per_sample_min']:.3g} to {r['flops_per_sample_max']:.3g} over "
                 f"{int(r['flops_batches'])} batches" for _, r in varying.iterrows()]
        notes.append(f"FLOPs per sample vary from batch to batch ({'; '.join(shown)}): the batches' shapes "
                     "differ (lengths, buckets). TFLOP/s and MFU use the counted batches' FLOPs over their "
                     "samples, which is the training's mix only as far as those batches are.")
    recomputing = ordered[number("flops_recomputed_per_sample") > 0]
    if not recomputing.empty:
        shown = [f"{run(r)}: {r['flops_recomputed_per_sample']:.3g} per sample, "
                 f"{r['flops_recomputed_per_sample'] / r['flops_per_sample']:.0%} of the model's"
                 for _, r in recomputing.iterrows()]
        notes.append(f"Activation checkpointing recomputed forward work in backward ({'; '.join(shown)}). "
                     "MFU counts model FLOPs only; HFU (hardware FLOPs utilisation) includes the recomputation.")
    uncounted = ordered[[isinstance(v, str) and bool(v) for v in ordered["flops_reason"]]]
    if not uncounted.empty:
        reasons = list(dict.fromkeys(uncounted["flops_reason"]))
        notes.append(f"FLOPs not counted in {', '.join(run(r) for _, r in uncounted.iterrows())} "
                     f"({'; '.join(reasons)}): TFLOP/s and MFU are n/a there.")
    return notes


def caveats(summary: pd.DataFrame, comparison: Comparison, runs: pd.DataFrame, steps: pd.DataFrame,
            probes: dict | None = None) -> list[str]:
    """Sentences for the verdict: where a number cannot mean what it seems, and what to do."""
    bound = boundness.judge_baseline(runs, steps, comparison.baseline)
    notes = [comparison.not_compared, unknown_accuracy_note(summary, comparison),
             untested_accuracy_note(summary, comparison), probe_na_note(probes or {}),
             oversubscribed_note(summary), simulated_nodes_note(summary), interconnect.fallback_note(runs),
             boundness.sentence(bound, devices=device_word(summary),
                                model_classes=runs["model_class"]),
             recompile_note(summary, runs), mfu_over_one_note(runs), *flops_notes(runs)]
    return [n for n in notes if n]
