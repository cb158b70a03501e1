"""The report's words as a reader compares them: one number rounded one way everywhere, column
headers that say which epoch they time, and notes that say a thing once."""
import pandas as pd

from helpers.records import make_run, probe
from ddpscale.report import reportdata
from ddpscale.report.render import html_tables
from ddpscale.report.render import html as report_html

# 1x2 at 1.96x: rounded to one place it read 2.0x in the headline, 1.96x in the table
RUNS = [make_run("1x1"), make_run("1x2", throughput_samples_s=196.0)]
PROBE_METHOD = ("20 training steps (forward, backward, optimizer step) per block, {how}, 5 rounds; "
                "per micro-batch median over rounds, slowest rank; data wait: median over 20 "
                "batches drawn from the run's train dataloader and moved to the device")


def build(runs=RUNS, probes=None):
    return reportdata.build(pd.DataFrame(runs), probes or {}, baseline="1x1", metric="test_acc",
                            tolerance=0.02, threshold=0.8, expected=[], repeats=1, log_tails={})


def test_speedup_is_rounded_the_same_in_verdict_headline_and_table():
    data = build()
    _, _, table = html_tables.scaling_table(data)
    page = report_html.build_report(data, {})
    said = "1.96x (1.93\u20131.99)"  # the figure and its interval, in the digits the interval supports
    assert said in data.recommendation
    assert f"reached {said} speedup" in report_html.headline(data.finished, data.comparison)
    assert f">{said}<" in table
    assert "2.0x" not in page


def test_time_per_epoch_says_it_is_the_steady_state_epoch():
    _, note, table = html_tables.scaling_table(build())
    assert "Time / steady epoch" in table and "Time / epoch" not in table
    assert "time per steady epoch (the mean epoch, training + validation) leave out the first 1 warm-up" in note


def test_breakdown_note_gives_the_probe_method_once():
    one = probe("1x1", 1, 0.001, 0.006, 0.0, 0.0)
    two = probe("1x2", 2, 0.0005, 0.006, 0.001, 0.001)
    one["step"]["method"] = PROBE_METHOD.format(how="one rank, no DDP")
    two["step"]["method"] = PROBE_METHOD.format(
        how="DDP no_sync() (no gradient all-reduce) vs with gradient all-reduce, alternating")
    runs = [make_run("1x1", batch_per_device=64, throughput_samples_s=6400.0),
            make_run("1x2", batch_per_device=32, throughput_samples_s=6000.0)]
    _, note, _ = html_tables.breakdown_table(build(runs, {"1x1": one, "1x2": two}))
    for clause in ("(forward, backward, optimizer step)", "slowest rank", "data wait"):
        assert note.count(clause) == 1, clause
    assert "alternating, 5 rounds" in note and "For one device: one rank, no DDP." in note


def test_methods_define_cost_per_sample_and_both_device_hours():
    # the methods said "time speedup = fit time(base) / fit time" and counted device-hours from
    # epochs only, beside a cost table that no longer does either
    page = report_html.build_report(build(), {})
    assert "only where both runs trained the same samples" in page
    assert "Cost per sample</b> = world size / steady-state throughput" in page
    assert "held device-hours</b> = the time the job held its devices" in page
