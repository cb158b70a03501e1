"""Each training stage's time limit (ddpscale.plan.cost.timelimit): in throughput mode the measuring
cap plus a set-up allowance, measured or the stated default, at most the profile's runtime; the
profile's runtime in full mode."""

from __future__ import annotations

import pytest

from helpers.configs import rule
from ddpscale.plan.cost.timelimit import (
    DEFAULT_SETUP_MIN, MIN_SETUP_MIN, Limit, limit_lines, measured_setups, setup_seconds, stage_limits,
)

STAGES = {"baseline": ["1x1"], "single_node": ["1x2"], "multi_node": []}
RUNTIMES = {"train_baseline": 240, "train_single_node": 120, "train_multi_node": 120}
CAPS = rule(max_minutes=10, max_steps=2000)


def by_rule(limits: list[Limit]) -> dict:
    return {limit.rule: limit.minutes for limit in limits}


def test_throughput_mode_asks_for_the_cap_plus_the_default_set_up_where_nothing_was_measured():
    limits = stage_limits("throughput", CAPS, STAGES, RUNTIMES, {})
    # a stage without topologies gets no job and no line
    assert by_rule(limits) == {"train_baseline": 10 + DEFAULT_SETUP_MIN, "train_single_node": 10 + DEFAULT_SETUP_MIN}
    assert "the default; no finished run of this experiment measured it yet" in limits[0].why
    assert limits[0].why.endswith("the profile's runtime for train_baseline, 240 min, is kept for measure: full")


def test_the_allowance_is_twice_the_most_measured_set_up_of_the_stage_else_of_the_experiment():
    measured = {"1x2": 6 * 60.0, "2x2": 9 * 60.0}
    limits = stage_limits("throughput", CAPS, STAGES, RUNTIMES, measured)
    # 1x2 measured its own: 2 x 6 min; 1x1 has none, so the experiment's most: 2 x 9 min
    assert by_rule(limits) == {"train_single_node": 22, "train_baseline": 28}
    assert "(2 x 6 min measured by 1x2, at least 5)" in limits[1].why
    # a quick start still gets MIN_SETUP_MIN; fractions of a minute round the limit up
    assert by_rule(stage_limits("throughput", rule(max_minutes=2.5), STAGES, RUNTIMES, {"1x1": 30.0})) == {
        "train_baseline": 3 + MIN_SETUP_MIN, "train_single_node": 3 + MIN_SETUP_MIN}


def test_the_profiles_runtime_caps_the_sized_limit_and_stays_in_full_mode_or_without_a_time_cap():
    short = {**RUNTIMES, "train_single_node": 15}
    limits = stage_limits("throughput", CAPS, STAGES, short, {})
    assert by_rule(limits)["train_single_node"] == 15
    assert limits[1].why.endswith("= 25 min, capped at the profile's runtime for train_single_node")
    full = stage_limits("full", CAPS, STAGES, RUNTIMES, {"1x1": 60.0})
    assert by_rule(full) == {"train_baseline": 240, "train_single_node": 120}
    assert full[0].why == "measure full: the profile's runtime for train_baseline"
    steps_only = stage_limits("throughput", rule(max_steps=2000), STAGES, RUNTIMES, {})
    assert by_rule(steps_only) == {"train_baseline": 240, "train_single_node": 120}
    assert "throughput.max_minutes is null" in steps_only[0].why
    # no runtime in the profile: the partition's default, not a limit of the workflow's own
    unset = stage_limits("throughput", CAPS, STAGES, {}, {})
    assert by_rule(unset) == {"train_baseline": None, "train_single_node": None}


def test_set_up_is_what_a_throughput_run_held_beyond_its_windows():
    record = {"topology": "1x2", "measure": "throughput", "held_s": 400.0, "window_seconds": [50.0, 50.0]}
    assert setup_seconds(record) == 300.0
    assert setup_seconds({**record, "measure": "full"}) is None  # every epoch measured: no set-up to tell
    assert setup_seconds({"topology": "1x2"}) is None  # an older or partial record
    records = [record, {**record, "held_s": 700.0}, {**record, "topology": "1x1", "held_s": 150.0}, {}]
    assert measured_setups(records) == {"1x2": 600.0, "1x1": 50.0}


def test_one_dry_run_line_per_stage():
    lines = limit_lines([Limit("train_baseline", 25, "why"), Limit("train_multi_node", None, "none set")])
    assert lines == ["ddpscale: time limit: train_baseline: 25 min (why)",
                     "ddpscale: time limit: train_multi_node: none (none set)"]


@pytest.mark.parametrize("site_local", [True, False])
def test_the_plan_sizes_job_limits_only_on_a_cluster(site_local):
    """RunPlan is handed the measured set-up (build stays pure) and gives the jobs sized limits."""
    from ddpscale.plan import runplan
    from ddpscale.run.hostdevices import VisibleGpus
    from ddpscale.plan.site.resources import Site
    from helpers.configs import default_config

    site = Site() if site_local else Site(launcher="srun", gpus_per_node=4, cpus_per_gpu=8, mem_mb_per_gpu=1000)
    plan = runplan.build(default_config(topologies=["1x1", "1x2"], measure="throughput"), site,
                         config_source="c", lightning=None, python="python", versions={},
                         gpus=VisibleGpus(0, (), "nvidia-smi -L") if site_local else None,
                         cores=8 if site_local else None, measured_setup_s={"1x2": 120.0})
    if site_local:
        assert plan.job_runtimes(RUNTIMES) == RUNTIMES and plan.time_limits(RUNTIMES) == []
    else:
        # 2 x 2 min measured is below the least allowance: 10 + 5 for both stages
        assert plan.job_runtimes(RUNTIMES) == {**RUNTIMES, "train_baseline": 15, "train_single_node": 15}
        assert plan.reservation_lines(RUNTIMES)[0].startswith("ddpscale: time limit: train_baseline: 15 min")
