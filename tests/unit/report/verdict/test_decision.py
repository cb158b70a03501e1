"""The answer follows its intervals (report.verdict.decision): reports built from records whose intervals
are known say "cannot tell" exactly where the intervals do not separate the choice, name the
cheapest topology the data are consistent with and what would tell, and no bound of a ratio
reaches zero, in the tables, the plots or the TSVs."""
import math
import random

import pandas as pd
import pytest

from helpers.records import build, make_run, windows_run
from ddpscale.report.figures import scaling
from ddpscale.report.render import html_tables, plots
from ddpscale.report.verdict import decision, firstscreen, recommendation

THRESHOLD = 0.8


def told_by_formula(efficiency: float, rel_base: float, rel_top: float) -> bool:
    """Whether 1x2 at this efficiency over 1x1, each known to these relative half-widths within
    its run, separates the rule's choice: the answer's rule written out for two topologies."""
    width = math.hypot(math.atanh(rel_base), math.atanh(rel_top))
    speedup = 2 * efficiency
    if efficiency >= THRESHOLD:  # the choice is 1x2
        return speedup * math.exp(-width) > 1 and efficiency * math.exp(-width) >= THRESHOLD
    return efficiency * math.exp(width) < THRESHOLD  # the choice is 1x1: 1x2 must lie surely below


@pytest.mark.parametrize("rel", [0.005, 0.05, 0.2, 0.4])
def test_the_answer_says_cannot_tell_exactly_where_the_intervals_do_not_separate_the_choice(rel):
    """Both ways wrong would fail: a finding stated where the interval straddles the threshold or
    reaches the baseline (the issue's "Use 1x2: 1.90x" at -3.46 to 7.25), or "cannot tell" where it
    does not. Efficiencies from 0.3 to 1.0 in steps of 0.02 cross the threshold at every width."""
    seen = set()
    for k in range(15, 51):
        efficiency = k / 50
        data = build([windows_run("1x1", throughput_half_width=100.0 * rel),
                      windows_run("1x2", throughput_samples_s=200.0 * efficiency,
                                  throughput_half_width=200.0 * efficiency * rel)])
        said = firstscreen.answer(data)
        told = told_by_formula(efficiency, rel, rel)
        assert said.startswith("Cannot tell yet") == (not told), (efficiency, said)
        if told:
            assert said.startswith("Use 1x2" if efficiency >= THRESHOLD else "Stay on 1x1"), said
        else:
            assert "The data are consistent with 1x1, the cheapest" in said and "to tell, " in said, said
        seen.add(told)
    assert seen == {True, False}  # each width shows both answers somewhere on the grid


def test_a_speedup_whose_interval_reaches_the_baseline_s_is_no_finding():
    # 1x2 at 1.2x: above the threshold on its figure (60% with threshold 0.5), but 1x1's interval is wide
    data = build([windows_run("1x1", throughput_half_width=30.0),
                  windows_run("1x2", throughput_samples_s=120.0, throughput_half_width=1.0)])
    data.threshold = 0.5
    said = firstscreen.answer(data)
    assert said.startswith("Cannot tell yet: 1x2's speedup, 1.20x (0.88\u20131.64), reaches 1x1's"), said


def three_topologies(rel_1x2: float, rel_2x1: float, t_2x1: float = 185.0):
    return build([windows_run("1x1", throughput_half_width=0.5),
                  windows_run("1x2", throughput_samples_s=190.0, throughput_half_width=190.0 * rel_1x2),
                  windows_run("2x1", throughput_samples_s=t_2x1, throughput_half_width=t_2x1 * rel_2x1)])


def test_two_topologies_that_cannot_be_told_apart_give_the_cheapest_consistent_one():
    """1x2 and 2x1 are both surely above the threshold and faster than 1x1, but not surely apart:
    the answer names 1x2 (one node: the cheaper) as consistent, not as the finding."""
    data = three_topologies(0.05, 0.05)
    said = firstscreen.answer(data)
    assert said.startswith("Cannot tell yet: 1x2 is not surely faster than 2x1"), said
    assert "The data are consistent with 1x2, the cheapest" in said
    # narrow enough, the same figures are a finding
    assert firstscreen.answer(three_topologies(0.005, 0.005)).startswith("Use 1x2: ")


def test_a_partial_report_calls_no_topology_the_fastest_that_its_intervals_do_not():
    """The issue's partial report called 2x1 "the fastest" at 1.31x with an interval of -1.73 to 4.35."""
    runs = [windows_run("1x1", throughput_half_width=30.0),
            windows_run("2x1", throughput_samples_s=131.0, throughput_half_width=40.0)]
    data = build(runs)  # 1x2 never finished: a partial report of what did
    assert "the fastest cannot be told yet: 2x1" in data.recommendation
    assert "is not surely faster than 1x1" in data.recommendation
    sure = build([windows_run("1x1"), windows_run("2x1", throughput_samples_s=131.0)])
    assert "the fastest is 2x1" in sure.recommendation


def test_what_would_tell_is_more_repeats_where_the_repeats_set_the_interval():
    runs = [*(windows_run("1x1", repeat=k, throughput_samples_s=t) for k, t in enumerate((95.0, 100.0, 105.0))),
            *(windows_run("1x2", repeat=k, throughput_samples_s=t) for k, t in enumerate((165.0, 175.0, 185.0)))]
    data = build(runs)
    said = firstscreen.answer(data)
    cure = decision.remedy(firstscreen.decided(data), data.summary)
    assert cure.repeats and cure.factor > 1
    more = math.ceil(3 * cure.factor) - 3
    assert f"about {more} more repeats of 1x2 and 1x1 (repeats: {3 + more}; about " in said, said


def test_what_would_tell_is_a_longer_measurement_where_each_run_s_own_interval_sets_it():
    data = build([windows_run("1x1", throughput_half_width=6.0),
                  windows_run("1x2", throughput_samples_s=170.0, throughput_half_width=7.0)])
    said = firstscreen.answer(data)
    cure = decision.remedy(firstscreen.decided(data), data.summary)
    assert not cure.repeats
    # throughput mode, stopped on precision: a tighter precision, by the square root of the factor
    assert f"throughput.precision: {0.02 / math.sqrt(cure.factor):.2g}" in said, said
    full = build([make_run("1x1", throughput_half_width=6.0),
                  make_run("1x2", throughput_samples_s=170.0, throughput_half_width=7.0)])
    # full mode: more steady epochs (3 configured, 1 warm-up)
    factor = decision.remedy(firstscreen.decided(full), full.summary).factor
    assert f"max_epochs: {1 + math.ceil(2 * factor)}" in firstscreen.answer(full)


def test_a_run_too_short_for_an_interval_is_said_and_never_given_one():
    data = build([windows_run("1x1", throughput_half_width=None), windows_run("1x2", throughput_samples_s=190.0)])
    said = firstscreen.answer(data)
    assert said.startswith("Cannot tell yet: 1x1 has no interval (too short to tell)"), said
    row = [r for r in firstscreen.decision_rows(data) if r["topology"] == "1x2"][0]
    # 1x2 has its own interval; its ratio over 1x1 has none, and says why
    assert row["speedup"] == "1.90x" and row["interval"] == "no interval: 1x1 too short to tell"
    base = [r for r in firstscreen.decision_rows(data) if r["topology"] == "1x1"][0]
    assert base["interval"] == "too short to tell"


# relative half-widths a record may hold: none, zero, tiny, wide, at and past the figure
HOSTILE = (None, 0.0, 1e-9, 0.5, 0.999, 1.0, 5.0, 1e6)


def test_no_bound_of_any_interval_reaches_zero_whatever_the_half_widths():
    rng = random.Random(43)
    for k in range(40):
        runs = []
        for t in ("1x1", "1x2", "2x1"):
            figure = rng.uniform(1, 1000)
            rel = HOSTILE[k % len(HOSTILE)] if t == "1x1" else rng.choice(HOSTILE)
            runs.append(windows_run(t, throughput_samples_s=figure,
                                    throughput_half_width=None if rel is None else rel * figure))
        data = build(runs)
        shown = scaling.rounded(data.summary, "test_acc")
        for frame in (data.summary, shown):
            for col in ("throughput_low", "speedup_low", "efficiency_low"):
                lows = pd.to_numeric(frame[col], errors="coerce").dropna()
                assert (lows > 0).all(), (col, lows.tolist())
        for row in firstscreen.decision_rows(data):
            assert "\u2013" not in row["speedup"] or not row["speedup"].split("(")[1].startswith("0)")
        assert not any(b < 0 for b in plots._error_bars(data.finished, "speedup")[0])


def test_the_baseline_s_own_interval_is_the_same_in_the_table_and_the_plot():
    data = build([windows_run("1x1", throughput_half_width=10.0), windows_run("1x2", throughput_samples_s=190.0)])
    base = data.finished.set_index("topology").loc["1x1"]
    low, high = plots._error_bars(data.finished, "speedup")
    drawn = (1.0 - low[0], 1.0 + high[0])  # the baseline's bar, around 1
    assert drawn == pytest.approx((base["speedup_low"], base["speedup_high"]))
    assert drawn == pytest.approx((math.exp(-math.atanh(0.1)), math.exp(math.atanh(0.1))))
    row = [r for r in firstscreen.decision_rows(data) if r["topology"] == "1x1"][0]
    assert row["speedup"] == "1.00x (0.90\u20131.11)"


def test_the_recommendation_claims_the_threshold_only_where_the_interval_clears_it():
    wide = three_topologies(0.2, 0.2, t_2x1=150.0)
    assert "whether any topology beyond the baseline 1x1 stays above 80% efficiency cannot be told yet" in \
        wide.recommendation or "whether 2x1 also does cannot be told yet" in wide.recommendation
    narrow = three_topologies(0.005, 0.005, t_2x1=150.0)
    assert "the largest that stays above 80% efficiency is 1x2" in narrow.recommendation
    assert "cannot be told" not in narrow.recommendation
    below = build([windows_run("1x1"), windows_run("1x2", throughput_samples_s=110.0)])
    assert recommendation.recommendation(below.summary, below.comparison, 0.8).endswith(
        "none beyond the baseline 1x1 stays above 80% efficiency")


def test_a_run_whose_windows_never_settled_is_shown_as_not_steady():
    """Where the truth moves (a drift, a shift the rule could not cut off) the run either covers
    it or says so: the stopping rule records windows_settled false, and the report shows it in the
    cell, the legend and a caveat whose badge reads "not steady"."""
    data = build([windows_run("1x1"), windows_run("2x1", throughput_samples_s=150.0, windows_settled=False)])
    _, _, table = html_tables.scaling_table(data)
    assert '<span class="reason" title="its windows kept moving' in str(table) and ">not steady</span>" in str(table)
    note = next(n for n in data.notes if n.startswith("Not steady"))
    assert "the windows of 2x1 kept moving" in note and firstscreen.badge_label(note) == "not steady"
    steady = build([windows_run("1x1", windows_settled=True), windows_run("2x1", throughput_samples_s=150.0)])
    assert not any(n.startswith("Not steady") for n in steady.notes)
    assert "not steady" not in str(html_tables.scaling_table(steady)[2])
