"""What a dry run says the benchmark reserves (ddpscale.plan.cost.reservation), on plain data.
The real dry run of a shipped profile: test_reservation_dryrun.py."""
import pytest

from helpers.configs import rule
from ddpscale.plan.cost.reservation import (
    NOT_SCHEDULED,
    Decision,
    by_record,
    expected_hours,
    hours,
    rerun_reason,
    reserved_hours,
    summary_lines,
    training_jobs,
)
from ddpscale.plan.site.profile import stage_runtime
from ddpscale.plan.site.resources import Site

# gilbreth's shape: 2 GPUs per node, srun
CLUSTER = Site(launcher="srun", gpus_per_node=2)
STAGES = {"baseline": ["1x1"], "single_node": ["1x2"], "multi_node": ["2x2"]}
RUNTIMES = {"train_baseline": 240, "train_single_node": 120, "train_multi_node": 120}
CAPS = rule(max_steps=2000, max_minutes=10)


def total_line(lines):
    return next(line for line in lines if "this benchmark reserves" in line)


def expected_line(lines):
    return next((line for line in lines if "expected use from the caps" in line), None)


def test_a_stage_entry_wins_over_train_which_wins_over_the_defaults():
    stages = {"train_baseline": 240, "train_single_node": None}
    assert stage_runtime("train_baseline", stages, 120, 20) == 240
    assert stage_runtime("train_single_node", stages, 120, 20) == 120
    assert stage_runtime("train_multi_node", stages, None, 20) == 20
    assert stage_runtime("train_multi_node", stages, None, None) is None


def test_each_job_reserves_its_devices_times_its_time_limit():
    jobs = training_jobs(STAGES, [0, 1], CLUSTER, RUNTIMES)
    assert [(j.topology, j.repeat, j.rule, j.devices) for j in jobs][:3] == [
        ("1x1", 0, "train_baseline", 1), ("1x1", 1, "train_baseline", 1), ("1x2", 0, "train_single_node", 2)]
    assert [reserved_hours(j) for j in jobs] == [4.0, 4.0, 4.0, 4.0, 8.0, 8.0]
    lines = summary_lines(jobs, CLUSTER, "auto", "full", CAPS)
    assert "1x1 r0 (train_baseline): 1 GPU x 240 min = 4.0 GPU-hours reserved" in lines[0]
    assert "2x2 r1 (train_multi_node): 4 GPUs x 120 min = 8.0 GPU-hours reserved" in lines[5]
    assert "reserves at most 32.0 GPU-hours (6 jobs)" in total_line(lines)
    assert expected_line(lines) is None  # full mode trains the configured epochs: no caps


def test_whole_nodes_are_reserved_with_site_exclusive():
    site = Site(launcher="srun", gpus_per_node=4, exclusive=True)
    jobs = training_jobs({"baseline": ["1x1"], "multi_node": ["2x2"]}, [0], site,
                         {"train_baseline": 60, "train_multi_node": 60})
    assert [j.devices for j in jobs] == [4, 8]
    assert "reserves at most 12.0 GPU-hours" in total_line(summary_lines(jobs, site, "auto", "full", CAPS))


def test_throughput_mode_expects_the_time_cap_or_the_time_limit_if_it_comes_first():
    runtimes = {**RUNTIMES, "train_single_node": 6}  # a time limit below the 10-minute cap
    jobs = training_jobs(STAGES, [0], CLUSTER, runtimes)
    assert [expected_hours(j, 10) for j in jobs] == [10 / 60, 2 * 6 / 60, 4 * 10 / 60]
    lines = summary_lines(jobs, CLUSTER, "auto", "throughput", CAPS)
    assert "expected 0.2 GPU-hours (6 min of measuring)" in lines[1]
    # reserved: 4 + 0.2 + 8; expected: (10 + 12 + 40) / 60
    assert "reserves at most 12.2 GPU-hours (3 jobs)" in total_line(lines)
    assert "expected use from the caps: 1.03 GPU-hours" in expected_line(lines)
    assert "set-up, probe and validation not included" in expected_line(lines)


def test_without_a_time_cap_the_expected_use_is_unknown_not_guessed():
    jobs = training_jobs(STAGES, [0], CLUSTER, RUNTIMES)
    steps_only = summary_lines(jobs, CLUSTER, "auto", "throughput", rule(max_steps=2000))
    assert "expected use from the caps: unknown" in expected_line(steps_only)
    assert "only max_steps (2000) caps a run" in expected_line(steps_only)
    assert not any("expected 0" in line for line in steps_only)
    uncapped = summary_lines(jobs, CLUSTER, "auto", "throughput", rule())
    assert "no cap is set" in expected_line(uncapped)
    # the reservation itself does not depend on the caps
    assert "reserves at most 16.0 GPU-hours" in total_line(uncapped)


def test_finished_runs_are_named_and_left_out_of_the_total():
    jobs = training_jobs(STAGES, [0], CLUSTER, RUNTIMES, lambda name, repeat: by_record(name == "1x1"))
    lines = summary_lines(jobs, CLUSTER, "auto", "throughput", CAPS)
    assert "1x1 r0 (train_baseline): finished" in lines[0] and "not counted" in lines[0]
    assert "reserves at most 12.0 GPU-hours (2 jobs; 1 finished run not counted: 1x1/r0)" in total_line(lines)
    assert "expected use from the caps: 1.0 GPU-hours" in expected_line(lines)


def test_a_finished_run_snakemake_reruns_is_counted_and_says_why():
    """Snakemake reruns a finished run whose params changed (another measure, say): its GPU-hours
    count, and the run is named with the reason; a run this invocation leaves out does not count."""
    decided = {"1x1": Decision(True, True, "params changed"), "1x2": Decision(True, False),
               "2x2": Decision(False, False, NOT_SCHEDULED)}
    jobs = training_jobs(STAGES, [0], CLUSTER, RUNTIMES, lambda name, repeat: decided[name])
    lines = summary_lines(jobs, CLUSTER, "auto", "full", CAPS)
    assert lines[0].endswith("1x1 r0 (train_baseline): finished, rerun by Snakemake (params changed): "
                             "1 GPU x 240 min = 4.0 GPU-hours reserved")
    assert "1x2 r0 (train_single_node): finished (its metrics.json exists): Snakemake does not rerun it" in lines[1]
    assert lines[2].endswith(f"2x2 r0 (train_multi_node): not run by this invocation ({NOT_SCHEDULED}), not counted")
    assert total_line(lines) == ("ddpscale: this benchmark reserves at most 4.0 GPU-hours (1 job; 1 finished run "
                                 "rerun: 1x1/r0 (params changed); 1 finished run not counted: 1x2/r0; 1 run not in "
                                 "this invocation: 2x2/r0)")
    local = Site(gpus_per_node=8)
    rerun = training_jobs(STAGES, [0], local, {}, lambda name, repeat: Decision(True, True, "params changed"))
    assert total_line(summary_lines(rerun, local, "cpu", "full", CAPS)) == (
        "ddpscale: this benchmark reserves no GPU-hours (3 jobs on this host's CPU, one process per simulated "
        "device; 3 finished runs rerun: 1x1/r0, 1x2/r0, 2x2/r0 (params changed))")


@pytest.mark.parametrize("names,newer,said", [
    (["params have changed since last execution"], [], "params changed"),
    (["updated input files"], ["scripts/train.py"], "input updated: scripts/train.py"),
    (["incomplete output files"], [], "incomplete: an earlier job stopped while writing it"),
    # Snakemake checks nothing else of a forced job
    (["forced", "params have changed since last execution"], [], "forced on the command line"),
    (["code has changed since last execution", "params have changed since last execution"], [],
     "rule code changed; params changed"),
    (["a reason of a later Snakemake"], [], "a reason of a later Snakemake"),
    ([], [], "rerun by Snakemake"),
])
def test_snakemakes_reason_is_said_in_short(names, newer, said):
    assert rerun_reason(names, newer) == said


def test_a_stage_without_a_time_limit_is_said_and_not_counted():
    jobs = training_jobs(STAGES, [0], CLUSTER, {**RUNTIMES, "train_multi_node": None})
    lines = summary_lines(jobs, CLUSTER, "auto", "full", CAPS)
    assert "no runtime set: the partition's default time limit applies, GPU-hours unknown" in lines[2]
    assert "reserves at most 8.0 GPU-hours (2 jobs; 1 job with no runtime set" in total_line(lines)


@pytest.mark.parametrize("accelerator,says", [
    ("cpu", "reserves no GPU-hours (3 jobs on this host's CPU, one process per simulated device)"),
    ("gpu", "reserves no GPU-hours: the local profile has no scheduler and no time limit"),
])
def test_the_local_profile_reserves_nothing(accelerator, says):
    site = Site(gpus_per_node=8)
    jobs = training_jobs(STAGES, [0], site, {})
    lines = summary_lines(jobs, site, accelerator, "full", CAPS)
    assert says in total_line(lines)
    kind = "CPU-simulated devices" if accelerator == "cpu" else "GPUs"
    assert lines[1].endswith(f"2 {kind} of this host, no time limit")


@pytest.mark.parametrize("value,text", [(4.0, "4.0"), (1 / 6, "0.17"), (12.5, "12.5"), (7 / 6, "1.17")])
def test_hours_are_written_with_one_or_two_decimals(value, text):
    assert hours(value) == text
