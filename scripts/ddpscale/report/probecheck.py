"""Whether a probe file (scripts/probe.py, given with report.py --probes) describes the runs it
joins: its topology's terms replace theirs, so a probe of another precision, per-device batch,
device, topology or model would explain their step with a step they never took.

A probe embedded in a run's metrics.json ran in that run and needs no check. What a record
lacks (files written before ddpscale recorded it) is not compared.
"""
from __future__ import annotations

import json

import pandas as pd

FIX = ("rerun scripts/probe.py with that run's settings (train.py's flags of the run), or leave the "
       "file out of --probes (the probe the run recorded is used)")


def _model_args(value):
    """Model arguments as data: the run records train.py's JSON flag, the probe the parsed dict."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def facts(probe: dict) -> dict:
    """What the probe says about the run it measured, by the name a run records it under."""
    step = probe.get("step") or {}
    model = probe.get("model") or {}
    return {"topology": probe.get("topology"), "world_size": probe.get("world_size"),
            "num_nodes": probe.get("num_nodes"), "devices_per_node": probe.get("devices_per_node"),
            "precision": probe.get("precision"), "batch_per_device": step.get("batch_per_device"),
            "device_kind": probe.get("device_kind"), "device_name": probe.get("device_name"),
            "model_class": model.get("class"), "model_args": _model_args(model.get("args")),
            "model_trainable_parameters": probe.get("gradient_numel")}


def run_facts(run) -> dict:
    identity = run.get("identity") if isinstance(run.get("identity"), dict) else {}
    settings = identity.get("settings") or {}
    return {key: run.get(key) for key in facts({})} | {"model_args": _model_args(settings.get("model_args"))}


def _known(value) -> bool:
    return value is not None and not (isinstance(value, float) and pd.isna(value))


def differences(probe: dict, run) -> list[str]:
    """'<what> <probe's> (run: <run's>)' for each fact both record and they disagree on."""
    mine, theirs = facts(probe), run_facts(run)
    return [f"{key} {mine[key]!r} (run: {theirs[key]!r})" for key in mine
            if _known(mine[key]) and _known(theirs[key]) and mine[key] != theirs[key]]


def check(probe: dict, runs: pd.DataFrame, source: str) -> None:
    """Refuse, in one line naming the file and the fix, a probe unlike the runs it would join."""
    topology = probe.get("topology")
    rows = runs[runs["topology"] == topology] if "topology" in runs else runs.iloc[0:0]
    if rows.empty:
        raise ValueError(f"{source}: a probe of topology {topology!r}, but no run of it was given; give that "
                         "topology's metrics.json or leave the file out of --probes")
    for _, run in rows.iterrows():
        differ = differences(probe, run)
        if differ:
            raise ValueError(f"{source}: this probe does not describe run {run.get('source', topology)}: it "
                             f"differs in {'; '.join(differ)}; {FIX}")
