"""How often throughput mode's interval covers the truth: synthetic window series whose steady
level is known, fed to the stopping rule one window at a time as a run feeds it.

    .venv/bin/python benchmarks/stopping_coverage.py [--runs 1000]     (also part of make bench)

Each family is a kind of series real runs produce (window times of 20 steps, relative noise
of 2% a window, the config's defaults: precision 2%, windows from 30 on, a cap of 100
windows). For every run: the window the rule stopped at, why, and whether the 95% interval it
reported holds the true steady throughput. The test (tests/unit/test_steadystate.py) asserts the
families of the issue at >= 90% coverage; docs/numbers.md shows the table.
"""
from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from ddpscale.core import steadystate  # noqa: E402

SAMPLES = 640  # a window of 20 steps of 32 samples
NOISE = 0.02
CAP = 100  # windows: config throughput.max_steps 2000 / window_steps 20


def _independent(rng: random.Random, n: int) -> list[float]:
    return [1 + rng.gauss(0, NOISE) for _ in range(n)]


def _ar1(phi: float) -> Callable[[random.Random, int], list[float]]:
    def series(rng, n):
        e, out = rng.gauss(0, NOISE), []
        for _ in range(n):
            e = phi * e + rng.gauss(0, NOISE * math.sqrt(1 - phi * phi))
            out.append(1 + e)
        return out
    return series


def _settling(rng, n):
    return [1 + 0.04 * math.exp(-t / 10) + rng.gauss(0, NOISE) for t in range(n)]


def _shift(rng, n):
    return [(1.0 if t < 12 else 1.1) + rng.gauss(0, NOISE) for t in range(n)]


def _drifting(rng, n):
    return [1 + 0.06 * t / CAP + rng.gauss(0, NOISE) for t in range(n)]


@dataclass(frozen=True)
class Family:
    name: str
    series: Callable[[random.Random, int], list[float]]
    truth: float | None  # the steady seconds per window; None: it never settles
    asserted: bool  # the families, held to >= 90% coverage


FAMILIES = (
    Family("independent noise, 2% a window", _independent, 1.0, True),
    Family("autocorrelated, AR(1) phi 0.7", _ar1(0.7), 1.0, True),
    Family("slow settling, 4% decaying over ~10 windows", _settling, 1.0, True),
    Family("level shift, +10% at window 12", _shift, 1.1, True),
    Family("strongly autocorrelated, AR(1) phi 0.9 (stress)", _ar1(0.9), 1.0, False),
    Family("drifting +6% over the cap, never settles", _drifting, None, False),
)


def run_once(seconds: list[float], rule: steadystate.Rule) -> tuple[steadystate.Decision, int]:
    """Windows fed one by one until the rule stops: (its decision, windows used)."""
    for n in range(1, len(seconds) + 1):
        decision = steadystate.decide(seconds[:n], SAMPLES, rule)
        if decision.stop:
            return decision, n
    return steadystate.decide(seconds, SAMPLES, rule, ended=True), len(seconds)


@dataclass(frozen=True)
class Coverage:
    family: Family
    runs: int
    covered: float | None  # share whose interval holds the truth (None: no truth)
    on_precision: float  # share stopped with "precision reached"
    median_windows: float


def measure(family: Family, runs: int, seed: int = 0, rule: steadystate.Rule | None = None) -> Coverage:
    rule = rule or steadystate.Rule(window_steps=20, precision=0.02, max_steps=CAP * 20)
    rng = random.Random(f"{seed}:{family.name}")
    covered = reached = 0
    used = []
    for _ in range(runs):
        decision, n = run_once([s * 1.0 for s in family.series(rng, CAP)], rule)
        used.append(n)
        reached += decision.reason == steadystate.PRECISION
        if family.truth is not None:
            covered += abs(decision.throughput - SAMPLES / family.truth) <= decision.half_width
    return Coverage(family, runs, covered / runs if family.truth is not None else None, reached / runs,
                    statistics.median(used))


def table(runs: int, seed: int = 0) -> list[Coverage]:
    return [measure(f, runs, seed) for f in FAMILIES]


def rows(runs: int = 1000) -> list[tuple[str, str]]:
    """make bench's lines: one per family."""
    out = []
    for c in table(runs):
        covered = "n/a (no steady level)" if c.covered is None else f"{c.covered:.1%}"
        out.append((f"stopping rule coverage ({c.runs} runs): {c.family.name}",
                    f"covers {covered}, precision reached {c.on_precision:.0%}, "
                    f"median windows {c.median_windows:.0f}"))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=1000)
    args = p.parse_args(argv)
    print("| series | covered (95% nominal) | stopped on precision | median windows |")
    print("|---|---:|---:|---:|")
    for c in table(args.runs):
        covered = "n/a" if c.covered is None else f"{c.covered:.1%}"
        print(f"| {c.family.name} | {covered} | {c.on_precision:.0%} | {c.median_windows:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
