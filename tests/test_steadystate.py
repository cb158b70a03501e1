"""Throughput mode's stopping rule (ddpscale.measurement.steadystate) on synthetic window
times: a warm-up that settles, noise that never does, a shift mid-run. Fed one window at a
time, as the training callback feeds it."""
import random

import pytest

from ddpscale.measurement import steadystate
from ddpscale.measurement.steadystate import Rule, decide
from ddpscale.stats import mean_interval, t975

SAMPLES = 640  # samples per window: 20 steps of 32


def run(times, rule, elapsed_per_window=None):
    """Windows fed one by one until the rule stops: (decision, windows used)."""
    for n in range(1, len(times) + 1):
        elapsed = None if elapsed_per_window is None else n * elapsed_per_window
        decision = decide(times[:n], SAMPLES, rule, elapsed_s=elapsed)
        if decision.stop:
            return decision, n
    return decision, len(times)


def noisy(level_s, noise, count, rng):
    return [level_s * (1 + rng.gauss(0, noise)) for _ in range(count)]


def test_a_warm_up_that_settles_is_left_out_and_the_level_is_measured_to_the_precision():
    rng = random.Random(1)
    warm = [3.0, 2.0, 1.5, 1.2]  # compilation, caches, the allocator
    times = warm + noisy(1.0, 0.01, 200, rng)
    decision, used = run(times, Rule(precision=0.02))
    assert decision.reason == steadystate.PRECISION
    assert decision.warmup_windows >= len(warm), "the slow first windows were averaged in"
    assert decision.throughput == pytest.approx(SAMPLES / 1.0, rel=0.01)
    assert decision.relative <= 0.02 and used < 20  # stopped soon after it settled


def test_noise_that_never_settles_stops_at_the_cap_and_says_what_it_reached():
    rng = random.Random(2)
    times = [1.0 * rng.lognormvariate(0, 0.6) for _ in range(400)]
    rule = Rule(precision=0.02, max_steps=30 * 20)
    decision, used = run(times, rule)
    assert decision.stop and decision.reason == steadystate.STEP_CAP and used == 30
    assert decision.relative > 0.02, "the interval it reached is recorded, wide as it is"
    assert decision.steady_windows >= 2


def test_the_time_cap_stops_a_run_whose_interval_is_still_wide():
    rng = random.Random(3)
    times = noisy(1.0, 0.3, 100, rng)
    decision, used = run(times, Rule(precision=0.01, max_seconds=12.0), elapsed_per_window=1.0)
    assert decision.reason == steadystate.TIME_CAP and used == 12


def test_a_shift_mid_run_is_measured_after_the_shift_not_blended():
    # another job lands on the node after 10 windows: the step gets 1.4x slower
    rng = random.Random(4)
    before, after = noisy(1.0, 0.08, 10, rng), noisy(1.4, 0.01, 100, rng)
    decision, used = run(before + after, Rule(precision=0.02))
    assert decision.reason == steadystate.PRECISION and used > 10
    assert decision.warmup_windows >= 10
    assert decision.throughput == pytest.approx(SAMPLES / 1.4, rel=0.02)


def test_every_rank_fed_the_same_windows_decides_the_same():
    rng = random.Random(5)
    times = noisy(1.0, 0.05, 60, rng)
    rule = Rule(precision=0.02)
    # repr: a Decision before any steady window holds NaN, which equals nothing
    assert [repr(decide(times[:n], SAMPLES, rule)) for n in range(1, 61)] == \
        [repr(decide(list(times[:n]), SAMPLES, rule)) for n in range(1, 61)]


def test_too_few_windows_never_stop_on_precision():
    decision = decide([1.0, 1.0, 1.0], SAMPLES, Rule(precision=0.02, min_windows=5))
    assert not decision.stop and decision.reason == steadystate.MEASURING


def test_mser_leaves_out_the_transient_and_nothing_from_a_flat_series():
    assert steadystate.mser_truncation([5.0, 3.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0], keep=2) == 2
    assert steadystate.mser_truncation([1.0, 1.1, 0.9, 1.0, 1.1, 0.9], keep=2) == 0


def test_mean_interval_is_students_t():
    mean, half = mean_interval([1.0, 2.0, 3.0])
    assert mean == 2.0 and half == pytest.approx(4.303 * 1.0 / 3 ** 0.5)
    assert mean_interval([5.0])[1] != mean_interval([5.0])[1]  # NaN: one value has no interval


@pytest.mark.parametrize("kwargs", [{"window_steps": 0}, {"min_windows": 1}, {"precision": 0.0}])
def test_a_rule_that_cannot_decide_is_refused(kwargs):
    with pytest.raises(ValueError):
        Rule(**kwargs)


@pytest.mark.parametrize("dof, expected", [(1, 12.706), (2, 4.303), (4, 2.776), (11, 2.228), (100, 2.000)])
def test_t_quantile_rounds_down_to_a_conservative_value(dof, expected):
    assert t975(dof) == expected


def test_each_window_counts_its_own_samples():
    # an epoch's short last batch: a window of half the samples in half the time is the same rate
    times, counts = [1.0] * 6 + [0.5], [SAMPLES] * 6 + [SAMPLES // 2]
    decision = decide(times, counts, Rule(precision=0.02))
    assert decision.throughput == pytest.approx(SAMPLES)
    assert decision.half_width == pytest.approx(0.0)


def test_the_warm_up_costs_what_its_windows_took_beyond_the_steady_rate():
    times = [3.0, 2.0] + [1.0] * 8
    decision = decide(times, SAMPLES, Rule(precision=0.02))
    assert decision.warmup_windows == 2
    # 5 s spent on two windows the steady rate trains in 2 s
    assert steadystate.warmup_excess_s(times, SAMPLES, decision) == pytest.approx(3.0)
    flat = [1.0] * 10
    assert steadystate.warmup_excess_s(flat, SAMPLES, decide(flat, SAMPLES, Rule())) == 0.0


def test_windows_that_never_settled_before_training_ended_give_the_later_half():
    rng = random.Random(3)
    times = [1.0] * 10 + noisy(2.0, 0.01, 6, rng)  # the level halved late: not settled
    assert decide(times, SAMPLES, Rule()).steady_windows == 0
    final = decide(times, SAMPLES, Rule(), ended=True)
    assert final.reason == steadystate.ENDED and final.steady_windows == 8
    # a figure between the levels, whose interval says it is not one level
    assert SAMPLES / 2.0 < final.throughput < SAMPLES / 1.0 and final.relative > 0.1


def test_mser_agrees_with_its_definition_and_finds_the_warm_up_in_thousands_of_windows():
    rng = random.Random(5)
    values = [3.0, 2.0, 1.5] + noisy(1.0, 0.05, 40, rng)

    def by_definition(keep):
        scores = []
        for d in range(len(values) - keep + 1):
            rest = values[d:]
            mean = sum(rest) / len(rest)
            scores.append(sum((x - mean) ** 2 for x in rest) / len(rest) ** 2)
        return scores.index(min(scores))

    assert steadystate.mser_truncation(values, 5) == by_definition(5)
    # a full run's thousands of windows (where the quadratic rule took seconds a call): the 50
    # slow windows go, and hardly more of the 20,000 steady ones
    many = [5.0] * 50 + noisy(1.0, 0.05, 20000, rng)
    assert 50 <= steadystate.mser_truncation(many, 5) < 100
