"""When a throughput measurement has seen enough: the stopping rule of throughput mode.

Pure: the caller (a training callback) times windows of steps and hands this module the
seconds of each window, the slowest rank's, since the group steps together; every rank gets
the same numbers and so the same decision, and stops at the same step.

- Warm-up (compilation, caches, the allocator) is found in the data, not assumed to be an
  epoch: the windows before the truncation point that MSER chooses (White 1997, the Marginal
  Standard Error Rule, as simulation output analysis truncates an initial transient) are left
  out. A point in the later half of the windows means the level has not settled yet (or has
  shifted, as when another job lands on the node): measuring goes on.
- The run stops once the 95% interval of the mean, over the steady windows, is within
  `precision` of the mean (Student's t; windows of many steps are close to normal), or at a
  cap (steps or seconds), recording the interval it reached and why it stopped. The mean is
  of each window's seconds per sample, so the figure is the steady windows' samples over
  their seconds (a mean of window rates overstates a throughput whose windows vary); its
  interval is given in samples/s with the same relative half-width.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ddpscale.stats import mean_interval

PRECISION = "precision reached"
STEP_CAP = "step cap reached"
TIME_CAP = "time cap reached"
MEASURING = "measuring"
ENDED = "training ended"
# the stop reasons metrics.json records (ddpscale.measurement.windows), read by the report
EPOCHS_ENDED = "configured epochs ended"  # throughput mode, training ended first
FULL_TRAINING = "full training"  # full mode: the windows never stop the run


@dataclass(frozen=True)
class Rule:
    window_steps: int = 20
    precision: float = 0.02  # half-width of the 95% interval over the mean
    min_windows: int = 5  # steady windows before an interval is believed
    max_steps: int | None = None
    max_seconds: float | None = None

    def __post_init__(self):
        if self.window_steps < 1 or self.min_windows < 2 or not 0 < self.precision < 1:
            raise ValueError("the stopping rule needs window_steps >= 1, min_windows >= 2 and 0 < precision < 1")


@dataclass(frozen=True)
class Decision:
    stop: bool
    reason: str
    warmup_windows: int  # left out as warm-up
    steady_windows: int  # the windows the figure is the mean of
    throughput: float  # mean samples/s over the steady windows (NaN before any)
    half_width: float  # of its 95% interval, samples/s (NaN below 2 steady windows)

    @property
    def relative(self) -> float:
        return self.half_width / self.throughput if self.throughput > 0 else math.nan


def mser_truncation(values: list[float], keep: int) -> int:
    """The number of leading values MSER leaves out, keeping at least `keep`: the d minimising
    sum((x_i - mean_d)^2, i > d) / (n - d)^2 (ties: the smallest d). Linear in n, from suffix
    sums: a full run times thousands of windows, and a quadratic rule per window made a
    36-epoch test run's windows cost more than its training."""
    n = len(values)
    if n == 0:
        return 0
    centre = sum(values) / n  # centred, so the sums of squares lose no precision
    xs = [x - centre for x in values]
    # rounding makes a flat series' scores differ in the last bits: closer than this is a tie
    tie = 1e-9 * centre ** 2 / n
    s1 = s2 = 0.0
    suffix = [(0.0, 0.0)] * (n + 1)
    for i in range(n - 1, -1, -1):
        s1 += xs[i]
        s2 += xs[i] * xs[i]
        suffix[i] = (s1, s2)
    best, best_d = None, 0
    for d in range(0, max(0, n - keep) + 1):
        m = n - d
        t1, t2 = suffix[d]
        score = max(0.0, t2 - t1 * t1 / m) / (m * m)
        if best is None or score < best - tie:
            best, best_d = score, d
    return best_d


def _samples(samples_per_window: int | list[int], n: int) -> list[int]:
    return list(samples_per_window) if isinstance(samples_per_window, (list, tuple)) else [samples_per_window] * n


def decide(window_seconds: list[float], samples_per_window: int | list[int], rule: Rule,
           elapsed_s: float | None = None, ended: bool = False) -> Decision:
    """Whether to stop after these windows (in order), and the figure so far. samples_per_window:
    one count for every window, or each window's own (an epoch's last batch may be short).
    ended: training ended on its own (the configured epochs), so these windows are all there is."""
    counts = _samples(samples_per_window, len(window_seconds))
    # seconds per sample, whose mean is total time over total samples: the throughput a run
    # of these windows has (a mean of rates would overstate it when windows vary)
    costs = [s / c for c, s in zip(counts, window_seconds) if c > 0 and s > 0]
    n = len(costs)
    d = mser_truncation(costs, rule.min_windows) if n >= rule.min_windows else n
    steady = costs[d:] if d <= n // 2 else []  # a truncation in the later half: not settled
    cost, half = mean_interval(steady)
    reached = (len(steady) >= rule.min_windows and cost > 0 and half <= rule.precision * cost)
    steps = n * rule.window_steps
    if reached:
        reason = PRECISION
    elif rule.max_steps is not None and steps >= rule.max_steps:
        reason = STEP_CAP
    elif rule.max_seconds is not None and elapsed_s is not None and elapsed_s >= rule.max_seconds:
        reason = TIME_CAP
    else:
        reason = ENDED if ended else MEASURING
    if reason in (STEP_CAP, TIME_CAP, ENDED) and not steady and n:
        # stopped before the level settled: the figure is the later half's, and says so by its interval
        steady = costs[n // 2:]
        cost, half = mean_interval(steady)
    throughput = 1.0 / cost if cost > 0 else math.nan
    # the interval's relative half-width carries over to the rate (to first order)
    half_rate = throughput * half / cost if cost > 0 else math.nan
    return Decision(reason != MEASURING, reason, n - len(steady) if steady else d, len(steady), throughput, half_rate)


def warmup_excess_s(window_seconds: list[float], samples_per_window: int | list[int], decision: Decision) -> float:
    """Seconds the warm-up windows took beyond what the steady rate gives their samples: the
    one-off cost of a cold process that a projection of the full training adds once."""
    if not decision.throughput > 0 or decision.warmup_windows == 0:
        return 0.0
    counts = _samples(samples_per_window, len(window_seconds))
    cold = range(decision.warmup_windows)
    spent = sum(window_seconds[i] for i in cold)
    return max(0.0, spent - sum(counts[i] for i in cold) / decision.throughput)
