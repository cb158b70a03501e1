"""When a throughput measurement has seen enough: the stopping rule of throughput mode.

Pure: the caller (a training callback) times windows of steps and hands this module the
seconds of each window, the slowest rank's, since the group steps together; every rank gets
the same numbers and so the same decision, and stops at the same step.

Window times in a row are autocorrelated (clocks and temperature settling, the allocator,
neighbours on the node), may drift or settle slowly, and may repeat a pattern (the loader's
refill every few windows); and a rule that looks after every window stops on the window whose
noise happened to look small. So (docs/numbers.md has the coverage this gives, measured on
synthetic series whose truth is known):

- It looks at the windows only from `min_windows` on, and then each time their number has
  grown by a quarter: a few looks, not one per window.
- A pattern the later half of the windows repeats every k windows (ddpscale.core.stats.period)
  is taken out before the tests below, and the figure is the mean over whole periods: the
  pattern is part of the level, not noise of it nor a trend.
- Warm-up is found in the data, apart from the error the run stops on: the cut is the
  smallest leading share of the windows (in twentieths, at most half, keeping at least
  `min_windows`, or MIN_KEPT in a run that stops anyway) after which the series shows no
  trend. A trend is a least-squares change over the kept windows that is significant
  (|t| > 2, its error from the residuals about the line) or, with one standard error added,
  larger than 1.5 x `precision` (a drift too slow to be significant yet, but large enough to
  bias the figure). No cut without a trend: the level has not settled (or has shifted, as
  when another job lands on the node), and measuring goes on.
- The first third of the windows after the cut are left out too: the tail of a transient
  too small for the trend to show lives there.
- The figure is the rest's samples over their seconds: a ratio of sums, in which a window
  weighs by its samples, so windows of any size (one step, an epoch's short last batch) give
  the throughput the steps had. A mean of window rates would overstate it where windows vary,
  and a mean of each window's seconds per sample would let a window of a few samples weigh as
  much as a full one (2.6x to 6.3x too low with one-step windows and a short last batch). Its
  95% interval is the autocorrelated noise's, of the ratio's linearised terms
  (ddpscale.core.stats.ratio_interval_correlated), plus the change the kept windows' least-
  squares line shows over them: a level still moving too slowly for the trend test to tell from
  noise may be as far again from where it settles (a settling slower than the kept windows'
  span is beyond what they can tell). The warm-up cut, the trend and the pattern read the same
  linearised terms: for windows of equal samples, each window's seconds per sample.
- Windows that never settled give the later half's figure, its interval widened by the later
  half's own change likewise, and say so (`settled` False).
- Fewer than MIN_STEADY steady windows give the figure without an interval: too short to
  tell (`too_short`, `half_width` NaN), never a stop on precision.
- The run stops at a look where the windows settled and the interval is within `precision`
  of the mean, or at a cap (steps or seconds), recording the interval it reached and why it
  stopped; the interval is given in samples/s with the same relative half-width.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

from ddpscale.core.stats import (
    period,
    phase_means,
    ratio_interval_correlated,
    ratio_terms,
    trend,
)

PRECISION = "precision reached"
STEP_CAP = "step cap reached"
TIME_CAP = "time cap reached"
MEASURING = "measuring"
ENDED = "training ended"
# the stop reasons metrics.json records (ddpscale.job.measure.windows), read by the report
EPOCHS_ENDED = "configured epochs ended"  # throughput mode, training ended first
FULL_TRAINING = "full training"  # full mode: the windows never stop the run
# what the report prints for a Decision that is not settled, and in place of the interval of
# one that is too short
NOT_STEADY = "not steady"
TOO_SHORT = "too short to tell"

LOOK_GROWTH = 1.25  # the next look at the windows comes once there are a quarter more
TREND_T = 2.0  # a change over the kept windows this many standard errors from 0 is a trend
DRIFT_OF_PRECISION = 1.5  # a change (plus one standard error) beyond this x precision is one too
CUTS = 20  # the warm-up cut is tried in twentieths of the windows, up to half of them
# Fewer steady windows give no interval, too short to tell: with 6 to 8, the intervals of
# AR(1) windows of phi 0.85-0.93 cover 86% and those of independent ones are +-5% wide; from
# 9 to 11 on, 93% and +-4% (docs/numbers.md has the short runs' coverage).
MIN_STEADY = 10
MIN_KEPT = 15  # a run that stops anyway seeks its warm-up down to this many kept windows: MIN_STEADY after the third


@dataclass(frozen=True)
class Rule:
    """Throughput mode's stopping rule: config `throughput:` whole, each setting by its config
    name, from the config (ddpscale.plan.runplan) through the run's spec and the job to the
    record (its `throughput` entry) and the report. The defaults are the schema's
    (workflow/schemas/config.schema.yaml), which fills the config; this type has none."""

    precision: float  # half-width of the 95% interval over the mean at which a run stops
    window_steps: int  # training batches per timed window
    min_windows: int  # windows before the first look
    max_steps: int | None  # the most training batches measured; None: no step cap
    max_minutes: float | None  # the most minutes measured; None: no time cap

    def __post_init__(self):
        problem = self.problem()
        if problem:
            raise ValueError(problem)

    def problem(self) -> str | None:
        """What makes these settings a rule that cannot decide, in one line naming the config
        keys, or None."""
        number = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        whole = lambda v: isinstance(v, int) and not isinstance(v, bool)
        if not (number(self.precision) and 0 < self.precision < 1):
            return f"throughput.precision must be a number between 0 and 1 (exclusive), got {self.precision!r}"
        if not (whole(self.window_steps) and self.window_steps >= 1):
            return f"throughput.window_steps must be an integer >= 1, got {self.window_steps!r}"
        if not (whole(self.min_windows) and self.min_windows >= 2):
            return f"throughput.min_windows must be an integer >= 2, got {self.min_windows!r}"
        if self.max_steps is not None and not (whole(self.max_steps) and self.max_steps >= 1):
            return f"throughput.max_steps must be an integer >= 1 or null, got {self.max_steps!r}"
        if self.max_minutes is not None and not (number(self.max_minutes) and self.max_minutes > 0):
            return f"throughput.max_minutes must be a number > 0 or null, got {self.max_minutes!r}"
        return None

    @classmethod
    def of(cls, settings: dict) -> Rule:
        """The rule from its settings by their config names (config `throughput:`, a record's
        `throughput` entry, train.py's --throughput): every one, and no other."""
        names = [f.name for f in fields(cls)]
        if not isinstance(settings, dict) or set(settings) != set(names):
            got = sorted(settings) if isinstance(settings, dict) else type(settings).__name__
            raise ValueError(f"throughput settings must be exactly {', '.join(names)}; got {got}")
        return cls(**settings)

    def settings(self) -> dict:
        """{config name: value}: what the config, the spec's flag and the record hold."""
        return asdict(self)

    def time_cap_s(self) -> float | None:
        return None if self.max_minutes is None else self.max_minutes * 60

    def looks_at(self, n: int) -> bool:
        """Whether the rule looks at the windows once there are n: min_windows, then each time
        a quarter more (30, 38, 48, 60, 75, ...)."""
        look = self.min_windows
        while look < n:
            look = max(look + 1, math.ceil(look * LOOK_GROWTH))
        return look == n


@dataclass(frozen=True)
class Decision:
    stop: bool
    reason: str
    warmup_windows: int  # left out as warm-up (the cut, the third after it, what falls short of whole periods)
    steady_windows: int  # the windows the figure is the mean of
    throughput: float  # mean samples/s over the steady windows (NaN before any)
    half_width: float  # of its 95% interval, samples/s (NaN when too_short)
    settled: bool = False  # a cut without a trend was found; False: the figure is the later half's
    too_short: bool = False  # fewer than MIN_STEADY steady windows: no interval (half_width NaN)

    @property
    def relative(self) -> float:
        return self.half_width / self.throughput if self.throughput > 0 else math.nan


def _samples(samples_per_window: int | list[int], n: int) -> list[int]:
    return list(samples_per_window) if isinstance(samples_per_window, (list, tuple)) else [samples_per_window] * n


def transient_end(costs: list[float], precision: float, min_kept: int) -> int | None:
    """The first cut (tried in twentieths of the windows, up to half of them, keeping at least
    min_kept) after which the windows show no trend, or None where every cut leaves one."""
    n = len(costs)
    for cut in range(0, n // 2 + 1, max(1, n // CUTS)):
        kept = costs[cut:]
        if len(kept) < min_kept:
            break
        change, error = trend(kept)
        mean = sum(kept) / len(kept)
        if abs(change) <= TREND_T * error and abs(change) + error <= DRIFT_OF_PRECISION * precision * mean:
            return cut
    return None


def _without_pattern(costs: list[float], k: int) -> list[float]:
    """The costs less a pattern of period k, its phases' offsets measured over the later half's
    whole periods, so that a stall every k windows reads as neither noise nor trend."""
    if k == 1:
        return costs
    n = len(costs)
    first = n - (n - n // 2) // k * k
    means = phase_means(costs[first:], k)  # means[j]: the phase of window first + j
    grand = sum(means) / k
    return [c - means[(t - first) % k] + grand for t, c in enumerate(costs)]


def _without_size(costs: list[float], counts: list[int]) -> list[float]:
    """The costs less their part linear in the windows' samples (least squares), so that a
    window of few samples, whose steps' fixed cost falls on few samples, reads as neither noise
    nor trend; unchanged where every window has as many samples."""
    n = len(costs)
    mean_c, mean_cost = sum(counts) / n, sum(costs) / n
    sxx = sum((c - mean_c) ** 2 for c in counts)
    if sxx <= 0:
        return costs
    slope = sum((c - mean_c) * (v - mean_cost) for c, v in zip(counts, costs)) / sxx
    return [v - slope * (c - mean_c) for c, v in zip(counts, costs)]


def decide(window_seconds: list[float], samples_per_window: int | list[int], rule: Rule,
           elapsed_s: float | None = None, ended: bool = False) -> Decision:
    """Whether to stop after these windows (in order), and the figure so far. samples_per_window:
    one count for every window, or each window's own (an epoch's last batch may be short).
    ended: training ended on its own (the configured epochs), so these windows are all there is.
    Between looks only the caps are checked, and the figure is not computed (NaN)."""
    seconds = list(window_seconds)
    counts = _samples(samples_per_window, len(seconds))
    n = len(seconds)
    steps = n * rule.window_steps
    if rule.max_steps is not None and steps >= rule.max_steps:
        capped = STEP_CAP
    elif rule.max_minutes is not None and elapsed_s is not None and elapsed_s >= rule.time_cap_s():
        capped = TIME_CAP
    else:
        capped = ENDED if ended else None
    looking = n >= rule.min_windows and rule.looks_at(n)
    if (capped is None and not looking) or sum(counts) <= 0:
        return Decision(capped is not None, capped or MEASURING, 0, 0, math.nan, math.nan)
    # each window's seconds per sample as the ratio of sums weighs it (stats.ratio_terms): a
    # window of an epoch's short last batch counts by its samples, not as a whole window, and
    # for windows of equal samples these are their seconds per sample
    costs = ratio_terms(seconds, counts)
    k = period(costs[n // 2:])
    plain = _without_size(_without_pattern(costs, k), counts)
    # a run that stops anyway uses every steady window it has, however few
    cut = transient_end(plain, rule.precision, min(rule.min_windows, MIN_KEPT) if capped else rule.min_windows)
    settled = cut is not None
    if settled:
        steady_from = cut + (n - cut) // 3  # the tail of a transient too small for the trend to show
    else:
        cut = steady_from = n // 2  # the later half's figure, its interval widened by its drift
    steady_from += (n - steady_from) % k  # whole periods
    # the steady windows' seconds per sample: their seconds over their samples
    cost, half = ratio_interval_correlated(seconds[steady_from:], counts[steady_from:], k)
    too_short = n - steady_from < MIN_STEADY or math.isnan(half)
    if too_short:
        half = math.nan
    else:
        # a level still moving too slowly for the trend test to tell it from noise may be as
        # far again from where it settles as the kept windows' line says it moved over them
        half += abs(trend(plain[cut:])[0])
    # at a cap the run stops anyway, so its interval may be called reached there too
    if settled and cost > 0 and half <= rule.precision * cost:
        reason = PRECISION
    else:
        reason = capped or MEASURING
    throughput = 1.0 / cost if cost > 0 else math.nan
    # the interval's relative half-width carries over to the rate (to first order)
    half_rate = throughput * half / cost if cost > 0 else math.nan
    return Decision(reason != MEASURING, reason, steady_from, n - steady_from, throughput, half_rate, settled,
                    too_short)


def warmup_excess_s(window_seconds: list[float], samples_per_window: int | list[int], decision: Decision) -> float:
    """Seconds the warm-up windows took beyond what the steady rate gives their samples: the
    one-off cost of a cold process that a projection of the full training adds once."""
    if not decision.throughput > 0 or decision.warmup_windows == 0:
        return 0.0
    counts = _samples(samples_per_window, len(window_seconds))
    cold = range(decision.warmup_windows)
    spent = sum(window_seconds[i] for i in cold)
    return max(0.0, spent - sum(counts[i] for i in cold) / decision.throughput)
