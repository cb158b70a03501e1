"""The full training's cost, projected from what a run measured, and what the answer itself cost.

A throughput run stops after a few hundred steps; the user still wants to know what the
configured training would take on each topology before paying for it. Per run:

    projected seconds = configured_epochs x samples_per_epoch / window throughput
                        + what the configured training spends outside its steps
                        + the warm-up's excess over the steady rate

where samples_per_epoch is the loader's length or, where it has none (an iterable dataset), the
samples counted in the whole epochs the run trained (samples_per_epoch_from says which), and
the seconds outside the steps (overheads) are, per epoch, what no step took besides
validating and saving (the loader's start, hooks between epochs), plus each validation and
each checkpoint save as often as the trainer's settings make them (check_val_every_n_epoch:
events). The first of each kind in a process is cold (no sanity validation before the first,
eval graphs compiling, the first save): the warm figure comes from a later one, and the first
one's excess is added once (warm_and_once). A throughput run stops in its first epoch, so it
validates and saves again after its stop until two of each were timed
(ddpscale.job.measure.windows.warm_overheads).

and x world size / 3600 in device-hours. A full run also measured the real thing (fit time +
checkpoint writes), so there the projection is checked against it, made from the run's first
part only (first_part: the windows until throughput mode's rule would have stopped), so the
check tests the extrapolation, not the run against itself. A figure a run did not measure (no
steady window throughput: too few windows) leaves its projection n/a with the reason: never a guess.
Pure pandas, unit-tested on hand-made records.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace

import pandas as pd

from ddpscale.core import steadystate
from ddpscale.run.measuremode import THROUGHPUT
from ddpscale.report.figures.scaling import log_spread_over_repeats, wider_spread
from ddpscale.report.fmt import duration, duration_estimate, hours, hours_estimate, supported
from ddpscale.report.load.records import held_devices, known, measure_mode

# What one projection needs from a metrics record: every run records them.
INPUTS = ("configured_epochs", "samples_per_epoch", "window_throughput_samples_s", "epoch_overhead_s",
          "warmup_excess_s")

# Why samples_per_epoch can be null (ddpscale.job.measure.windows.epoch_size): the loader has no length
# and the run trained no whole epoch in which to count them.
NO_EPOCH_SIZE = ("samples per epoch not known: the train loader has no length (an iterable dataset) and the run "
                 "trained no whole epoch of it to count them in; raise throughput.min_windows until min_windows x "
                 "window_steps steps cover an epoch, or give the dataset a __len__")

PROJECTION_COLUMNS = ("topology", "world_size", "repeats", "epochs", "global_batch", "from_steps", "projected_s",
                      "projected_device_hours", "projected_held_device_hours", "jobs", "job_limit_s", "measured_s",
                      "error", "why_na", "projected_s_low", "projected_s_high", "projected_device_hours_low",
                      "projected_device_hours_high")
# projected_s_low/high: its 95% interval from the throughput it was projected from (the steps'
# seconds scale with 1 / throughput; the seconds outside them are measured, not projected), with
# the spread between repeats where that is wider (scaling.log_spread_over_repeats).


def _number(value) -> float | None:
    try:
        return float(value) if known(value) else None
    except (TypeError, ValueError):
        return None


def warm_and_once(seconds) -> tuple[float | None, float]:
    """(the warm figure, the first one's one-off excess over it) of the seconds of one kind of
    event in the order they happened. The first in a process is cold (a validation with no
    sanity steps before it, eval graphs compiling, the loader's first start, the first save):
    the warm figure is the mean of the later ones where there are any. One timed: its cold
    figure, an overestimate. None timed: None."""
    seconds = [float(s) for s in seconds]
    if not seconds:
        return None, 0.0
    if len(seconds) == 1:
        return seconds[0], 0.0
    warm = sum(seconds[1:]) / (len(seconds) - 1)
    return warm, max(0.0, seconds[0] - warm)


def events(epochs: int, check_val_every_n_epoch, validates) -> tuple[int, int]:
    """(validations, checkpoint saves) a training of `epochs` epochs makes, as Lightning 2.6
    decides them for ddpscale's trainer (val_check_interval is refused, so validation runs at the
    end of every check_val_every_n_epoch-th epoch; the epoch checkpoint, save_on_train_epoch_end
    unset, saves at every epoch's end when validation is every epoch or never, else after each
    validation). tests/workflow/test_validation_timing.py checks both against real runs."""
    every = int(check_val_every_n_epoch or 1)
    validations = epochs // every if validates else 0
    return validations, (epochs if every == 1 else validations)


def _in_epoch(pairs, epoch: int) -> float:
    return sum(float(s) for e, s in pairs if e == epoch)


def overheads(record, epochs: float) -> tuple[float | None, float, str | None]:
    """(seconds the configured training spends outside its steps, the one-off part of them,
    None) or (None, 0, why not).
    Per epoch what no step took besides validation and saving (loader start, hooks); each
    validation and save as often as the trainer's settings make them; each kind's first
    one-off excess once. Where one epoch was timed (a throughput run's usual case), its loader
    start and hooks are that epoch's, cold where the loader's workers persist: a few seconds an
    epoch too many at most."""
    per_epoch, validations, saves = record["epoch_overheads_s"], record["validation_s"], record["checkpoint_save_s"]
    other = [max(0.0, float(o) - _in_epoch(validations, i) - _in_epoch(saves, i)) for i, o in enumerate(per_epoch)]
    warm, once = warm_and_once(other)
    total, once_total = epochs * (warm or 0.0) + once, once
    n_validations, n_saves = events(int(epochs), _number(record["check_val_every_n_epoch"]),
                                    record["validates"] in (True,))  # numpy's True too
    for kind, n, pairs, after in (("validation", n_validations, validations, "after_stop_validation_s"),
                                  ("checkpoint save", n_saves, saves, "after_stop_checkpoint_s")):
        if n:
            warm, once = warm_and_once([s for _, s in pairs] + list(record[after]))
            if warm is None:
                return None, 0.0, f"no {kind} was timed"
            total, once_total = total + n * warm + once, once_total + once
    return total, once_total, None


def first_part(record) -> dict | None:
    """A full run's figures as throughput mode would have had them: its stopping rule replayed on
    the run's first windows (metrics.json window_seconds), so the projection made from them is
    checked against the rest of the run, not against itself. None where the run timed no window
    (it trained fewer steps than one)."""
    seconds, samples = record["window_seconds"], record["window_samples"]
    if not seconds:
        return None
    # the run's own rule, without caps: a replay stops on its precision or not at all
    rule = replace(steadystate.Rule.of(record["throughput"]), max_steps=None, max_minutes=None)
    for used in range(rule.min_windows, len(seconds) + 1):
        if rule.looks_at(used):
            decision = steadystate.decide(list(seconds[:used]), list(samples[:used]), rule)
            if decision.stop:
                break
    else:  # the rule would never have stopped: all the windows, as at the end of training
        used = len(seconds)
        decision = steadystate.decide(list(seconds), list(samples), rule, ended=True)
    steps = used * rule.window_steps
    per_step, world = int(record["batch_per_device"]), int(record["world_size"])
    spe = _number(record["samples_per_epoch"])  # null where no epoch's size is known
    epochs = max(1, math.ceil(steps * per_step * world / spe) if spe else 1)
    part = {"window_throughput_samples_s": decision.throughput if decision.steady_windows else None,
            "throughput_half_width": decision.half_width if decision.steady_windows else None,
            "warmup_excess_s": steadystate.warmup_excess_s(list(seconds[:used]), list(samples[:used]), decision),
            "epoch_overheads_s": list(record["epoch_overheads_s"][:epochs]), "steps": steps}
    # the part's validations and saves; the run's next ones stand for those throughput mode
    # times after its stop (until two of each), as warm as they are
    for pairs_key, after_key in (("validation_s", "after_stop_validation_s"),
                                 ("checkpoint_save_s", "after_stop_checkpoint_s")):
        pairs = record[pairs_key]
        inside = [list(p) for p in pairs if p[0] < epochs]
        part[pairs_key] = inside
        part[after_key] = [s for e, s in pairs if e >= epochs][:max(0, 2 - len(inside))]
    return part


def project_run(record, part: dict | None = None) -> tuple[float, str | None]:
    """(projected seconds of the configured training, None) or (NaN, why it cannot be projected).
    A full run is projected from its first part only (first_part, computed here unless the
    caller has it), as throughput mode would have measured it."""
    projected, _, why, _ = _project(record, part)
    return projected, why


def _project(record, part: dict | None) -> tuple[float, float, str | None, float]:
    """project_run's figure, what of it a new process pays again (the warm-up and the first
    validation's, save's and epoch's one-off excess), for a training split into jobs, why it is
    n/a, and the seconds of its training steps (what the throughput's interval scales)."""
    record = dict(record)
    if record["measure"] != THROUGHPUT:
        part = part if part is not None else first_part(record)
        if part is not None:
            record.update(part)
    values = {key: _number(record[key]) for key in INPUTS}
    missing = [key for key, value in values.items() if value is None]
    if missing == ["samples_per_epoch"]:
        return math.nan, math.nan, NO_EPOCH_SIZE, math.nan
    if missing:
        return math.nan, math.nan, f"not recorded: {', '.join(missing)}", math.nan
    if values["window_throughput_samples_s"] <= 0:
        return math.nan, math.nan, "no steady window throughput measured", math.nan
    overhead, once, why = overheads(record, values["configured_epochs"])
    if why:
        return math.nan, math.nan, why, math.nan
    steps_s = values["configured_epochs"] * values["samples_per_epoch"] / values["window_throughput_samples_s"]
    return steps_s + overhead + values["warmup_excess_s"], once + values["warmup_excess_s"], None, steps_s


def _relative_half_width(record, part: dict | None) -> float:
    """The relative half-width of the window throughput a run is projected from (NaN: none)."""
    source = part if part is not None else record
    half, figure = _number(source.get("throughput_half_width")), _number(source.get("window_throughput_samples_s"))
    return half / figure if half is not None and figure else math.nan


def outside_training_s(record) -> float:
    """Seconds the run held its devices outside what the projection models (its windows and
    its epochs' non-training seconds): process start, process-group and data set-up, the
    sanity check, a partial last window, the test pass and writing the record; the probe and
    throughput mode's validations and saves after its stop (measurements, not part of a
    training) left out. A full training pays these too, once, so
    its projected held device-hours add them, as "this answer cost" counts them in held time.
    NaN where the run was resumed (its held time spans attempts its windows do not)."""
    if record["attempts"] > 1:
        return math.nan
    after_stop = sum(record["after_stop_validation_s"]) + sum(record["after_stop_checkpoint_s"])
    return max(0.0, record["held_s"] - record["probe_s"] - sum(record["window_seconds"])
               - sum(record["epoch_overheads_s"]) - after_stop)


def measured_run(record) -> float:
    """A full run's own full-training seconds: its epochs plus its checkpoint writes."""
    return float(record["fit_time_s"]) + float(record["checkpoint_s"])


def per_run(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per run: topology, world_size, projected_s, why_na, measured_s (full mode only)."""
    full = measure_mode(runs) != THROUGHPUT
    rows = []
    for _, record in runs.iterrows():
        part = first_part(record) if full else None
        projected, again, why, steps_s = _project(record, part)
        outside = outside_training_s(record)
        epochs = _number(record["configured_epochs"])
        # a full run its module stopped early (EarlyStopping) measured fewer epochs than
        # configured: its check compares the projection of the epochs it trained
        stopped = record["early_stop"]
        compared = (_project({**record, "configured_epochs": stopped["epochs_trained"]}, part)[0]
                    if full and isinstance(stopped, dict) else projected)
        rows.append({"topology": record["topology"], "world_size": int(record["world_size"]),
                     "projected_s": projected, "why_na": why, "compared_s": compared,
                     "measured_s": measured_run(record) if full else math.nan,
                     "from_steps": part["steps"] if part else _number(record["steps_measured"]),
                     "outside_s": outside,
                     # what each job after the first pays again: start-up and set-up, the warm-up,
                     # the cold first validation, save and epoch
                     "restart_s": outside + again,
                     "epoch_s": projected / epochs if epochs else math.nan,
                     "steps_s": steps_s, "spread": _relative_half_width(record, part),
                     "throughput": _number((part or record).get("window_throughput_samples_s"))})
    return pd.DataFrame(rows, columns=["topology", "world_size", "projected_s", "why_na", "compared_s", "measured_s",
                                       "from_steps", "outside_s", "restart_s", "epoch_s", "steps_s", "spread",
                                       "throughput"])


def _interval(group: pd.DataFrame, projected: float) -> tuple[float, float]:
    """(low, high) of a topology's projected seconds: the steps' seconds scaled by the wider of
    its runs' own interval (median over repeats) and the spread between 3 or more repeats, on
    the log scale; NaN where neither is known."""
    relative = group["spread"].median() if group["spread"].notna().all() else math.nan
    width, _ = wider_spread(relative, log_spread_over_repeats(group["throughput"]))
    if math.isnan(width) or math.isnan(projected) or group["steps_s"].isna().any():
        return math.nan, math.nan
    steps = float(group["steps_s"].median())
    rest = projected - steps
    return rest + steps * math.exp(-width), rest + steps * math.exp(width)


def parse_limits(text: str) -> dict:
    """report.py --job-limits: JSON {topology: {"limit_s": seconds > 0, "signal_s": seconds >= 0
    and below the limit}}, as the workflow writes it from the profile; anything else refused."""
    try:
        limits = json.loads(text)
    except ValueError as err:
        raise ValueError(f"--job-limits is not JSON ({err})") from None
    if not isinstance(limits, dict):
        raise ValueError("--job-limits must map topologies to {\"limit_s\", \"signal_s\"}")
    for topology, limit in limits.items():
        if not isinstance(limit, dict) or set(limit) != {"limit_s", "signal_s"} or not all(
                isinstance(v, int) and not isinstance(v, bool) for v in limit.values()) \
                or not 0 <= limit["signal_s"] < limit["limit_s"]:
            raise ValueError(f"--job-limits: {topology!r} must be {{\"limit_s\": seconds > 0, \"signal_s\": seconds "
                             f">= 0 and below it}}, got {limit!r}")
    return limits


def jobs(held_s: float, restart_s: float, epoch_s: float, limit: dict | None) -> tuple[float, int, str | None]:
    """(held seconds, jobs, None) of a training that holds its devices held_s in one job, split
    into as many jobs as the job time limit makes it (limit: {"limit_s", "signal_s"}; None: one
    job). A job warned `signal_s` before its limit saves and exits there; each later job pays
    restart_s again; where there is no warning, a killed job loses on average half an epoch
    since its last epoch checkpoint. (NaN, 0, why) where a job cannot get past its restart."""
    if math.isnan(held_s):
        return held_s, 0, None
    if limit is None:
        return held_s, 1, None
    usable = limit["limit_s"] - limit["signal_s"]
    if held_s <= usable:
        return held_s, 1, None
    if math.isnan(restart_s):
        return math.nan, 0, "the start-up a resumed job repeats is not known (a resumed run)"
    lost = 0.0 if limit["signal_s"] else epoch_s / 2
    per_job = usable - restart_s - lost
    if per_job <= 0:
        return math.nan, 0, (f"a job of the {duration(limit['limit_s'])} time limit spends it all starting again "
                             f"({duration(restart_s + lost)})")
    more = math.ceil((held_s - usable) / per_job)
    return held_s + more * (restart_s + lost), 1 + more, None


def _reasons(values: pd.Series) -> str | None:
    return "; ".join(dict.fromkeys(str(v) for v in values if isinstance(v, str))) or None


def projection(runs: pd.DataFrame, limits: dict | None = None) -> pd.DataFrame:
    """Per topology (in world-size order): the median over repeats of the projected and, in full
    mode, the measured full training; error = projected / measured - 1. A topology with a repeat
    that cannot be projected is n/a, with the reason (a median of the rest would hide it).
    limits: {topology: {"limit_s", "signal_s"}}, the job time limit a training of it runs under
    (the profile's; none locally): a training longer than one job is split into jobs (jobs)."""
    each = per_run(runs)
    rows = []
    for topology, group in each.groupby("topology", sort=False):
        why = _reasons(group["why_na"])
        projected = math.nan if why else float(group["projected_s"].median())
        measured = float(group["measured_s"].median()) if group["measured_s"].notna().all() else math.nan
        compared = math.nan if why else float(group["compared_s"].median())
        world = int(group["world_size"].iloc[0])
        record = runs[runs["topology"] == topology].iloc[0]
        # the projected training plus what a training holds its devices for besides (start-up,
        # set-up, the test pass): the same things the answer's held cost counts
        outside = float(group["outside_s"].median()) if group["outside_s"].notna().all() else math.nan
        restart = float(group["restart_s"].median()) if group["restart_s"].notna().all() else math.nan
        epoch_s = group["epoch_s"].dropna()
        held, split, split_why = jobs(projected + outside, restart, float(epoch_s.median()) if len(epoch_s) else math.nan,
                                      (limits or {}).get(topology))
        billed = float(held_devices(runs[runs["topology"] == topology]).iloc[0])
        low, high = _interval(group, projected)
        rows.append({"topology": topology, "world_size": world, "repeats": len(group),
                     # what is projected: so many epochs at this global batch (weak scaling grows it)
                     "epochs": _number(record["configured_epochs"]),
                     # the training steps the projection was made from (median over repeats)
                     "from_steps": float(group["from_steps"].median()) if group["from_steps"].notna().any() else math.nan,
                     "global_batch": _number(record["effective_batch"]),
                     "projected_s": projected, "projected_device_hours": projected * world / 3600.0,
                     "projected_held_device_hours": held * billed / 3600.0,
                     "jobs": split if split else math.nan,
                     "job_limit_s": (limits or {}).get(topology, {}).get("limit_s", math.nan),
                     "measured_s": measured, "error": compared / measured - 1.0 if measured else math.nan,
                     "why_na": why or split_why, "projected_s_low": low, "projected_s_high": high,
                     "projected_device_hours_low": low * world / 3600.0,
                     "projected_device_hours_high": high * world / 3600.0})
    table = pd.DataFrame(rows, columns=list(PROJECTION_COLUMNS))
    return table.sort_values(["world_size"], kind="stable").reset_index(drop=True)


@dataclass(frozen=True)
class Spent:
    """What this answer cost, and in throughput mode what answering by full training would have."""
    answer_device_hours: float  # answer_cost
    full_device_hours: float | None  # full_cost; None in full mode, which trained in full; NaN: not known
    full_why_na: str | None  # why full_device_hours is not known


def spent(runs: pd.DataFrame, table: pd.DataFrame) -> Spent:
    """What the runs cost, and what the projections (projection's table of them) say full training would."""
    full, why = full_cost(table) if measure_mode(runs) == THROUGHPUT else (None, None)
    return Spent(answer_device_hours=answer_cost(runs), full_device_hours=full, full_why_na=why)


def answer_cost(runs: pd.DataFrame) -> float:
    """What measuring cost: the sum over all runs of the time each held its devices x devices,
    in device-hours."""
    return float((runs["held_s"].astype(float) * held_devices(runs)).sum() / 3600.0)


def full_cost(table: pd.DataFrame) -> tuple[float, str | None]:
    """What answering by full training would have cost: one projected full training per
    topology, held device-hours (start-up and set-up included, as the answer's cost counts them)
    where every topology's are known, else the training's alone."""
    missing = table[table["projected_device_hours"].isna()]
    if len(missing):
        return math.nan, f"{', '.join(map(str, missing['topology']))} could not be projected"
    held = table["projected_held_device_hours"]
    return float((held if held.notna().all() else table["projected_device_hours"]).sum()), None


def what(row) -> str:
    """'50 epochs at global batch 256': what a projection is of (n/a parts left out)."""
    epochs, batch = row.get("epochs"), row.get("global_batch")
    text = f"{epochs:.0f} epochs" if known(epochs) else "the configured epochs"
    return text + (f" at global batch {batch:,.0f}" if known(batch) else "")


def in_jobs(row) -> str:
    """' in 3 jobs of the 4.0 h time limit' where the training outlasts one job, else ''."""
    n, limit = row.get("jobs"), row.get("job_limit_s")
    return f" in {n:.0f} jobs of the {duration(limit)} time limit" if known(n) and n > 1 and known(limit) else ""


def projected_time(row) -> str:
    """'3.1 h (2.8–3.5 h)': a projected training's time with its interval, as every table writes it."""
    return duration_estimate(row.get("projected_s"), row.get("projected_s_low"), row.get("projected_s_high"))


def projected_hours(row) -> str:
    """'25 (22–28)': its device-hours with their interval."""
    return hours_estimate(row.get("projected_device_hours"), row.get("projected_device_hours_low"),
                          row.get("projected_device_hours_high"))


def sentence(table: pd.DataFrame, label: str) -> str:
    """'full training on 1x4 (50 epochs at global batch 256): 5.0 h (4.6–5.5 h), 20 (18–22) GPU-hours; on 2x4
    (...): ...' (n/a rows left out)."""
    known_rows = table[table["projected_s"].notna()]
    parts = [f"{r['topology']} ({what(r)}): {projected_time(r)}, "
             f"{projected_hours(r)} {label}{in_jobs(r)}" for _, r in known_rows.iterrows()]
    return "full training on " + "; on ".join(parts) if parts else ""


def weak_scaling_note(table: pd.DataFrame | None, summary: pd.DataFrame, baseline: str) -> str | None:
    """Where the global batch grew over the baseline's and accuracy was not compared at it, a
    projection of the configured epochs assumes those epochs converge at the larger batch, which
    nothing here showed (MLPerf keeps reference convergence points per batch size for this)."""
    if table is None or table.empty or "global_batch" not in table:
        return None
    base = table.loc[table["topology"] == baseline, "global_batch"]
    if base.empty or not known(base.iloc[0]):
        return None
    grown = table[(table["global_batch"] > base.iloc[0]) & table["projected_s"].notna()]
    if grown.empty:
        return None
    held = summary.set_index("topology")["accuracy_held"] if "accuracy_held" in summary else None
    def shown(topology) -> bool:
        value = held.get(topology) if held is not None else None
        return value is not None and pd.notna(value) and bool(value)

    untested = [t for t in grown["topology"] if not shown(t)]
    if not untested:
        return None
    batches = ", ".join(f"{t} {b:,.0f}" for t, b in zip(grown["topology"], grown["global_batch"]) if t in untested)
    return (f"The projections of {', '.join(untested)} are of the configured epochs at a global batch larger "
            f"than the baseline's {base.iloc[0]:,.0f} ({batches}), and accuracy was not shown to hold at it "
            "here: a larger batch can need more epochs to converge. Train the configured epochs in full "
            "(measure: full, 3 or more repeats) to test it, or scale the batch strongly (batch.scaling: strong)")


def cost_sentence(cost: Spent, label: str) -> str:
    """'This answer cost X GPU-hours (held), 28% of what training every topology in full would take
    (Y GPU-hours, held).' In throughput mode the answer is weighed against the training it saves:
    where it cost more, it says how many times more."""
    text = f"This answer cost {hours(cost.answer_device_hours)} {label} (held)"
    if cost.full_device_hours is not None:
        full = cost.full_device_hours
        if pd.isna(full):
            text += f"; what training every topology in full would take is not known ({cost.full_why_na})"
        else:
            share = cost.answer_device_hours / full if full > 0 else math.inf
            against = f"{share:.1f}x" if share >= 1 else f"{share:.0%} of"
            text += f", {against} what training every topology in full would take ({hours(full)} {label}, held)"
            if share >= 1:
                text += ": measure: full would have answered for less, with accuracy compared"
    return text + "."


def rounded(table: pd.DataFrame) -> pd.DataFrame:
    """For projection.tsv: seconds to 0.1 s and device-hours to 6 places (a CPU check lasts
    seconds), a projection with an interval to the digits its interval supports (fmt.supported),
    as the tables write it."""
    out = table.copy()
    out["measured_s"], out["error"] = out["measured_s"].round(1), out["error"].round(4)
    out["projected_held_device_hours"] = out["projected_held_device_hours"].round(6)
    for figure, places in (("projected_s", 1), ("projected_device_hours", 6)):
        shown = [supported(v, lo, hi, places)[:3] for v, lo, hi in
                 zip(out[figure], out[f"{figure}_low"], out[f"{figure}_high"])]
        out[figure] = [v for v, _, _ in shown]
        out[f"{figure}_low"] = [lo for _, lo, _ in shown]
        out[f"{figure}_high"] = [hi for _, _, hi in shown]
    return out
