"""ddpscale performance harness: prints a table of figures, never a pass/fail.

    .venv/bin/python benchmarks/run.py            (or: make bench)

1. Lightning training path vs plain PyTorch, same model/data/batch/optimizer/steps, rounds
   alternating, on the reference workload (spiral MLP) and a compute-bound one (wide MLP);
   both loops take their batches from resident tensors, as the pipeline does by default, and
   Lightning's extra time per step is split into what removing a part of it saves;
2. the same on 2 ranks (gloo), and weak-scaling efficiency against 1 rank;
   then each fast path's before/after on the Lightning loop (resident batches, torch.compile,
   bf16-mixed, per-step logging), every comparison's variants run in the same processes in
   rotating order, and the per-step cost of ddpscale's own callbacks, timed directly;
3. the local default pipeline end to end from empty results, and dry runs (the first one
   imports the user's modules once; the next finds their facts cached);
4. a resume: a run killed mid-epoch, rerun; rerun time / remaining work (median of rounds);
5. throughput mode against the full training per topology: its figure and interval, its cost
   as a share of the full run's, and the full training's time projected (throughput_mode.py);
6. how often the stopping rule's interval covers the truth, on synthetic window series whose
   steady level is known (stopping_coverage.py; docs/numbers.md has the table).
"""

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import yaml

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
sys.path.insert(0, str(ROOT / "scripts"))
from ddpscale.core.layout import layout  # noqa: E402
from ddpscale.plan.workflowplan import snakemake_command  # noqa: E402
from ddpscale.core.spiral import write_dataset  # noqa: E402

# the console script, as README and `make run` start the workflow, where there is one
SNAKEMAKE = snakemake_command() or [PY, "-m", "snakemake"]

TARGETS = {"ratio": 0.95, "pipeline_s": 90.0, "dry_run_s": 3.0, "resume": 1.2}


def run_loops(workload: str, ranks: int, data_file: str, rounds: int, tmp: Path, *options: str) -> dict:
    out = tmp / f"{workload}-{ranks}-{time.monotonic_ns()}.json"
    cmd = [PY, "benchmarks/loops.py", "--workload", workload, "--data-file", data_file,
           "--rounds", str(rounds), "--out", str(out), *options]
    if ranks > 1:
        cmd = [PY, "scripts/launch_local.py", "--nodes", "1", "--procs-per-node", str(ranks), "--", *cmd]
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True)
    return json.loads(out.read_text())


LIGHTNING, PLAIN = "lightning,resident", "plain,resident"  # the pipeline's default data path
# Parts of the Lightning path that a diagnosis run takes out, one at a time, to price them.
# The SIGTERM broadcast only exists with more than one rank.
ABLATED = {"checkpoint callback": "lightning,resident,no-checkpoint",
           "SIGTERM broadcast": "lightning,resident,no-sigterm-broadcast"}
# Each fast path: the Lightning loop before and after the change, in one process.
FAST_PATHS = [
    ("resident batches instead of a DataLoader", "spiral", "lightning", LIGHTNING),
    ("resident batches instead of a DataLoader", "wide", "lightning", LIGHTNING),
    ("torch.compile (mode default)", "spiral", LIGHTNING, LIGHTNING + ",compile"),
    ("torch.compile (mode default)", "wide", LIGHTNING, LIGHTNING + ",compile"),
    ("bf16-mixed instead of 32-true", "wide", LIGHTNING, LIGHTNING + ",bf16"),
    ("no self.log of the loss every step", "spiral", LIGHTNING + ",log-step", LIGHTNING),
]


def compare(workload: str, ranks: int, variants: list[str], data_file: str, rounds: int, tmp: Path) -> dict:
    """Median throughput and first-epoch time of each variant, all run in the same processes."""
    res = run_loops(workload, ranks, data_file, rounds, tmp, *[x for v in variants for x in ("--variant", v)])
    batch = res["batch_per_rank"]
    return {name: {"throughput": statistics.median(v["throughput"]),
                   # the slowest: compilation happens once per process, in the first round
                   "first_epoch_s": max(v["first_epoch_s"]),
                   "step_ms": 1000 * batch * ranks / statistics.median(v["throughput"])}
            for name, v in res["variants"].items()}


def gap_parts(step_ms: dict[str, float], parts: dict[str, str]) -> dict[str, float]:
    """Lightning's extra time per step over the plain loop, split into what each removed part
    cost (its variant's step time saved) and the rest, Lightning's own loop."""
    gap = step_ms[LIGHTNING] - step_ms[PLAIN]
    priced = {label: step_ms[LIGHTNING] - step_ms[variant] for label, variant in parts.items()}
    return {"gap": gap, **priced, "Lightning loop (rest)": gap - sum(priced.values())}


def workspace(tmp: Path, config_changes: dict | None = None) -> Path:
    """A throwaway copy of the workflow, so results/ here is never touched."""
    ws = tmp / f"ws-{time.monotonic_ns()}"
    for name in ("workflow", "scripts", "profiles", "config"):
        shutil.copytree(ROOT / name, ws / name, ignore=shutil.ignore_patterns("__pycache__"))
    if config_changes:
        config = yaml.safe_load((ws / "config/config.yaml").read_text())
        config.update(config_changes)
        (ws / "config/config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return ws


def results(ws: Path) -> Path:
    """The folder the workspace's config writes to (results/<experiment>, ddpscale.core.layout)."""
    return ws / layout(yaml.safe_load((ws / "config/config.yaml").read_text())).root


def snakemake(ws: Path, *args) -> float:
    start = time.perf_counter()
    done = subprocess.run([*SNAKEMAKE, "--profile", "profiles/local", *args], cwd=ws,
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"snakemake {' '.join(args)} failed in {ws}:\n{done.stderr[-3000:]}")
    return time.perf_counter() - start


def pipeline(tmp: Path) -> dict:
    ws = workspace(tmp)
    # the first parse imports the model and data modules once for the contract check; the next
    # finds their facts cached (the files are unchanged)
    first = snakemake(ws, "--dry-run")
    dry = snakemake(ws, "--dry-run")
    return {"dry_run_first_s": first, "dry_run_s": dry, "pipeline_s": snakemake(ws)}


def resume(tmp: Path, epochs: int = 8, kill_after: int = 3) -> dict:
    """Kill the baseline run mid-epoch after `kill_after` epochs, rerun it, compare."""
    changes = {"topologies": ["1x1"], "max_epochs": epochs, "batch": {"scaling": "strong", "size": 32}}
    full_ws = workspace(tmp, changes)
    full_s = snakemake(full_ws, "baseline")
    record = json.loads((results(full_ws) / "runs/1x1/r0/metrics.json").read_text())
    epoch_s = statistics.median(record["epoch_times_s"][1:])
    startup_s = full_s - sum(record["epoch_times_s"])  # everything that is not an epoch

    ws = workspace(tmp, changes)
    proc = subprocess.Popen([*SNAKEMAKE, "--profile", "profiles/local", "baseline"], cwd=ws,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ckpt = results(ws) / "checkpoints/1x1/r0/last.ckpt"
    deadline = time.monotonic() + 300
    seen, last = 0, None  # each epoch rewrites the checkpoint: count the rewrites
    while time.monotonic() < deadline and seen < kill_after:
        if ckpt.exists() and ckpt.stat().st_mtime_ns != last:
            last = ckpt.stat().st_mtime_ns
            seen += 1
        time.sleep(0.01)
    time.sleep(epoch_s / 2)  # mid-epoch
    # the training process dies (as on a failed node), Snakemake records the failure
    for child in psutil.Process(proc.pid).children(recursive=True):
        if any(arg.endswith("train.py") for arg in child.cmdline()):
            child.send_signal(signal.SIGKILL)
    proc.wait(120)
    rerun_s = snakemake(ws, "baseline")
    done = json.loads((results(ws) / "runs/1x1/r0/metrics.json").read_text())
    resumed = done["resumed_from_epoch"]
    remaining_s = startup_s + (epochs - resumed) * epoch_s
    return {"resume_ratio": rerun_s / remaining_s, "rerun_s": rerun_s, "remaining_s": remaining_s,
            "resumed_from_epoch": resumed, "epochs_left": epochs - resumed, "epoch_s": epoch_s,
            "startup_s": startup_s}


def fmt(value, target=None, higher_is_better=True) -> str:
    text = f"{value:,.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    if target is None:
        return text
    ok = value >= target if higher_is_better else value <= target
    return f"{text}  ({'meets' if ok else 'misses'} {'>=' if higher_is_better else '<='} {target:g})"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3, help="rounds per comparison (each variant once per round; the median is shown)")
    parts = ["loops", "fastpaths", "pipeline", "resume", "throughput", "coverage"]
    p.add_argument("--only", nargs="*", default=parts, choices=parts)
    args = p.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="ddpscale-bench-") as tmp_name:
        tmp = Path(tmp_name)
        data_file = str(tmp / "spiral.npz")
        write_dataset(data_file, str(tmp / "manifest.json"), 10000, 0.2, 1234, [0.7, 0.15, 0.15])
        if "loops" in args.only:
            for workload in ("spiral", "wide"):
                single = None
                for ranks in (1, 2):
                    parts = {k: v for k, v in ABLATED.items() if ranks > 1 or k != "SIGTERM broadcast"}
                    res = compare(workload, ranks, [LIGHTNING, PLAIN, *parts.values()], data_file, args.rounds, tmp)
                    light, plain = res[LIGHTNING]["throughput"], res[PLAIN]["throughput"]
                    rows.append((f"{workload}, {ranks} rank(s), batch 32/rank: Lightning / plain throughput",
                                 fmt(light / plain, TARGETS["ratio"])))
                    rows.append((f"  samples/s Lightning | plain (median of {args.rounds})",
                                 f"{light:,.0f} | {plain:,.0f}"))
                    split = gap_parts({name: r["step_ms"] for name, r in res.items()}, parts)
                    rows.append(("  ms per step Lightning | plain; the gap = " + " + ".join(list(split)[1:]),
                                 f"{res[LIGHTNING]['step_ms']:.2f} | {res[PLAIN]['step_ms']:.2f}; "
                                 f"{split['gap']:.2f} = " + " + ".join(f"{v:.2f}" for v in list(split.values())[1:])))
                    if ranks == 1:
                        single = light
                    else:
                        rows.append(("  weak-scaling efficiency, 2 ranks vs 1 (Lightning)", fmt(light / (2 * single))))
        if {"loops", "fastpaths"} & set(args.only):
            from callbacks import per_step_us  # imports torch: only when a part needs it

            hooks = per_step_us()
            rows.append(("ddpscale's callbacks, us per step through Lightning's hook dispatch",
                         f"EpochTiming {hooks['EpochTiming']:.1f}, EpochCheckpoint {hooks['EpochCheckpoint']:.1f}"))
        if "fastpaths" in args.only:
            rows.append(("fast path: EpochCheckpoint instead of ModelCheckpoint (us per step)",
                         f"{hooks['ModelCheckpoint']:.1f} -> {hooks['EpochCheckpoint']:.1f}"))
            for name, workload, before, after in FAST_PATHS:
                res = compare(workload, 1, [before, after], data_file, args.rounds, tmp)
                rows.append((f"fast path, {workload}, 1 rank: {name}",
                             fmt(res[after]["throughput"] / res[before]["throughput"]) + "x"))
                rows.append((f"  Lightning samples/s before -> after (median of {args.rounds}); slowest first epoch",
                             f"{res[before]['throughput']:,.0f} -> {res[after]['throughput']:,.0f}; "
                             f"{res[before]['first_epoch_s']:.1f} s -> {res[after]['first_epoch_s']:.1f} s"))
        if "pipeline" in args.only:
            res = pipeline(tmp)
            rows.append(("local default pipeline, empty results -> report (s)",
                         fmt(res["pipeline_s"], TARGETS["pipeline_s"], higher_is_better=False)))
            rows.append(("first dry run: imports the model and data modules for the contract check (s)",
                         fmt(res["dry_run_first_s"])))
            rows.append(("dry run, their files unchanged (s)", fmt(res["dry_run_s"], TARGETS["dry_run_s"],
                                                                     higher_is_better=False)))
        if "resume" in args.only:
            # Start-up (about 9 s) is most of the remaining work and varies by seconds between
            # processes here, so one kill-and-rerun is a noisy figure: take the median of rounds.
            runs = sorted((resume(tmp) for _ in range(args.rounds)), key=lambda r: r["resume_ratio"])
            res = runs[len(runs) // 2]
            rows.append((f"resume: rerun / remaining work (median of {args.rounds})",
                         fmt(res["resume_ratio"], TARGETS["resume"], higher_is_better=False)))
            rows.append(("  every round", ", ".join(f"{r['resume_ratio']:.2f}" for r in runs)))
            rows.append((f"  median round: rerun | remaining = start-up + epochs left x epoch (s), "
                         f"resumed at epoch {res['resumed_from_epoch']}",
                         f"{res['rerun_s']:.1f} | {res['remaining_s']:.1f} = {res['startup_s']:.1f} + "
                         f"{res['epochs_left']} x {res['epoch_s']:.2f}"))
        if "throughput" in args.only:
            import throughput_mode

            rows += throughput_mode.rows(tmp, data_file, fmt)
        if "coverage" in args.only:
            import stopping_coverage

            rows += stopping_coverage.rows()
    width = max(len(r[0]) for r in rows)
    print(f"\nddpscale benchmark on {os.cpu_count()} CPU core(s), torch threads 1 per rank")
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
