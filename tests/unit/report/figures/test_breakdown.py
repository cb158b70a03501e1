"""Time breakdown and prediction (ddpscale.report.figures.breakdown) on fixed summaries and probe records."""
import pandas as pd
import pytest

from helpers.records import NO_OPTIMIZER, make_run, na_probe, probe, summary
from ddpscale.report.figures import breakdown


def base_probe(**kw):
    """The baseline's probe (64 per device, 6 ms compute), its compute also timed at 32: 3 ms."""
    return probe("1x1", 1, 0.001, 0.006, 0.0, 0.0, timed={32: 0.003, 64: 0.006}, **kw)


# Strong scaling, global batch 64: the baseline's step takes 64 / 6400 = 10 ms.
BASE = make_run("1x1", batch_per_device=64, throughput_samples_s=6400.0)


def test_fractions_add_up_and_overhead_is_the_unprobed_rest():
    s = summary(BASE)
    steps = breakdown.breakdown(s, {"1x1": probe("1x1", 1, 0.001, 0.006, 0.0, 0.0)})
    row = steps.iloc[0]
    assert row.train_step_s == pytest.approx(0.010)
    assert row.overhead_s == pytest.approx(0.003)
    assert sum(row[f"{t}_frac"] for t in breakdown.TERMS) == pytest.approx(1.0)
    assert row.compute_frac == pytest.approx(0.6)


def test_probe_slower_than_training_scales_to_the_probed_total():
    s = summary(BASE)
    row = breakdown.breakdown(s, {"1x1": probe("1x1", 1, 0.004, 0.008, 0.0, 0.0)}).iloc[0]
    assert row.overhead_s == 0 and row.step_s == pytest.approx(0.012)
    assert row.data_frac + row.compute_frac == pytest.approx(1.0)


def test_perfect_halving_is_predicted_and_agrees():
    # 1x2: half the batch per device, compute halves, all-reduce 1 ms; measured exactly that.
    two = make_run("1x2", batch_per_device=32, throughput_samples_s=64 / 0.0075)
    s = summary(BASE, two)
    probes = {"1x1": base_probe(), "1x2": probe("1x2", 2, 0.0005, 0.003, 0.001, 0.001)}
    row = breakdown.predict(s, probes, "1x1").set_index("topology").loc["1x2"]
    # predicted step: 0.5 + 3 + 1 + 3 (the baseline's overhead) = 7.5 ms; speedup 10/7.5 over 2 devices
    assert row.predicted_step_s == pytest.approx(0.0075)
    assert row.unexplained_s == pytest.approx(0.0, abs=1e-12)
    assert row.predicted_efficiency == pytest.approx(10 / 7.5 / 2)
    assert row.measured_efficiency == pytest.approx(row.predicted_efficiency)
    # compute 3 ms of 7.5 and overhead 3: compute comes first among equals
    assert row.explanation == ("prediction and measurement agree (unexplained: 0.00 ms, 0% of the step, "
                               "within 10%); compute (forward + backward + optimizer) "
                               "is the largest term (40% of the predicted step)")


def test_compute_that_does_not_shrink_is_named():
    two = make_run("1x2", batch_per_device=32, throughput_samples_s=64 / 0.0105)
    s = summary(BASE, two)
    probes = {"1x1": base_probe(), "1x2": probe("1x2", 2, 0.0005, 0.006, 0.001, 0.001)}
    row = breakdown.predict(s, probes, "1x1").set_index("topology").loc["1x2"]
    assert row.predicted_step_s == pytest.approx(0.0075) and row.step_error == pytest.approx(7.5 / 10.5 - 1)
    assert row.explanation.startswith("unexplained: 3.00 ms, 29% of the step, beyond 10%; "
                                      "compute (forward + backward + optimizer) is off: 6.00 ms")
    assert "2.0x" in row.explanation and "slower than the baseline's at the same batch" in row.explanation
    assert "linearly" not in row.explanation, "the baseline timed its compute at 32"


def test_hidden_communication_is_named():
    two = make_run("1x2", batch_per_device=32, throughput_samples_s=64 / 0.0066)
    s = summary(BASE, two)
    probes = {"1x1": base_probe(), "1x2": probe("1x2", 2, 0.0005, 0.003, 0.0001, 0.003)}
    row = breakdown.predict(s, probes, "1x1").set_index("topology").loc["1x2"]
    assert row.explanation.startswith("unexplained: -2.90 ms, -44% of the step, beyond 10%; "
                                      "exposed gradient communication is off")
    assert "hid part of the all-reduce" in row.explanation


def test_topology_without_probe_or_baseline_probe_is_left_out():
    two = make_run("1x2", batch_per_device=32, throughput_samples_s=9000.0)
    s = summary(BASE, two)
    assert list(breakdown.breakdown(s, {"1x2": probe("1x2", 2, 0, 0.003, 0, 0.001)}).topology) == ["1x2"]
    assert breakdown.predict(s, {"1x2": probe("1x2", 2, 0, 0.003, 0, 0.001)}, "1x1").empty


def test_a_broken_probe_names_the_run_it_is_in():
    runs = pd.DataFrame([{"topology": "1x2", "repeat": 0, "source": "m.json", "probe": {"topology": "1x2"}}])
    with pytest.raises(ValueError, match="m.json, probe: missing key 'world_size'"):
        breakdown.probes_in_runs(runs)


@pytest.mark.parametrize("key", breakdown.STEP_KEYS)
def test_a_probe_without_a_step_figure_the_prediction_reads_is_refused_naming_it(key):
    record = probe("1x2", 2, 0.0005, 0.003, 0.001, 0.001)
    del record["step"][key]
    runs = pd.DataFrame([{"topology": "1x2", "repeat": 0, "source": "m.json", "probe": record}])
    with pytest.raises(ValueError, match=f"m.json, probe: missing key 'step.{key}'; rerun its probe"):
        breakdown.probes_in_runs(runs)


def accumulating(record, k):
    record["step"]["accumulate_grad_batches"] = k
    return record


@pytest.mark.parametrize("k", [1, 4])
def test_predicted_comm_is_one_allreduce_per_k_batches(k):
    # 1x2 with accumulate_grad_batches k: DDP all-reduces the 4 ms gradient once per k batches,
    # and the probe (timing steps as Lightning runs them) saw exactly that exposed per batch.
    per_batch = 0.004 / k
    two = make_run("1x2", batch_per_device=32, throughput_samples_s=64 / (0.0035 + per_batch + 0.003))
    s = summary(BASE, two)
    probes = {"1x1": accumulating(base_probe(), k),
              "1x2": accumulating(probe("1x2", 2, 0.0005, 0.003, per_batch, 0.004), k)}
    row = breakdown.predict(s, probes, "1x1").set_index("topology").loc["1x2"]
    assert row.comm_predicted_s == pytest.approx(per_batch)
    assert row.comm_measured_s == pytest.approx(per_batch)
    assert row.predicted_step_s == pytest.approx(0.0005 + 0.003 + per_batch + 0.003)
    assert row.explanation.startswith("prediction and measurement agree (unexplained: 0.00 ms")


def test_a_failed_probe_keeps_its_row_with_every_probed_term_unknown():
    two = make_run("1x2", batch_per_device=32, throughput_samples_s=64 / 0.0075)
    s = summary(BASE, two)
    probes = {"1x1": probe("1x1", 1, 0.001, 0.006, 0.0, 0.0), "1x2": na_probe("1x2", 2)}
    steps = breakdown.breakdown(s, probes).set_index("topology")
    assert list(steps.index) == ["1x1", "1x2"]
    assert steps.loc["1x1", "probe"] == "ok" and steps.loc["1x1", "compute_s"] == pytest.approx(0.006)
    row = steps.loc["1x2"]
    assert row.probe == f"n/a (probe failed: {NO_OPTIMIZER})"
    assert all(pd.isna(row[f"{t}_{unit}"]) for t in breakdown.TERMS for unit in ("s", "frac")) and pd.isna(row.step_s)
    assert row.train_step_s == pytest.approx(0.0075), "what the training run measured is still known"
    pred = breakdown.predict(s, probes, "1x1").set_index("topology")
    assert pred.loc["1x2", "explanation"] == row.probe
    assert pd.isna(pred.loc["1x2", "predicted_efficiency"]) and pd.isna(pred.loc["1x2", "comm_measured_s"])
    assert pred.loc["1x2", "measured_efficiency"] == pytest.approx(10 / 7.5 / 2)
    assert pred.loc["1x1", "explanation"] == "the baseline"


def test_a_failed_baseline_probe_leaves_every_prediction_unknown():
    two = make_run("1x2", batch_per_device=32, throughput_samples_s=64 / 0.0075)
    s = summary(BASE, two)
    probes = {"1x1": na_probe("1x1", 1, "ValueError: boom (in drawing batches)"),
              "1x2": probe("1x2", 2, 0.0005, 0.003, 0.001, 0.001)}
    pred = breakdown.predict(s, probes, "1x1").set_index("topology")
    assert list(pred.index) == ["1x1", "1x2"] and pred.predicted_efficiency.isna().all()
    assert set(pred.explanation) == {"n/a (the baseline's probe failed: ValueError: boom (in drawing batches))"}
    # the topology's own probe still gives its breakdown
    assert breakdown.breakdown(s, probes).set_index("topology").loc["1x2", "probe"] == "ok"


def test_a_probe_needs_its_status_and_an_na_one_its_reason():
    unstamped = probe("1x2", 2, 0.0005, 0.003, 0.001, 0.001)
    del unstamped["status"]
    with pytest.raises(ValueError, match="m.json, probe: missing key 'status'"):
        breakdown.probes_in_runs(pd.DataFrame([{"topology": "1x2", "repeat": 0, "source": "m.json",
                                                "probe": unstamped}]))
    runs = pd.DataFrame([{"topology": "1x2", "repeat": 0, "source": "m.json", "probe": na_probe("1x2", 2)}])
    assert breakdown.probes_in_runs(runs)["1x2"]["status"] == "n/a"
    runs.at[0, "probe"] = {"topology": "1x2", "world_size": 2, "status": "n/a"}
    with pytest.raises(ValueError, match="m.json, probe: missing key 'reason'"):
        breakdown.probes_in_runs(runs)


def test_a_step_bound_by_communication_is_named_when_prediction_agrees():
    """A slow link: the all-reduce (8 ms) outweighs the rest of the step (3.5 + 3 ms), and the
    agreeing prediction says so (what the network test on the SLURM cluster reads)."""
    two = make_run("2x1", batch_per_device=32, throughput_samples_s=64 / 0.0145)
    s = summary(BASE, two)
    probes = {"1x1": base_probe(), "2x1": probe("2x1", 2, 0.0005, 0.003, 0.008, 0.008)}
    row = breakdown.predict(s, probes, "1x1").set_index("topology").loc["2x1"]
    assert row.explanation == ("prediction and measurement agree (unexplained: 0.00 ms, 0% of the step, "
                               "within 10%); exposed gradient communication is the "
                               "largest term (55% of the predicted step)")
