"""The report says when a number cannot mean what it seems: oversubscribed CPU runs, nodes
simulated on one host, an overhead-bound workload, repeated recompilation, and it refuses to
mix GPU and CPU runs. Unit tests on summaries built like test_verdict's, then one end-to-end."""
import json
from markupsafe import escape

import pandas as pd
import pytest

from helpers.records import compared, make_run, probe, summarize
from helpers.report import _assert_one_line_error, run_report, write_fixtures
from ddpscale.report import reportdata
from ddpscale.report.figures import boundness, scaling
from ddpscale.report.render import html as report_html
from ddpscale.report.verdict import caveats, recommendation

OVER = dict(usable_cores=2, hosts=["node0"])  # every rank on one host with 2 usable cores
GPU = dict(device_kind="cuda", device_name="NVIDIA H100", simulated=False, backend="nccl")


def summary_of(runs, expected=None):
    s = summarize(runs)
    s = scaling.add_missing(s, expected or list(s["topology"]), 1, {})
    return caveats.add_caveats(s)


def build(runs, probes=None):
    return reportdata.build(pd.DataFrame(runs), probes or {}, baseline="1x1", metric="test_acc",
                            tolerance=0.02, threshold=0.8, expected=[], repeats=1, log_tails={})


# --- runs with nothing to flag say nothing -------------------------------------------------------

def test_runs_with_nothing_to_flag_say_nothing():
    runs = [make_run("1x1"), make_run("1x2", throughput_samples_s=190.0)]
    s = summary_of(runs)
    assert s["oversubscribed"].eq(False).all() and s["usable_cores"].eq(64).all()
    assert s["compile_recompiles"].isna().all()  # counted only with torch.compile
    assert s["simulated_nodes_on_one_host"].eq(False).all()
    assert s["caveats"].eq("").all()
    data = build(runs)
    assert [note.split(":")[0] for note in data.notes] == ["Accuracy not tested in 1x2"]
    assert "1x2" in data.recommendation


# --- 1. oversubscribed -------------------------------------------------------------------------

OVER_RUNS = [make_run("1x1", oversubscribed=False, **OVER),
             make_run("1x2", throughput_samples_s=180.0, oversubscribed=False, **OVER),
             make_run("1x4", throughput_samples_s=390.0, oversubscribed=True, **OVER)]


def test_oversubscribed_row_is_marked_and_never_recommended():
    s = summary_of(OVER_RUNS)
    row = s.set_index("topology").loc["1x4"]
    assert bool(row["oversubscribed"]) and row["ranks_per_host"] == 4 and row["usable_cores"] == 2
    assert row["caveats"] == "oversubscribed: 4 ranks on 2 cores"
    comparison = compared(OVER_RUNS)[1]
    assert list(recommendation.usable(s, comparison)["topology"]) == ["1x1", "1x2"]
    text = recommendation.recommendation(s, comparison, 0.8)
    # 1x4 is the fastest by throughput; it measured contention, so 1x2 is named instead
    assert "1x4" not in text and "the fastest is 1x2" in text


def test_oversubscribed_note_names_topologies_why_and_the_fix():
    note = caveats.oversubscribed_note(summary_of(OVER_RUNS))
    assert note == ("Left out of the recommendation: 1x4 (oversubscribed: 4 ranks on 2 cores). "
                    "With more ranks on a host than usable cores, the ranks took turns on the same "
                    "cores, so their numbers measure contention, not scaling. To measure them, run "
                    "at most as many ranks per host as it has usable cores (2 here), or use a "
                    "machine with more cores.")
    assert caveats.oversubscribed_note(summary_of(OVER_RUNS[:2])) is None


def test_only_oversubscribed_rows_left_means_nothing_to_recommend():
    runs = [make_run("1x1", oversubscribed=True, usable_cores=0, hosts=["node0"])]
    text = recommendation.recommendation(summary_of(runs), compared(runs)[1], 0.8)
    assert text.endswith("no topology finished with accuracy held on enough cores, so there is "
                         "nothing to recommend")


# --- 2. nodes simulated on one host ------------------------------------------------------------

def test_simulated_nodes_are_labelled():
    runs = [make_run("1x1"),
            make_run("2x1", throughput_samples_s=170.0, simulated_nodes_on_one_host=True, hosts=["h"]),
            make_run("2x2", throughput_samples_s=300.0, simulated_nodes_on_one_host=True, hosts=["h"])]
    s = summary_of(runs)
    assert s["simulated_nodes_on_one_host"].tolist() == [False, True, True]
    assert [caveats.label(r) for _, r in s.iterrows()] == [
        "1x1", "2x1 (nodes simulated on one host: no network crossed)",
        "2x2 (nodes simulated on one host: no network crossed)"]
    note = caveats.simulated_nodes_note(s)
    assert note.startswith("Nodes simulated on one host in 2x1 and 2x2: their traffic between "
                           "nodes stayed inside that host")
    assert "crossed no network" in note
    real = summary_of([make_run("1x1"), make_run("2x2", throughput_samples_s=300.0)])
    assert caveats.simulated_nodes_note(real) is None


# --- 3. overhead-bound -------------------------------------------------------------------------

@pytest.mark.parametrize("share, util, bound", [
    (0.2, None, True), (0.49, None, True), (0.5, None, False), (0.9, None, False),
    (None, 30.0, True), (None, 50.0, False), (0.9, 20.0, True), (None, None, None)])
def test_boundness_thresholds(share, util, bound):
    assert boundness.COMPUTE_SHARE_MIN == 0.5 and boundness.GPU_UTILIZATION_MIN_PCT == 50.0
    judged = boundness.Boundness(compute_share=share, gpu_utilization_pct=util)
    assert judged.overhead_bound is bound
    assert (boundness.sentence(judged) is not None) is bool(bound)


def test_overhead_bound_from_the_probe_breakdown():
    # baseline step 10 ms (64 / 6400 samples/s), probe compute 2 ms: 20% of the step
    data = build([make_run("1x1", batch_per_device=64, throughput_samples_s=6400.0)],
                 {"1x1": probe("1x1", 1, 0.001, 0.002, 0.0, 0.0)})
    assert data.notes == [
        "This workload is overhead-bound (compute is 20% of the baseline's step), so its scaling "
        "measures framework and launch overhead, not the CPU-simulated devices. For a "
        "compute-bound workload, run the transformer (a GPT-2-small-like decoder): add "
        "--configfile config/transformer.yaml to the snakemake command."]
    compute_bound = build([make_run("1x1", batch_per_device=64, throughput_samples_s=6400.0)],
                          {"1x1": probe("1x1", 1, 0.001, 0.008, 0.0, 0.0)})
    assert compute_bound.notes == []


def test_overhead_bound_from_gpu_utilisation():
    runs = [make_run("1x1", gpu_utilization_pct=20.0, repeat=0, **GPU),
            make_run("1x1", gpu_utilization_pct=30.0, repeat=1, **GPU),
            make_run("1x2", gpu_utilization_pct=90.0, throughput_samples_s=190.0, **GPU)]
    notes = [n for n in build(runs).notes if not n.startswith("Accuracy not tested")]  # one seed
    assert notes == [
        "This workload is overhead-bound (GPU utilisation 25% in steady training), so its scaling "
        "measures framework "
        "and launch overhead, not the GPUs. For a compute-bound workload, run the transformer "
        "(a GPT-2-small-like decoder): add --configfile config/transformer.yaml to the snakemake "
        "command."]
    busy = [{**r, "gpu_utilization_pct": 95.0} for r in runs]
    assert [n for n in build(busy).notes if not n.startswith("Accuracy not tested")] == []


def test_the_transformer_itself_is_told_to_grow_not_pointed_to_itself():
    runs = [make_run("1x1", gpu_utilization_pct=20.0, model_class="ddpscale.workloads.transformer.TransformerLM",
                     **GPU)]
    [note] = build(runs).notes
    assert "transformer.yaml" not in note and "Raise the batch per device or the model size" in note


# --- 4. recompilation --------------------------------------------------------------------------

def test_recompiles_more_than_once_are_named_with_their_cost():
    runs = [make_run("1x1", compile="default", compile_recompiles=1),
            make_run("1x2", compile="default", compile_recompiles=3, throughput_samples_s=180.0,
                     compile_recompile_reasons=["tensor 'x' size mismatch at index 0. expected 32, actual 8"]),
            make_run("1x2", repeat=1, compile="default", compile_recompiles=2, throughput_samples_s=180.0)]
    s = summary_of(runs)
    assert s.set_index("topology")["compile_recompiles"].tolist() == [1, 3]
    note = caveats.recompile_note(s, pd.DataFrame(runs))
    assert note == (
        "torch.compile recompiled more than once in 1x2 (3 times). The first reason recorded: "
        "tensor 'x' size mismatch at index 0. expected 32, actual 8. Each recompilation ran "
        "inside the training epochs: its compile time counts in the fit time, and in the "
        "throughput when it came after the warm-up epoch(s), so their numbers understate what "
        "the compiled code can do. Static shapes avoid it: every batch the same size "
        "(drop_last=True) and no Python values that change from step to step.")
    once = summary_of([make_run("1x1", compile_recompiles=1), make_run("1x2", compile_recompiles=0)])
    assert caveats.recompile_note(once) is None


# --- 5. GPU and CPU runs never mix -------------------------------------------------------------

def test_gpu_and_cpu_runs_are_refused_naming_each_kind():
    runs = [make_run("1x1", **GPU), make_run("1x2", **GPU), make_run("2x2")]
    with pytest.raises(ValueError) as err:
        scaling.compare(pd.DataFrame(runs), "1x1", "test_acc", 0.02)
    assert str(err.value) == (
        "the runs mix GPU and CPU devices (GPU: 1x1, 1x2; CPU: 2x2), and a speedup across them "
        "would compare different hardware; rerun with one accelerator: delete the stale "
        "results/<experiment>/runs/<topology> folders of the kind you do not want and run the workflow again")


def test_mixed_runs_exit_2_with_one_line(tmp_path):
    """The fix names the experiment's own runs folder, where the workflow wrote them."""
    paths = []
    for run in [make_run("1x1", **GPU), make_run("1x2")]:
        path = tmp_path / "results/myexp/runs" / run["topology"] / "r0/metrics.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(run))
        paths.append(path)
    proc = run_report(paths, tmp_path / "out")
    _assert_one_line_error(proc, "mix GPU and CPU devices (GPU: 1x1; CPU: 1x2)",
                           f"delete the stale {tmp_path}/results/myexp/runs/<topology> folders")
    assert not (tmp_path / "out").exists()


# --- end to end through scripts/report.py ------------------------------------------------------

def test_report_shows_every_caveat(tmp_path):
    common = dict(usable_cores=2, compile="default", compile_graphs=2, compile_graph_breaks=0,
                  batch_per_device=64)
    runs = [make_run("1x1", throughput_samples_s=6400.0, oversubscribed=False,
                     simulated_nodes_on_one_host=False, compile_recompiles=0, **common),
            make_run("1x2", throughput_samples_s=11000.0, oversubscribed=False,
                     simulated_nodes_on_one_host=False, compile_recompiles=4, **common),
            make_run("2x1", throughput_samples_s=10000.0, oversubscribed=False,
                     simulated_nodes_on_one_host=True, hosts=["h"], compile_recompiles=0, **common),
            make_run("2x2", throughput_samples_s=12000.0, oversubscribed=True,
                     simulated_nodes_on_one_host=True, hosts=["h"], compile_recompiles=0, **common)]
    runs[0]["probe"] = probe("1x1", 1, 0.001, 0.002, 0.0, 0.0)
    proc = run_report(write_fixtures(tmp_path, runs), tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    assert "note: Left out of the recommendation: 2x2" in proc.stdout

    tsv = pd.read_csv(tmp_path / "out" / "scaling.tsv", sep="\t", keep_default_na=False)
    for col in ("oversubscribed", "usable_cores", "ranks_per_host", "simulated_nodes_on_one_host",
                "compile_recompiles", "device_kind", "caveats"):
        assert col in tsv.columns, col
    t = tsv.set_index("topology")
    assert t["oversubscribed"].to_dict() == {"1x1": False, "1x2": False, "2x1": False, "2x2": True}
    assert t["simulated_nodes_on_one_host"].to_dict() == {"1x1": False, "1x2": False,
                                                          "2x1": True, "2x2": True}
    assert t.loc["2x2", "usable_cores"] == 2 and t.loc["2x2", "ranks_per_host"] == 4
    assert t.loc["2x2", "caveats"] == ("oversubscribed: 4 ranks on 2 cores; "
                                       "nodes simulated on one host: no network crossed")
    assert t.loc["1x1", "caveats"] == ""

    page = (tmp_path / "out" / "report.html").read_text()
    verdict_html = page[page.index('<section id="verdict">'):page.index('<details class="section"')]
    # 2x2 has the highest throughput; it is not the recommendation
    assert "the fastest is 1x2" in verdict_html
    assert escape("Left out of the recommendation: 2x2 (oversubscribed: 4 ranks on 2 cores).") in verdict_html
    assert "measure contention, not scaling" in verdict_html
    assert "Nodes simulated on one host in 2x1 and 2x2" in verdict_html
    assert escape("This workload is overhead-bound (compute is 20% of the baseline's step)") in verdict_html
    assert "<code>--configfile config/transformer.yaml</code>" in verdict_html
    assert "torch.compile recompiled more than once in 1x2 (4 times)." in verdict_html
    tables = page[page.index('<details class="section"'):page.index('id="what-was-measured"')]
    scaling = tables[:tables.index("<h2>Cost</h2>")]
    assert 'class="caveat-row"' in scaling
    assert "oversubscribed: 4 ranks on 2 cores: excluded" in scaling
    assert '2x1 <span class="caveat tag">(nodes simulated on one host: no network crossed)</span>' in scaling
    devices = tables[tables.index("<h2>Devices</h2>"):]
    assert ("2x2 (oversubscribed: 4 ranks on 2 cores; nodes simulated on one host: no network "
            "crossed)") in devices
    assert "2x1 (nodes simulated on one host: no network crossed)" in devices
    assert ("torch.compile default (2 graph(s), 0 graph break(s), 0, 4 recompilation(s) per run)"
            in page)


def test_gpu_page_with_caveats_never_says_cpu_simulated():
    runs = [make_run("1x1", gpu_utilization_pct=20.0, **GPU),
            make_run("2x1", gpu_utilization_pct=20.0, simulated_nodes_on_one_host=True,
                     hosts=["h"], throughput_samples_s=150.0, **GPU)]
    page = report_html.build_report(build(runs), {})
    assert "CPU-simulated" not in page
    assert "not the GPUs" in page
    assert "2x1 (nodes simulated on one host: no network crossed)" in page
