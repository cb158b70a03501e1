"""The full training's cost projected from a run's measurements (report.figures.projection), what the
answer itself cost, and how the report shows throughput mode: the interval within a run, why
it stopped, accuracy not compared, and a refusal to mix modes. Hand-made metrics records."""
import math
import re

import numpy as np
import pandas as pd
import pytest

from helpers.configs import rule
from helpers.records import KNOWN, build, make_run, windows_run
from helpers.report import _assert_one_line_error, run_report, write_fixtures
from ddpscale.report.figures import accuracy, projection
from ddpscale.report.render import html_tables, summaries
from ddpscale.report.render import html as report_html
from ddpscale.report.verdict import recommendation

# 10 epochs x (36,000 samples / 100 samples/s + 6 s per epoch outside the steps: loader start
# and hooks; no validation, a save at every epoch's end that takes no time) + 5 s warm-up excess
KNOWN_S = 10 * (360.0 + 6.0) + 5.0


def known_run(**overrides) -> pd.Series:
    """A 1x1 record with the KNOWN figures, as the report's frame holds a row."""
    return pd.Series(make_run("1x1", **{**KNOWN, **overrides}))


def test_projection_arithmetic_on_known_numbers():
    assert projection.project_run(known_run()) == (pytest.approx(KNOWN_S), None)
    # every epoch pays what no step took, once per epoch
    no_overhead = known_run(epoch_overheads_s=[0.0])
    assert projection.project_run(no_overhead)[0] == pytest.approx(10 * 360.0 + 5.0)


def test_median_over_repeats_device_hours_and_the_answers_cost():
    runs = pd.DataFrame([windows_run("1x1", held_s=60.0),
                         windows_run("2x2", repeat=0, window_throughput_samples_s=400.0, held_s=30.0),
                         windows_run("2x2", repeat=1, window_throughput_samples_s=360.0, held_s=30.0),
                         windows_run("2x2", repeat=2, window_throughput_samples_s=300.0, held_s=30.0)])
    projected = projection.projection(runs)
    table, spent = projected.set_index("topology"), projection.spent(runs, projected)
    median = 10 * (36000 / 360.0 + 6.0) + 5.0  # the middle repeat
    assert table.loc["2x2", "projected_s"] == pytest.approx(median)
    assert table.loc["2x2", "projected_device_hours"] == pytest.approx(median * 4 / 3600)
    assert table.loc["1x1", "projected_device_hours"] == pytest.approx(KNOWN_S / 3600)
    assert table["measured_s"].isna().all()  # throughput mode trained no full run
    assert spent.answer_device_hours == pytest.approx((60.0 * 1 + 3 * 30.0 * 4) / 3600)
    # held: plus what each run held its devices outside its windows' 6 s epoch (60 s and 30 s held)
    assert spent.full_device_hours == pytest.approx((KNOWN_S + 54.0 + (median + 24.0) * 4) / 3600)


def test_full_mode_shows_the_projections_error_against_the_measured_training():
    runs = pd.DataFrame([make_run("1x1", **KNOWN, measure="full", fit_time_s=3500.0)])
    row = projection.projection(runs).iloc[0]
    assert row["measured_s"] == pytest.approx(3506.0)  # fit time + checkpoint writes
    assert row["error"] == pytest.approx(KNOWN_S / 3506.0 - 1)
    assert projection.spent(runs, projection.projection(runs)).full_device_hours is None  # the answer was full training


def test_a_run_without_a_steady_window_throughput_is_not_projected_and_says_why():
    # make_run's full runs timed no window (too few steps): no figure to project from
    runs = pd.DataFrame([make_run("1x1"), make_run("1x2")])
    table = projection.projection(runs)
    assert table["projected_s"].isna().all()
    assert set(table["why_na"]) == {"not recorded: window_throughput_samples_s"}
    assert projection.spent(runs, table).answer_device_hours == pytest.approx((40.0 * 1 + 40.0 * 2) / 3600)
    _, note, html = html_tables.projection_table(build([make_run("1x1"), make_run("1x2")]))
    assert "n/a" in html and "not recorded: window_throughput_samples_s" in html


def test_an_epoch_of_unknown_size_says_why_and_what_would_give_it():
    """Issue 45 item 8: a loader without a length whose run trained no whole epoch has no size of
    an epoch to project; the reason names the setting that would let it count one."""
    projected, why = projection.project_run(pd.Series(windows_run(samples_per_epoch=None,
                                                                  samples_per_epoch_from=None)))
    assert math.isnan(projected) and why == projection.NO_EPOCH_SIZE
    assert "no length" in why and "throughput.min_windows" in why and "__len__" in why
    # counted in whole epochs, it projects as a loader's length would
    counted = windows_run(samples_per_epoch=36000, samples_per_epoch_from="counted in 2 whole epochs")
    assert projection.project_run(pd.Series(counted)) == (pytest.approx(KNOWN_S), None)


def test_the_first_epoch_s_one_off_cost_is_added_once_not_every_epoch():
    """Issue 29 item 3: the first epoch's cold validation and first save (30 s) against 6 s in
    the epochs after it: 10 epochs cost 10 x 6 + 24 once, not 10 x the mean of the three."""
    record = known_run(epoch_overhead_s=14.0, epoch_overheads_s=[30.0, 6.0, 6.0])
    projected, why = projection.project_run(record)
    assert why is None and projected == pytest.approx(10 * (360.0 + 6.0) + 24.0 + 5.0)
    # one timed: its (cold) figure; none: nothing to add
    assert projection.warm_and_once([30.0]) == (30.0, 0.0)
    assert projection.warm_and_once([]) == (None, 0.0)


# A throughput run that stopped in its first epoch: 8 s outside its steps there, of which a
# cold validation took 4 s and the first save 2 s; after the stop it validated (1 s) and saved
# (0.5 s) again, warm. The rest of that epoch (loader start, hooks): 2 s.
TIMED = {**KNOWN, "epoch_overhead_s": 8.0, "epoch_overheads_s": [8.0], "validation_s": [[0, 4.0]],
         "checkpoint_save_s": [[0, 2.0]], "after_stop_validation_s": [1.0], "after_stop_checkpoint_s": [0.5],
         "check_val_every_n_epoch": 1, "validates": True}


def test_validations_and_saves_are_counted_as_the_trainer_makes_them_cold_ones_once():
    # 10 epochs: 10 x (2 s + 1 s validation + 0.5 s save) + the first validation's 3 s and the
    # first save's 1.5 s excess once; not 10 x the cold epoch's 8 s
    assert projection.overheads(TIMED, 10) == (pytest.approx(10 * 3.5 + 3.0 + 1.5), 4.5, None)
    # check_val_every_n_epoch 2: Lightning validates, and so saves, every second epoch only
    every_2 = {**TIMED, "check_val_every_n_epoch": 2}
    assert projection.events(10, 2, True) == (5, 5)
    assert projection.overheads(every_2, 10) == (pytest.approx(10 * 2.0 + 5 * 1.5 + 3.0 + 1.5), 4.5, None)
    # no validation: a save at every epoch's end, every second epoch's: none at all
    assert projection.events(10, 1, False) == (0, 10) and projection.events(10, 2, False) == (0, 0)
    # the run as a whole
    projected, why = projection.project_run(known_run(**TIMED))
    assert why is None and projected == pytest.approx(10 * 360.0 + 10 * 3.5 + 4.5 + 5.0)
    # a record that says it validates but timed no validation is not guessed
    untimed = {**TIMED, "validation_s": [], "after_stop_validation_s": []}
    assert projection.project_run(known_run(**untimed)) == (pytest.approx(math.nan, nan_ok=True),
                                                          "no validation was timed")


def test_a_full_run_s_first_part_takes_its_validations_and_the_next_ones_for_the_after_stop_ones():
    """The first part (one epoch here) holds epoch 0's validation and save; throughput mode
    would have timed one more of each after its stop, which epoch 1's stand for."""
    record = {**KNOWN, "measure": "full", "window_seconds": [1.0] * 40, "window_samples": [100] * 40,
              "throughput": rule().settings(), "batch_per_device": 5,
              "world_size": 1, "epoch_overheads_s": [8.0, 3.5, 3.5], "validation_s": [[0, 4.0], [1, 1.0], [2, 1.0]],
              "checkpoint_save_s": [[0, 2.0], [1, 0.5], [2, 0.5]], "check_val_every_n_epoch": 1,
              "validates": True}
    part = projection.first_part(record)
    assert part["epoch_overheads_s"] == [8.0] and part["validation_s"] == [[0, 4.0]]
    assert part["after_stop_validation_s"] == [1.0] and part["after_stop_checkpoint_s"] == [0.5]
    assert projection.overheads({**record, **part}, 10) == (pytest.approx(10 * 3.5 + 4.5), 4.5, None)


def test_a_full_run_is_projected_from_its_first_part_so_the_check_can_fail():
    """Issue 29 item 3: a full run whose steps got twice as slow after its first 60 windows.
    Projected from the windows throughput mode would have used (the rule stops at the first look
    on these flat windows), the projection says 1 s a window; the run's own whole-run figure
    would have blended in the slow half and agreed with itself."""
    fast, slow = [1.0] * 60, [2.0] * 60
    record = known_run(measure="full", window_seconds=fast + slow, window_samples=[100] * 120,
                       throughput=rule(max_steps=2000, max_minutes=10).settings(), batch_per_device=5, world_size=1,
                       epoch_overheads_s=[6.0] * 10, samples_per_epoch=36000, window_throughput_samples_s=100 / 1.5)
    part = projection.first_part(record)
    assert part["steps"] == 30 * 20 and part["window_throughput_samples_s"] == pytest.approx(100.0)
    projected, _ = projection.project_run(record)
    assert projected == pytest.approx(10 * (360.0 + 6.0) + 0.0)  # from the first part: 100 samples/s
    whole, _ = projection.project_run(pd.Series({**record, "window_seconds": []}))
    assert whole > 1.4 * projected  # the whole run's own figure would hide the extrapolation


def test_projected_held_hours_count_what_the_answer_s_held_cost_counts():
    """Issue 29 item 3: the answer's cost is held time (start-up and set-up included); a
    projection of training time alone would compare less with more. The run held its devices
    40 s, 3 s of it probing, 24 s in windows and epochs: 13 s outside training, added once."""
    record = {**KNOWN, "held_s": 40.0, "probe_s": 3.0, "window_seconds": [10.0, 8.0], "epoch_overheads_s": [6.0],
              "attempts": 1}
    assert projection.outside_training_s(known_run(**record)) == pytest.approx(13.0)
    assert np.isnan(projection.outside_training_s(known_run(**{**record, "attempts": 2})))  # held spans attempts
    data = build([windows_run("1x1", **record), windows_run("1x2", **record)])
    table = data.projection.set_index("topology")
    assert table.loc["1x2", "projected_held_device_hours"] == pytest.approx((KNOWN_S + 13.0) * 2 / 3600)
    assert data.spent.full_device_hours == pytest.approx((KNOWN_S + 13.0) * 3 / 3600)


def test_a_job_holding_whole_nodes_is_billed_for_them():
    """Issue 29 item 3: with site_exclusive a 1x2 job on a 4-GPU node holds (and pays for) 4
    GPUs; its held hours, the answer's cost and its projected held hours count 4, not 2."""
    runs = [windows_run("1x1", held_s=36.0, held_devices=4), windows_run("1x2", held_s=36.0, held_devices=4)]
    data = build(runs)
    assert data.summary.set_index("topology").loc["1x2", "held_gpu_hours"] == pytest.approx(36.0 * 4 / 3600)
    assert data.spent.answer_device_hours == pytest.approx(2 * 36.0 * 4 / 3600)
    # where the site gives a job only its ranks, its ranks
    ranks = build([windows_run("1x1", held_s=36.0), windows_run("1x2", held_s=36.0)])
    assert ranks.spent.answer_device_hours == pytest.approx(36.0 * 3 / 3600)


def test_the_sentences_read_like_the_issue():
    table = pd.DataFrame({"topology": ["1x4", "2x4"], "world_size": [4, 8], "projected_s": [18000.0, 11160.0],
                          "projected_device_hours": [20.0, 24.8], "epochs": [50.0, 50.0],
                          "global_batch": [256.0, 256.0]})
    assert projection.sentence(table, "GPU-hours") == (
        "full training on 1x4 (50 epochs at global batch 256): 5.0 h, 20 GPU-hours; "
        "on 2x4 (50 epochs at global batch 256): 3.1 h, 25 GPU-hours")  # two significant digits, as the issue's
    spent = projection.Spent(answer_device_hours=0.75, full_device_hours=44.8, full_why_na=None)
    assert projection.cost_sentence(spent, "GPU-hours") == (
        "This answer cost 0.75 GPU-hours (held), 2% of what training every topology in full would take "
        "(45 GPU-hours, held).")
    dearer = projection.Spent(answer_device_hours=0.017, full_device_hours=0.0051, full_why_na=None)
    assert projection.cost_sentence(dearer, "device-hours") == (
        "This answer cost 0.017 device-hours (held), 3.3x what training every topology in full would take "
        "(0.0051 device-hours, held): measure: full would have answered for less, with accuracy compared.")
    assert [projection.duration(s) for s in (3.24, 45, 720, 11160, None)] == ["3.2 s", "45 s", "12 min", "3.1 h", "n/a"]


def test_weak_scaling_projections_say_their_batch_and_warn_where_accuracy_was_not_shown():
    """Issue 29 item 7: under weak scaling 1x2 trains at twice the baseline's global batch; a
    throughput run showed nothing about convergence there, so the report says so."""
    weak = [windows_run("1x1", effective_batch=32), windows_run("1x2", effective_batch=64, throughput_samples_s=190.0)]
    data = build(weak)
    table = data.projection.set_index("topology")
    assert table.loc["1x2", "global_batch"] == 64 and table.loc["1x2", "epochs"] == 10
    assert "1x2 (10 epochs at global batch 64)" in projection.sentence(data.projection, "GPU-hours")
    note = [n for n in data.notes if n.startswith("The projections of")]
    assert note and "1x2" in note[0] and "larger than the baseline's 32 (1x2 64)" in note[0]
    strong = build([windows_run("1x1", effective_batch=64), windows_run("1x2", effective_batch=64)])
    assert not any(n.startswith("The projections of") for n in strong.notes)


def test_throughput_mode_does_not_compare_accuracy_anywhere():
    data = build([windows_run("1x1", test_acc=0.9), windows_run("1x2", test_acc=0.5, throughput_samples_s=190.0)])
    assert data.comparison.not_compared == accuracy.NOT_COMPARED_THROUGHPUT and data.comparison.throughput_mode
    assert data.summary["accuracy_held"].isna().all()  # 0.5 vs 0.9 mid-training is no failure
    assert "by speed alone (accuracy not compared: throughput mode)" in data.recommendation
    assert report_html.headline(data.finished, data.comparison).endswith("accuracy not compared (throughput mode)")
    _, _, table = html_tables.scaling_table(data)
    assert table.count("not compared (throughput mode)") == 4  # two rows: the metric and the held cell
    assert "held" not in recommendation.recommendation(data.summary, data.comparison, 0.8)
    # nor time to accuracy: "not measured (throughput mode)", never "0 of 2 topologies reached the target"
    assert summaries.time_to_accuracy(data).startswith("Not measured (throughput mode)")
    heading, note, table = html_tables.tta_table(data)
    assert note.startswith("Not measured (throughput mode)") and "reached the target" not in note
    assert table.count("not measured (throughput mode)") == 2


def test_the_scaling_table_shows_the_interval_within_the_run_and_a_cap_reason():
    runs = [windows_run("1x1"),
            *(windows_run("1x2", repeat=k, throughput_samples_s=t, throughput_half_width=8.0,
                          stop_reason="step cap reached") for k, t in enumerate((190.0, 200.0, 195.0)))]
    data = build(runs)
    _, note, table = html_tables.scaling_table(data)
    # one figure and its interval per cell, a reason badge where it stopped short, named in the legend:
    # 1 of 100 samples/s within the run is 99-101 on the log scale, its bounds rounded outward
    assert '<td class="">100 (99\u2013102)</td>' in table
    # three repeats spread wider than each run's own 4.1%: the median's interval over repeats
    # (190, 200, 195: t(2) x sd(log) / sqrt(3) x sqrt(pi/2) = 8.0%)
    assert '<td class="">195 (180\u2013212) <span class="reason" title="stopped at throughput.max_steps' in table
    assert table.count(">step cap</span>") == 2  # the cell's badge, and the legend's
    assert '<td class="">190&ndash;200<br><span class="spread">mean&rsquo;s 95% CI' in table  # its own column
    assert "the run's own" in note and "<i>placement noise</i>" in note
    s = data.summary.set_index("topology")
    assert s.loc["1x2", "stop_reason"] == "step cap reached" and s.loc["1x2", "throughput_half_width"] == 8.0
    assert (s["measure"] == "throughput").all()
    # and the verdict says the precision asked for was not reached there, and what to change
    assert ("The throughput of 1x2 (step cap reached: \u00b14.1%) did not reach the \u00b12% asked for" in
            " ".join(data.notes)) and "throughput.max_steps" in " ".join(data.notes)
    assert not any("did not reach" in n for n in build([windows_run("1x1")]).notes)
    # the configured epochs ended first: more epochs, not a higher cap, is the fix
    ended = build([windows_run("1x1"), windows_run("1x2", stop_reason="configured epochs ended",
                                                   throughput_half_width=8.0)]).notes
    assert "raise max_epochs" in " ".join(ended) and "throughput.max_steps" not in " ".join(ended)


def test_methods_say_what_throughput_mode_measured_only_in_throughput_mode():
    data = build([windows_run("1x1")])
    windows = str(report_html._methods(data, time_to_accuracy=False))
    assert "windows of 20 training steps" in windows and "show no trend" in windows
    assert "&plusmn;2%" in windows and "(2000 steps, 10 minutes)" in windows
    data = build([make_run("1x1")])
    full = str(report_html._methods(data, time_to_accuracy=False))
    assert "show no trend" not in full


def test_mixed_modes_are_refused_in_one_line(tmp_path):
    paths = write_fixtures(tmp_path, [make_run("1x1"), windows_run("1x2")])
    proc = run_report(paths, tmp_path / "out")
    _assert_one_line_error(proc, "mix measure modes (full: 1x1/r0; throughput: 1x2/r0)", "set `measure` to one mode")
    assert not (tmp_path / "out").exists()


def test_the_script_writes_the_projection_and_says_the_answers_cost(tmp_path):
    paths = write_fixtures(tmp_path, [windows_run("1x1"), windows_run("1x2", window_throughput_samples_s=200.0)])
    proc = run_report(paths, tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    table = pd.read_csv(tmp_path / "out/projection.tsv", sep="\t").set_index("topology")
    assert table.loc["1x2", "projected_s"] == pytest.approx(10 * (180.0 + 6.0) + 5.0)
    assert re.search(r"This answer cost 0.033 device-hours \(held\), \S+ (of )?what training every topology in full",
                     proc.stdout), proc.stdout
    # the plain-text lines say the first screen's answer first, as the page does
    lines = proc.stdout.splitlines()
    assert lines[1].startswith("ddpscale report: answer: ") and "by speed alone" in lines[2]
    scaling = pd.read_csv(tmp_path / "out/scaling.tsv", sep="\t")
    assert {"measure", "throughput_half_width", "stop_reason"} <= set(scaling.columns)
    assert "The full training, projected" in (tmp_path / "out/report.html").read_text()


def test_a_training_longer_than_its_job_limit_pays_each_later_job_s_start_again():
    limit = {"limit_s": 14400, "signal_s": 120}  # 4 h, warned 2 min before: 14,280 s of work a job
    # 10 h in one job; every later job repeats 600 s of start-up and warm-up: 13,680 s of work
    held, n, why = projection.jobs(36000.0, 600.0, 3600.0, limit)
    assert (n, why) == (3, None) and held == pytest.approx(36000.0 + 2 * 600.0)
    # no warning before the limit: a killed job also loses half an epoch since its last save
    held, n, _ = projection.jobs(36000.0, 600.0, 3600.0, {**limit, "signal_s": 0})
    assert n == 3 and held == pytest.approx(36000.0 + 2 * (600.0 + 1800.0))
    assert projection.jobs(14000.0, 600.0, 3600.0, limit) == (14000.0, 1, None)  # fits in one
    assert projection.jobs(14000.0, 600.0, 3600.0, None) == (14000.0, 1, None)  # no limit (local)
    held, n, why = projection.jobs(36000.0, 14280.0, 3600.0, limit)
    assert math.isnan(held) and n == 0 and "spends it all starting again" in why


def test_the_projected_held_hours_of_a_split_training_count_every_job_s_restart():
    """A throughput run held 40 s: 3 s probing, 24 s in windows and its epoch, 1.5 s validating
    and saving after its stop, 11.5 s outside training; a training of it in jobs of 30 min
    repeats that, the warm-up (5 s) and the cold validation's and save's excess (4.5 s) in each
    job after the first."""
    record = {**TIMED, "held_s": 40.0, "probe_s": 3.0, "window_seconds": [10.0, 6.0], "attempts": 1}
    projected = 10 * 360.0 + 10 * 3.5 + 4.5 + 5.0  # 3,644.5 s: over a 1,800 s job limit
    assert projection.outside_training_s(record) == pytest.approx(11.5)
    limits = {"1x1": {"limit_s": 1800, "signal_s": 0}}
    table = projection.projection(pd.DataFrame([windows_run("1x1", **record)]), limits).iloc[0]
    one_job = projected + 11.5
    restart, lost = 11.5 + 5.0 + 4.5, projected / 10 / 2
    more = math.ceil((one_job - 1800) / (1800 - restart - lost))
    assert table["jobs"] == 1 + more == 3 and table["job_limit_s"] == 1800
    assert table["projected_held_device_hours"] == pytest.approx((one_job + more * (restart + lost)) / 3600)
    assert table["projected_device_hours"] == pytest.approx(projected / 3600)  # the training alone
    unlimited = projection.projection(pd.DataFrame([windows_run("1x1", **record)])).iloc[0]
    assert unlimited["jobs"] == 1 and unlimited["projected_held_device_hours"] == pytest.approx(one_job / 3600)


def test_the_script_shows_the_jobs_a_training_needs_and_refuses_hostile_limits(tmp_path):
    record = {**TIMED, "held_s": 40.0, "probe_s": 3.0, "window_seconds": [10.0, 6.0], "attempts": 1}
    paths = write_fixtures(tmp_path, [windows_run("1x1", **record)])
    limits = '{"1x1": {"limit_s": 1800, "signal_s": 0}}'
    proc = run_report(paths, tmp_path / "out", "--job-limits", limits)
    assert proc.returncode == 0, proc.stderr
    assert pd.read_csv(tmp_path / "out/projection.tsv", sep="\t").loc[0, "jobs"] == 3
    html = (tmp_path / "out/report.html").read_text()
    assert "Jobs (time limit)" in html and "3 (30 min)" in html and "in 3 jobs of the 30 min time limit" in html
    for hostile in ('{"1x1": {"limit_s": 1800}}', '{"1x1": {"limit_s": -5, "signal_s": 0}}',
                    '{"1x1": {"limit_s": 100, "signal_s": 100}}', '{"1x1": {"limit_s": NaN, "signal_s": 0}}',
                    '{"1x1": {"limit_s": 1e400, "signal_s": 0}}', '[1800]', '$(reboot)',
                    '{"1x1": {"limit_s": true, "signal_s": 0}}', '{"1x1": {"limit_s": 60, "signal_s": 0, "x": 1}}'):
        with pytest.raises(ValueError, match="--job-limits"):
            projection.parse_limits(hostile)
    proc = run_report(paths, tmp_path / "bad", "--job-limits", "{\"1x1\": 5}")
    assert proc.returncode == 2 and "--job-limits" in proc.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "bad").exists()
