"""make gpu-check: on a machine with a CUDA GPU, check every GPU path and print its figures.

    .venv/bin/python benchmarks/gpu_check.py            (or: make gpu-check)

1. the GPU tests (pytest -m gpu), which skip on machines without a GPU;
2. the workflow on the local profile with accelerator gpu, for the reference workload (seed
   004's spiral MLP, weak scaling, batch 32, 50 epochs) and the transformer
   (config/transformer.yaml), at 1x1 and every topology this machine's GPUs hold; each in its
   own copy of the workflow under results/gpu-check/, so the user's results/ stay untouched;
3. a table per run: fit time, throughput, MFU, GPU utilisation, FLOPs counted vs analytic,
   recompilations. Figures are printed, never judged: a shared GPU is noisy.
It exits non-zero when there is no GPU, a GPU test fails, or a workflow fails.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
sys.path.insert(0, str(ROOT / "scripts"))
from ddpscale.hostdevices import visible_gpus  # noqa: E402

# The figures the issue's first H100 run quotes: seed 004 at 1x1 took 362 s on an A100.
REFERENCE = {"batch": {"scaling": "weak", "size": 32}, "max_epochs": 50,
             "model": {"class_path": "ddpscale.models.SpiralMLP",
                       "init_args": {"hidden": [64, 32, 16], "dropout": 0.2, "lr": 0.001}}}
WORKLOADS = {"reference": ("config/config.yaml", REFERENCE), "transformer": ("config/transformer.yaml", {})}


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
    folder = ROOT / "results/gpu-check" / name
    shutil.rmtree(folder, ignore_errors=True)
    for part in ("workflow", "scripts", "profiles", "config"):
        shutil.copytree(ROOT / part, folder / part, ignore=shutil.ignore_patterns("__pycache__"))
    return folder


def run_workload(name: str, topologies: list[str]) -> tuple[int, list[dict]]:
    configfile, overrides = WORKLOADS[name]
    folder = workspace(name)
    overlay = {**overrides, "topologies": topologies, "baseline": "1x1", "accelerator": "gpu", "repeats": 1}
    (folder / "config/gpu_check.yaml").write_text(yaml.safe_dump(overlay, sort_keys=False))
    command = [str(BIN / "snakemake"), "--profile", "profiles/local", "--configfile", configfile,
               "config/gpu_check.yaml"]
    print(f"\n== {name}: {' '.join(command)}  (in {folder.relative_to(ROOT)})", flush=True)
    code = subprocess.call(command, cwd=folder)
    runs = []
    for path in sorted((folder / "results/runs").glob("*/r0/metrics.json")):
        runs.append(json.loads(path.read_text()))
    return code, runs


def fmt(value, spec: str, missing: str = "n/a") -> str:
    return missing if value is None else format(value, spec)


def table(rows: list[tuple[str, dict]]) -> str:
    head = (f"{'workload':<12}{'topology':<9}{'device':<26}{'fit s':>8}{'samples/s':>12}{'MFU':>7}"
            f"{'util %':>8}{'FLOPs/sample counted = analytic':>34}{'recompiles':>11}")
    lines = [head, "-" * len(head)]
    for name, m in rows:
        counted, analytic = m.get("flops_per_sample"), m.get("flops_per_sample_analytic")
        check = f"{fmt(counted, ',.0f')} {'=' if counted == analytic else '!='} {fmt(analytic, ',.0f')}"
        lines.append(f"{name:<12}{m['topology']:<9}{m['device_name'][:25]:<26}{fmt(m['fit_time_s'], '.1f'):>8}"
                     f"{fmt(m['throughput_samples_s'], ',.0f'):>12}{fmt(m.get('mfu'), '.1%'):>7}"
                     f"{fmt(m.get('gpu_utilization_pct'), '.0f'):>8}{check:>34}"
                     f"{fmt(m.get('compile_recompiles'), 'd', '-'):>11}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", choices=sorted(WORKLOADS), action="append", help="workloads to run (default: all)")
    p.add_argument("--skip-tests", action="store_true", help="do not run pytest -m gpu first")
    args = p.parse_args(argv)
    gpus = visible_gpus()
    if gpus.count == 0:
        print(f"make gpu-check needs a CUDA GPU and found none ({gpus.source}); CI never has one. "
              "Run it on a GPU node, e.g. inside an interactive SLURM job with --gres=gpu:1", file=sys.stderr)
        return 2
    failures = []
    if not args.skip_tests:
        print(f"== GPU tests on {gpus.count} GPU(s): pytest -m gpu", flush=True)
        if subprocess.call([sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-rs"], cwd=ROOT) != 0:
            failures.append("pytest -m gpu")
    topologies = topologies_for(gpus.count)
    rows = []
    for name in args.only or list(WORKLOADS):
        code, runs = run_workload(name, topologies)
        if code != 0:
            failures.append(f"{name} workflow (exit {code})")
        rows += [(name, m) for m in runs]
    print("\n" + table(rows))
    if failures:
        print("\nfailed: " + "; ".join(failures), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
