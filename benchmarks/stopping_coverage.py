"""How often throughput mode's interval covers the truth: synthetic window series whose truth is
known, fed to the stopping rule as a run feeds it.

    .venv/bin/python benchmarks/stopping_coverage.py [--runs 1000]     (also part of make bench)

Each family is a kind of series real runs produce, at the config's defaults (precision 2%,
windows from 30 on, a cap of 100 windows: max_steps 2000 / window_steps 20, as the GPU preset
times them; config.yaml's windows of 10 have twice as many), with window
noise of about 2%. Every series draws its family's parameters from ranges, so no family is
one parameter point. For every series: the window the rule stopped at, why, whether it
called the windows settled or too short to tell, and whether the 95% interval it reported
holds the truth. tests/unit/core/test_steadystate.py holds the families marked held to 90%
coverage (those whose truth moves: to 10% wrong and called settled); the others show where
the windows cannot tell. A second table: full-mode runs that end after a few windows.
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
CAP = 100  # windows: throughput.max_steps 2000 / window_steps 20 (the fewer, the harder to cover)
RULE = steadystate.Rule(window_steps=20, precision=0.02, min_windows=30, max_steps=CAP * 20, max_minutes=None)

# A family draws one series: (every window's seconds, the truth: the seconds a window takes
# at the level the interval should hold, given the number of windows the run used).
Draw = tuple[list[float], Callable[[int], float]]


def _noise(rng: random.Random) -> float:
    return rng.uniform(0.015, 0.025)  # a window's relative noise: about 2%


def _level(value: float) -> Callable[[int], float]:
    return lambda used: value


def independent(rng: random.Random, n: int) -> Draw:
    noise = _noise(rng)
    return [1 + rng.gauss(0, noise) for _ in range(n)], _level(1.0)


def ar1(low: float, high: float) -> Callable[[random.Random, int], Draw]:
    """AR(1) noise of marginal standard deviation about 2%, phi drawn in [low, high]."""
    def family(rng, n):
        phi, noise = rng.uniform(low, high), _noise(rng)
        e, out = rng.gauss(0, noise), []  # started in its stationary distribution
        for _ in range(n):
            out.append(1 + e)
            e = phi * e + rng.gauss(0, noise * math.sqrt(1 - phi * phi))
        return out, _level(1.0)
    return family


def bursts(quiet_low: float, quiet_high: float) -> Callable[[random.Random, int], Draw]:
    """A neighbour's bursts on a shared host: spells of 10-30% slower windows, each lasting
    3-8 windows on average, quiet_low-quiet_high quiet windows apart on average (a two-state
    Markov chain started in its stationary distribution). Truth: its long-run mean, exactly."""
    def family(rng, n):
        slow, burst, quiet = rng.uniform(0.1, 0.3), rng.uniform(3, 8), rng.uniform(quiet_low, quiet_high)
        noise = _noise(rng)
        share = burst / (burst + quiet)  # the stationary share of windows in a burst
        busy, out = rng.random() < share, []
        for _ in range(n):
            out.append(1 + slow * busy + rng.gauss(0, noise))
            busy = rng.random() >= 1 / burst if busy else rng.random() < 1 / quiet
        return out, _level(1 + slow * share)
    return family


def settling(low: float, high: float) -> Callable[[random.Random, int], Draw]:
    """A slow settling: 3-6% slower at first, decaying with a time constant of low-high
    windows. Truth: the settled level."""
    def family(rng, n):
        excess, tau, noise = rng.uniform(0.03, 0.06), rng.uniform(low, high), _noise(rng)
        return [1 + excess * math.exp(-t / tau) + rng.gauss(0, noise) for t in range(n)], _level(1.0)
    return family


def heavy_tailed(rng: random.Random, n: int) -> Draw:
    """Student's t noise with 3 degrees of freedom, and one-sided spikes: a window in 20 to 50
    is slower by an exponential amount of mean 5-20%. Truth: the mean."""
    noise, rate, spike = _noise(rng), rng.uniform(0.02, 0.05), rng.uniform(0.05, 0.2)
    out = []
    for _ in range(n):
        t3 = rng.gauss(0, 1) / math.sqrt(sum(rng.gauss(0, 1) ** 2 for _ in range(3)) / 3)
        extra = rng.expovariate(1 / spike) if rng.random() < rate else 0.0
        out.append(max(0.5, 1 + noise / math.sqrt(3) * t3 + extra))  # t3's sd is sqrt(3)
    return out, _level(1 + rate * spike)


def periodic(rng: random.Random, n: int) -> Draw:
    """A stall every k-th window (a loader refill), k 2 to 8, 30-100% slower, at a random
    phase. Truth: the mean over a period."""
    k, stall, phase, noise = rng.randint(2, 8), rng.uniform(0.3, 1.0), rng.randrange(8), _noise(rng)
    return [1 + stall * ((t + phase) % k == 0) + rng.gauss(0, noise) for t in range(n)], _level(1 + stall / k)


def drifting(rng: random.Random, n: int) -> Draw:
    """A steady drift of 3-10% over the cap's 100 windows, up or down, that never settles.
    Truth: the level at the last window used."""
    total, noise = rng.choice((-1, 1)) * rng.uniform(0.03, 0.10), _noise(rng)
    level = [1 + total * t / CAP for t in range(n)]
    return [v + rng.gauss(0, noise) for v in level], lambda used: level[used - 1]


def shifted(rng: random.Random, n: int) -> Draw:
    """A level shift of 5-15%, up or down, at a random window from the 5th to the 95th
    (another job lands on the node, or leaves). Truth: the level at the last window used."""
    at, size, noise = rng.randint(5, 95), rng.choice((-1, 1)) * rng.uniform(0.05, 0.15), _noise(rng)
    level = [1 + size * (t >= at) for t in range(n)]
    return [v + rng.gauss(0, noise) for v in level], lambda used: level[used - 1]


@dataclass(frozen=True)
class Family:
    name: str
    draw: Callable[[random.Random, int], Draw]
    moves: bool = False  # its truth moves: a run that says its windows never settled is right too
    held: bool = True  # the tests hold it to 90%; False: beyond what the windows can tell, shown


FAMILIES = (
    Family("independent noise, 1.5-2.5% a window", independent),
    Family("AR(1), phi 0.6-0.8", ar1(0.6, 0.8)),
    Family("AR(1), phi 0.86-0.94", ar1(0.86, 0.94)),
    Family("bursts 10-30% slower, 3-8 windows long, 5-12 apart", bursts(5, 12)),
    Family("settling 3-6% over 10-40 windows", settling(10, 40)),
    Family("heavy tails: t(3) noise, spikes in 2-5% of windows", heavy_tailed),
    Family("a stall every 2-8 windows, 30-100% slower", periodic),
    Family("drifting 3-10% over 100 windows (truth moves)", drifting, moves=True),
    Family("level shift 5-15% at window 5-95 (truth moves)", shifted, moves=True),
    Family("beyond: bursts as above, 12-25 apart", bursts(12, 25), held=False),
    Family("beyond: settling 3-6% over 40-80 windows", settling(40, 80), held=False),
)


def run_once(seconds: list[float], rule: steadystate.Rule = RULE) -> tuple[steadystate.Decision, int]:
    """The rule fed these windows as a run in throughput mode feeds it, until it stops: (its
    decision, windows used). Only the windows at which it looks, and the cap's, are fed: in
    between, decide checks the caps alone (tests/unit/core/test_steadystate.py shows the two agree).
    A series that ends first is decided as training that ended."""
    cap = len(seconds) if rule.max_steps is None else min(len(seconds), rule.max_steps // rule.window_steps)
    for n in range(rule.min_windows, cap + 1):
        if rule.looks_at(n) or n == cap:
            decision = steadystate.decide(seconds[:n], SAMPLES, rule)
            if decision.stop:
                return decision, n
    return steadystate.decide(seconds, SAMPLES, rule, ended=True), len(seconds)


def covers(decision: steadystate.Decision, truth_s: float) -> bool:
    return abs(decision.throughput - SAMPLES / truth_s) <= decision.half_width


@dataclass(frozen=True)
class Coverage:
    family: Family
    runs: int
    covered: float  # share whose interval holds the truth
    not_steady: float  # share that said its windows never settled
    too_short: float  # share that said it had too few steady windows for an interval
    neither: float  # share that missed the truth without saying either
    on_precision: float  # share stopped with "precision reached"
    at_cap: float  # share stopped at the cap
    median_windows: float
    median_width: float  # the median relative half-width of the intervals reported (NaN: none)
    widest: float  # the widest


def measure(family: Family, runs: int, seed: int = 0, rule: steadystate.Rule = RULE, length: int = CAP,
            full: bool = False) -> Coverage:
    """runs series of the family, length windows each, fed to the rule; full: as in full mode,
    decided once when the series ends, never stopped early."""
    rng = random.Random(f"{seed}:{family.name}:{length}")
    covered = unsettled = short = neither = reached = capped = 0
    used, widths = [], []
    for _ in range(runs):
        seconds, truth = family.draw(rng, length)
        if full:
            decision, n = steadystate.decide(seconds, SAMPLES, rule, ended=True), length
        else:
            decision, n = run_once(seconds, rule)
        used.append(n)
        hit = covers(decision, truth(n))
        covered += hit
        unsettled += not decision.settled
        short += decision.too_short
        neither += not (hit or decision.too_short or (family.moves and not decision.settled))
        reached += decision.reason == steadystate.PRECISION
        capped += decision.reason == steadystate.STEP_CAP
        if not decision.too_short:
            widths.append(decision.relative)
    return Coverage(family, runs, covered / runs, unsettled / runs, short / runs, neither / runs, reached / runs,
                    capped / runs, statistics.median(used), statistics.median(widths) if widths else math.nan,
                    max(widths, default=math.nan))


def table(runs: int, seed: int = 0) -> list[Coverage]:
    return [measure(f, runs, seed) for f in FAMILIES]


SHORT_RUNS = (12, 20, 40)  # windows in a full-mode run that ends early


def short_table(runs: int, seed: int = 0) -> list[tuple[int, Coverage]]:
    """Full-mode runs of a few windows, independent and AR(1) phi 0.6-0.8."""
    return [(length, measure(f, runs, seed, length=length, full=True)) for f in FAMILIES[:2] for length in SHORT_RUNS]


def rows(runs: int = 1000) -> list[tuple[str, str]]:
    """make bench's lines: one per family."""
    return [(f"stopping rule coverage ({c.runs} runs): {c.family.name}",
             f"covers {c.covered:.1%}, not steady {c.not_steady:.0%}, neither {c.neither:.1%}, "
             f"precision reached {c.on_precision:.0%}, at the cap {c.at_cap:.0%}, "
             f"median windows {c.median_windows:.0f}") for c in table(runs)]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=1000)
    args = p.parse_args(argv)
    print("| series | covered (95% nominal) | said not steady | neither | stopped on precision | at the cap "
          "| median windows |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for c in table(args.runs):
        print(f"| {c.family.name} | {c.covered:.1%} | {c.not_steady:.0%} | {c.neither:.1%} | {c.on_precision:.0%} "
              f"| {c.at_cap:.0%} | {c.median_windows:.0f} |")
    print()
    print("| full-mode run that ends after | covered | said too short | neither | interval: median, widest |")
    print("|---|---:|---:|---:|---:|")
    for length, c in short_table(args.runs):
        width = "n/a" if c.widest != c.widest else f"±{c.median_width:.1%}, ±{c.widest:.0%}"
        print(f"| {length} windows, {c.family.name} | {c.covered:.1%} | {c.too_short:.0%} | {c.neither:.1%} "
              f"| {width} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
