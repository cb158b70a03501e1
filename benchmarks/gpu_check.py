"""make gpu-check: on a machine with a CUDA GPU, check every GPU path and print its figures.

    .venv/bin/python benchmarks/gpu_check.py      (or: make gpu-check)
    python3 benchmarks/gpu_check.py               (a GPU node's own Python: no venv needed;
                                                   or make gpu-check GPU_CHECK_PYTHON=python3)

1. the GPU tests (pytest -m gpu), which skip on machines without a GPU;
2. the workflow on the local profile with accelerator gpu, at 1x1 and every topology this
   machine's GPUs hold: the reference workload (the MPCDF Raven tutorial's spiral MLP, weak scaling, batch
   32, 50 epochs, full training: its fit time is the guides' figure) and the transformer
   (config/transformer.yaml) eager and compiled, each measured in throughput mode (the
   cluster default: steady state to 2%, then stop). Each in its own copy of the workflow
   under results/gpu-check/, so the user's results/ stay untouched. Started with the
   snakemake console script beside this Python, else `python -m snakemake`; where snakemake
   is not importable at all, this stage is skipped with a one-line reason;
3. a table per run: fit time, throughput, MFU, GPU utilisation, FLOPs counted vs analytic,
   recompilations. Figures are printed, never judged: a shared GPU is noisy;
4. a plain PyTorch loop over the transformer's 1x1 (same model, data, batch, precision, fused
   AdamW, the same CPU threads as the pipeline's rank; no Lightning) and the pipeline's
   throughput as a fraction of it.
Everything printed is also written to results/gpu-check/figures.json (--out).
It exits non-zero when there is no GPU, a GPU test fails, or a workflow fails.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from ddpscale.run.hostdevices import choose_accelerator, usable_cores, visible_gpus  # noqa: E402
from ddpscale.run.topology import Topology  # noqa: E402
from ddpscale.plan.workflowplan import snakemake_command  # noqa: E402

CHECK = ROOT / "results/gpu-check"
# The figure the MPCDF Raven tutorial quotes for its spiral MLP at 1x1: 362 s on an A100.
REFERENCE = {"batch": {"scaling": "weak", "size": 32}, "max_epochs": 50,
             "model": {"class_path": "ddpscale.workloads.models.SpiralMLP",
                       "init_args": {"hidden": [64, 32, 16], "dropout": 0.2, "lr": 0.001}}}
# The transformer's steady state is what a cluster user is shown; five full epochs would
# spend minutes of a lent GPU on the same figure.
TRANSFORMER = {"measure": "throughput"}
WORKLOADS = {"reference": ("config/config.yaml", {**REFERENCE, "measure": "full"}),
             "transformer": ("config/transformer.yaml", {**TRANSFORMER, "compile": "none"}),
             "transformer-compiled": ("config/transformer.yaml", {**TRANSFORMER, "compile": "default"})}
# metrics.json entries kept in figures.json, per run
FIGURES = ("topology", "device_name", "precision", "compile", "measure", "fit_time_s", "fit_wall_s",
           "throughput_samples_s", "throughput_half_width", "stop_reason", "steps_measured", "achieved_tflops",
           "peak_tflops_per_device", "peak_precision", "mfu", "gpu_utilization_pct", "gpu_utilization_reason",
           "gpu_peak_memory_mb", "flops_per_sample", "flops_per_sample_analytic", "compile_recompiles",
           "compile_graph_breaks", "test_acc")


def topologies_for(gpus: int) -> list[str]:
    """1x1, every 1xN with N a power of two that fits, and two simulated nodes of half each."""
    names, n = ["1x1"], 2
    while n <= gpus:
        names.append(f"1x{n}")
        n *= 2
    if gpus >= 2:  # two simulated nodes on this host, each with its own GPUs
        half = 1
        while half * 2 <= gpus // 2:
            half *= 2
        names.append(f"2x{half}")
    return names


def workspace(name: str) -> Path:
    folder = CHECK / name
    shutil.rmtree(folder, ignore_errors=True)
    for part in ("workflow", "scripts", "profiles", "config"):
        shutil.copytree(ROOT / part, folder / part, ignore=shutil.ignore_patterns("__pycache__"))
    return folder


def run_workload(snakemake: list[str], name: str, topologies: list[str]) -> tuple[int, list[dict]]:
    configfile, overrides = WORKLOADS[name]
    folder = workspace(name)
    overlay = {"topologies": topologies, "baseline": "1x1", "accelerator": "gpu", "repeats": 1, **overrides}
    (folder / "config/gpu_check.yaml").write_text(yaml.safe_dump(overlay, sort_keys=False))
    command = [*snakemake, "--profile", "profiles/local", "--configfile", configfile, "config/gpu_check.yaml"]
    print(f"\n== {name}: {' '.join(command)}  (in {folder})", flush=True)
    code = subprocess.call(command, cwd=folder)
    runs = []
    # results/<experiment>/runs: the workload's experiment folder (ddpscale.core.layout)
    for path in sorted((folder / "results").glob("*/runs/*/r0/metrics.json")):
        runs.append(json.loads(path.read_text()))
    return code, runs


def fmt(value, spec: str, missing: str = "n/a") -> str:
    return missing if value is None else format(value, spec)


def table(rows: list[tuple[str, dict]]) -> str:
    head = (f"{'workload':<22}{'topology':<9}{'device':<26}{'fit s':>8}{'samples/s':>12}{'MFU':>7}"
            f"{'util %':>8}{'FLOPs/sample counted = analytic':>34}{'recompiles':>11}")
    lines = [head, "-" * len(head)]
    for name, m in rows:
        counted, analytic = m.get("flops_per_sample"), m.get("flops_per_sample_analytic")
        check = f"{fmt(counted, ',.0f')} {'=' if counted == analytic else '!='} {fmt(analytic, ',.0f')}"
        lines.append(f"{name:<22}{m['topology']:<9}{m['device_name'][:25]:<26}{fmt(m['fit_time_s'], '.1f'):>8}"
                     f"{fmt(m['throughput_samples_s'], ',.0f'):>12}{fmt(m.get('mfu'), '.1%'):>7}"
                     f"{fmt(m.get('gpu_utilization_pct'), '.0f'):>8}{check:>34}"
                     f"{fmt(m.get('compile_recompiles'), 'd', '-'):>11}")
    return "\n".join(lines)


def plain_throughput(configfile: str, steps: int = 60, warmup: int = 10, device: str | None = None,
                     threads: int | None = None) -> float:
    """Samples/s of a bare loop over the preset's model and data (what Lightning is compared with),
    on `threads` CPU threads (the pipeline's rank's, so neither side gets more cores)."""
    import torch

    if threads:
        torch.set_num_threads(threads)

    from ddpscale.job.device.flops import precision_plan
    from ddpscale.run import usermodule

    preset = yaml.safe_load((ROOT / configfile).read_text())
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    model = usermodule.load_class(preset["model"]["class_path"], "model", object)(**preset["model"]["init_args"])
    data = usermodule.load_class(preset["data"]["class_path"], "data", object)(
        batch_size=preset["batch"]["size"], **preset["data"]["init_args"])
    data.setup("fit")
    model = model.to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    dtype = precision_plan(preset.get("precision", "32-true"), device.type)["autocast"]
    loader = iter(data.train_dataloader())
    timed = 0
    for step in range(warmup + steps):
        if step == warmup:
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
        x, y = (t.to(device, non_blocking=True) for t in next(loader))
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            loss = model.training_step((x, y), step)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        timed += len(x) if step >= warmup else 0
    if device.type == "cuda":
        torch.cuda.synchronize()
    return timed / (time.perf_counter() - start)


def save(figures: dict, out: Path, started: float) -> None:
    """The figures so far, replaced whole (written beside, then renamed): a check stopped at
    any point leaves a readable file of what it had measured."""
    figures["wall_s"] = time.monotonic() - started
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".part")
    partial.write_text(json.dumps(figures, indent=1) + "\n")
    partial.replace(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", choices=sorted(WORKLOADS), action="append", help="workloads to run (default: all)")
    p.add_argument("--skip-tests", action="store_true", help="do not run pytest -m gpu first")
    p.add_argument("--out", type=Path, default=CHECK / "figures.json", help="where the figures are written")
    args = p.parse_args(argv)
    gpus = visible_gpus()
    if gpus.count == 0:
        print(f"make gpu-check needs a CUDA GPU and found none ({gpus.source}); CI never has one. "
              "Run it on a GPU node, e.g. inside an interactive SLURM job with --gres=gpu:1", file=sys.stderr)
        return 2
    figures = {"python": sys.executable, "gpus": gpus.count, "failures": [], "skipped": [], "runs": []}
    failures, started = figures["failures"], time.monotonic()
    if not args.skip_tests:
        print(f"== GPU tests on {gpus.count} GPU(s): pytest -m gpu", flush=True)
        code = subprocess.call([sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-rs", "-p", "no:cacheprovider"],
                               cwd=ROOT)
        figures["pytest_exit"] = code
        if code != 0:
            failures.append(f"pytest -m gpu (exit {code})")
    snakemake = snakemake_command()
    topologies = topologies_for(gpus.count)
    rows = []
    if snakemake is None:
        reason = (f"workflows skipped: {sys.executable} cannot import snakemake; install requirements.txt "
                  "(make setup) or carry its wheels")
        print(f"\n== {reason}", flush=True)
        figures["skipped"].append(reason)
    save(figures, args.out, started)
    for name in (args.only or list(WORKLOADS)) if snakemake else []:
        code, runs = run_workload(snakemake, name, topologies)
        if code != 0:
            failures.append(f"{name} workflow (exit {code})")
        rows += [(name, m) for m in runs]
        # each workload's figures as soon as it ends: a device lent for minutes may end the
        # check before the last workload does, and what it measured must not go with it
        figures["runs"] = [{"workload": name, **{k: m.get(k) for k in FIGURES}} for name, m in rows]
        if runs:
            print("\n" + table([(name, m) for m in runs]), flush=True)
        save(figures, args.out, started)
    if rows:
        print("\n" + table(rows))
    lm = [m for name, m in rows if name == "transformer" and m["topology"] == "1x1"]
    if lm and lm[0]["throughput_samples_s"]:
        threads = choose_accelerator("gpu", [Topology(1, 1)], gpus.count, usable_cores()).threads
        plain = plain_throughput(WORKLOADS["transformer"][0], threads=threads)
        ratio = lm[0]["throughput_samples_s"] / plain
        figures["plain_loop"] = {"pipeline_samples_s": lm[0]["throughput_samples_s"], "plain_samples_s": plain,
                                 "ratio": ratio, "threads": threads}
        print(f"\ntransformer 1x1: pipeline {lm[0]['throughput_samples_s']:,.1f} samples/s, plain PyTorch loop "
              f"{plain:,.1f} ({threads} CPU threads each): ratio {ratio:.3f} (target >= 0.97)")
    save(figures, args.out, started)
    print(f"\nfigures written to {args.out}")
    if failures:
        print("\nfailed: " + "; ".join(failures), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
