"""A report like a cluster's, built from made-up records in seconds: the browser tests read it, and
`make screenshot` captures its first screen for the README (docs/report.png).

Throughput mode on GPUs, five topologies with 3 repeats each (placement noise), probes for the
breakdown and the all-reduce, and one run that stopped at its step cap (a reason badge). The
figures are invented but shaped like a real transformer's: efficiency falls across nodes.

    .venv/bin/python tests/workflow/report_sample.py OUT_DIR [--screenshot PNG]
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
for folder in ("scripts", "tests"):  # runnable outside pytest too
    sys.path.insert(0, str(ROOT / folder))

from helpers.configs import rule  # noqa: E402
from helpers.records import make_run, probe  # noqa: E402
from helpers.report import run_report, write_fixtures  # noqa: E402

# topology -> (samples/s of the repeats, within-run half width as a share, stop reason)
MEASURED = {"1x1": ((412.0, 405.0, 409.0), 0.012, "precision reached"),
            "1x2": ((800.0, 792.0, 806.0), 0.015, "precision reached"),
            "1x4": ((1560.0, 1530.0, 1575.0), 0.017, "precision reached"),
            "2x2": ((1390.0, 1310.0, 1420.0), 0.047, "step cap reached"),
            "2x4": ((2790.0, 2660.0, 2810.0), 0.019, "precision reached")}
GPU = {"device_kind": "cuda", "device_name": "NVIDIA H100 80GB HBM3", "simulated": False, "backend": "nccl",
       "precision": "bf16-mixed", "gpu_utilization_pct": 91.0, "gpu_peak_memory_mb": 30500.0,
       "flops_per_sample": 1.2e12, "peak_tflops_per_device": 989.0, "peak_precision": "bf16"}


def hosts(nodes: int) -> list[str]:
    """Names as long as a cluster's fully qualified ones: the printed tables must wrap them."""
    return [f"gpu-h100-{i:04d}.cluster.example.org" for i in range(nodes)]


def transport(nodes: int, world: int) -> list[dict] | None:
    """Each rank's network, as ddpscale.job.device.transport records it: NCCL over InfiniBand between
    nodes, within the node on one; one rank has no collectives."""
    if world == 1:
        return None
    kind, interface = ("IB", "mlx5_0:1/IB") if nodes > 1 else ("P2P/SHM", None)
    return [{"rank": rank, "host": hosts(nodes)[rank * nodes // world], "backend": "nccl", "transport": kind,
             "interface": interface} for rank in range(world)]


def runs() -> list[dict]:
    out = []
    for topology, (rates, share, reason) in MEASURED.items():
        nodes, per_node = (int(x) for x in topology.split("x"))
        world = nodes * per_node
        for repeat, rate in enumerate(rates):
            record = make_run(
                topology, repeat=repeat, **GPU, measure="throughput", time_per_epoch_s=None,
                throughput_samples_s=rate, window_throughput_samples_s=rate,
                throughput_half_width=rate * share, stop_reason=reason,
                throughput=rule(max_steps=2000, max_minutes=10).settings(),
                configured_epochs=50, samples_per_epoch=200_000, epoch_overhead_s=8.0, epoch_overheads_s=[8.0],
                validates=False, checkpoint_save_s=[[0, 2.0]], warmup_excess_s=20.0, batch_per_device=32,
                effective_batch=32 * world, fit_time_s=240.0, held_s=300.0, hosts=hosts(nodes),
                achieved_tflops=rate * 1.2, mfu=rate * 1.2 / (989.0 * world), transport=transport(nodes, world))
            if repeat == 0:
                compute = 0.060
                comm = 0.0 if world == 1 else 0.004 * (3 if nodes > 1 else 1)
                record["probe"] = probed = probe(topology, world, 0.002, compute, comm, comm * 1.3, grad=497_000_000)
                for size in probed["allreduce"]:  # as the probe's benchmark writes them
                    size["algbw_gbps"] = size["bytes"] / size["time_s"] / 1e9 if size["time_s"] else None
                    size["busbw_gbps"] = size["algbw_gbps"] and size["algbw_gbps"] * 2 * (world - 1) / world
            out.append(record)
    return out


def build(out_dir: Path) -> Path:
    """The sample report's folder (report.html, its tables and plots) under out_dir."""
    out_dir = Path(out_dir)
    result = run_report(write_fixtures(out_dir, runs()), out_dir / "report",
                        "--expected", *MEASURED, "--repeats", "3", "--experiment", "transformer",
                        "--config-files", "config/config.yaml + config/transformer.yaml")
    if result.returncode != 0:
        raise RuntimeError(result.stderr)
    return out_dir / "report"


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--screenshot", type=Path, help="capture the first screen (1280 x 900) here")
    args = parser.parse_args()
    report = build(args.out_dir)
    print(report / "report.html")
    if args.screenshot:
        from helpers import browser
        browser.screenshot(report / "report.html", args.screenshot, height=900)
        print(args.screenshot)
