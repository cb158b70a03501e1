"""Made-up records as a run writes them (metrics.json, with every key train.py writes; the
probe's record, measured or n/a; a throughput-mode run of known figures) and what the report
makes of them: the comparison, the summary and the report's data."""

from __future__ import annotations

import pandas as pd

from ddpscale.core import record
from helpers.configs import rule
from ddpscale.report import reportdata
from ddpscale.report.figures import scaling


def make_run(topology="1x1", **overrides):
    """One metrics record with every key train.py writes (a CPU run in full mode, probed by no
    one); topology sets nodes/devices/world size. logged_metrics holds val_loss, val_acc and
    test_acc as given, unless a test gives it."""
    nodes, per_node = (int(x) for x in topology.split("x"))
    run = {
        "schema_version": record.SCHEMA_VERSION, "topology": topology, "repeat": 0, "seed": 42,
        "num_nodes": nodes, "devices_per_node": per_node,
        "world_size": nodes * per_node,
        "node_ranks": [r // per_node for r in range(nodes * per_node)],
        "hosts": [f"node{i}" for i in range(nodes)], "simulated_nodes_on_one_host": False, "slurm_job_id": None,
        "device_kind": "cpu", "device_name": "cpu, simulated", "simulated": True,
        "usable_cores": 64, "oversubscribed": False, "transport": None, "site_interconnect": "unknown",
        "backend": "gloo", "scaling": "weak", "batch_per_device": 32,
        "effective_batch": 32 * nodes * per_node, "accumulate_grad_batches": 1,
        "precision": "32-true", "compile": "none", "max_epochs": 3, "configured_epochs": 3, "epochs_completed": 3,
        "warmup_epochs": 1, "epoch_times_s": [12.0, 10.0, 10.0],
        "fit_time_s": 32.0, "steady_samples": 6400, "steady_time_s": 20.0, "samples_trained": 9600,
        "samples_per_epoch": 3200, "samples_per_epoch_from": "the loader's length", "samples_uncounted": None,
        "early_stop": None, "padding_per_epoch": 0,
        "train_loaders_mode": "max_size_cycle", "train_loaders": [{"name": "train", "samples_per_epoch": 3200,
                                                              "padding_per_epoch": 0}],
        "held_s": 40.0, "held_devices": nodes * per_node, "probe_s": 0.0,
        "throughput_samples_s": 100.0, "time_per_epoch_s": 10.0,
        # full mode: its windows measured the throughput to within 1 sample/s (95% interval)
        "measure": "full", "stop_reason": "full training", "throughput_half_width": 1.0,
        "throughput": rule().settings(), "window_seconds": [],  # the schema's rule; full mode: no caps
        "window_samples": [], "window_throughput_samples_s": None, "warmup_excess_s": 0.0, "steps_measured": 0,
        "checkpoint_s": 0.0, "checkpoint_save_s": [], "epoch_overhead_s": 0.0, "epoch_overheads_s": [],
        "validates": True, "check_val_every_n_epoch": 1, "validation_s": [], "after_stop_validation_s": [],
        "after_stop_checkpoint_s": [],
        "flops_per_sample": None, "achieved_tflops": None, "mfu": None, "peak_tflops_per_device": None,
        "peak_precision": None, "gpu_utilization_pct": None, "gpu_utilization_reason": None,
        "gpu_peak_memory_mb": None, "flops_recomputed_per_sample": None, "hfu": None, "flops_batches": 0,
        "flops_per_sample_min": None, "flops_per_sample_max": None, "flops_reason": None,
        "val_loss": 0.3, "val_acc": 0.9, "test_acc": 0.9, "attempts": 1,
        "val_history": [], "val_history_metric": None, "val_history_reason": "no epoch metric configured",
        "resumed_from_epoch": None, "model_class": "M", "model_parameters": 1000, "data_class": "D",
        "optimizers": ["Adam"], "trainer_settings": {}, "module_callbacks": [], "loggers": ["CSVLogger"],
        "ddp": {"used": nodes * per_node > 1},
        "versions": {"python": "3.11", "torch": "2.x", "lightning": "2.x"},
        "started_at": "2025-01-01T00:00:00", "finished_at": "2025-01-01T00:01:00",
        # the same for every run unless a test changes it
        "identity": {"data": {"data.npz": "aaaa"}, "settings": {"seed": 0}, "code": "c0de",
                     "versions": {"torch": "2.x", "lightning": "2.x", "cuda": None, "nccl": None},
                     "digest": "d1"},
    }
    run.update(overrides)
    if "logged_metrics" not in overrides:
        run["logged_metrics"] = {k: run[k] for k in ("val_loss", "val_acc", "test_acc") if run[k] is not None}
    return run


def seeded(topology, values, metric="test_acc", **overrides):
    """One run per value, each a repeat (and so a seed) of its own."""
    return [make_run(topology, repeat=i, **{metric: v, **overrides}) for i, v in enumerate(values)]


def compared(runs, baseline="1x1", metric="test_acc", tolerance=0.02):
    """(summary, comparison) of hand-made runs, as reportdata.build makes them."""
    frame = pd.DataFrame(runs)
    comparison = scaling.compare(frame, baseline, metric, tolerance)
    return scaling.summarize(frame, comparison), comparison


def summarize(runs, baseline="1x1", metric="test_acc", tolerance=0.02):
    return compared(runs, baseline, metric, tolerance)[0]


def probe(topology, world, data_s, compute_s, comm_s, allreduce_s, grad=11_000, timed=None, loop_sync_s=0.0):
    """A probe record; allreduce_s: the gradient's all-reduce in DDP's buckets; timed: {per-device
    batch: compute_s} the baseline's probe timed besides its own."""
    record = {"status": "ok", "topology": topology, "world_size": world, "gradient_bytes": grad, "backend": "gloo",
              "step": {"data_s": data_s, "compute_s": compute_s, "exposed_comm_s": comm_s,
                       "loop_sync_s": loop_sync_s, "accumulate_grad_batches": 1, "method": "timed"},
              "allreduce": [{"bytes": 1024, "time_s": allreduce_s / 4},
                            {"bytes": grad, "time_s": allreduce_s / 2}],
              "allreduce_ddp": {"bytes": grad, "time_s": allreduce_s},
              "sized": "20 steps x 5 rounds, about 0.4 s", "probe_wall_s": 0.4}
    if timed is not None:
        record["step"]["compute_by_batch"] = [{"batch_per_device": b, "compute_s": c} for b, c in timed.items()]
    return record


def summary(*runs):
    return summarize(list(runs))


NO_OPTIMIZER = "PluginError: M.configure_optimizers() returned no optimizer (in building the optimizers)"


def na_probe(topology, world, reason=NO_OPTIMIZER):
    """What a run records when its probe could not measure (it trained anyway)."""
    return {"status": "n/a", "reason": reason, "topology": topology, "world_size": world}


# figures whose projected cost is known by hand (tests/unit/report/figures/test_projection.py: KNOWN_S)
KNOWN = {"configured_epochs": 10, "samples_per_epoch": 36000, "window_throughput_samples_s": 100.0,
         "epoch_overhead_s": 6.0, "epoch_overheads_s": [6.0], "validates": False, "checkpoint_save_s": [[0, 0.0]],
         "checkpoint_s": 6.0, "checkpoint_saves": 3, "warmup_excess_s": 5.0}


def windows_run(topology="1x1", **overrides):
    """A throughput-mode record with the keys the projection reads."""
    return make_run(topology, **{**KNOWN, "measure": "throughput", "time_per_epoch_s": None,
                                 "throughput_half_width": 1.0, "stop_reason": "precision reached",
                                 "throughput": rule(max_steps=2000, max_minutes=10).settings(), **overrides})


def build(runs, baseline: str = "1x1"):
    return reportdata.build(pd.DataFrame(runs), {}, baseline=baseline, metric="test_acc", tolerance=0.02,
                            threshold=0.8, expected=[], repeats=1, log_tails={})
