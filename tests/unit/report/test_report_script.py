"""End-to-end tests of scripts/report.py on fixture metrics files."""
import re
from markupsafe import escape

import pandas as pd
import pytest

from helpers.records import make_run
from helpers.report import OUTPUTS, PDFS, PNGS, SVGS, _assert_one_line_error, probed_runs, run_report, write_fixtures
from ddpscale.report import reportdata
from ddpscale.report.figures import scaling, timetoacc
from ddpscale.report.load import description
from ddpscale.report.render import html as report_html

BANNER = ("These runs used CPU processes standing in for GPUs (gloo backend). "
          "They check the pipeline, not GPU performance; do not read them as GPU results.")


# three repeats (seeds) each, so "accuracy held" is a test (report.figures.accuracy)
SIM_RUNS = [
    make_run("1x1", repeat=0, throughput_samples_s=100.0, fit_time_s=400.0),
    make_run("1x1", repeat=1, throughput_samples_s=110.0, fit_time_s=380.0),
    make_run("1x1", repeat=2, throughput_samples_s=105.0, fit_time_s=390.0),
    *(make_run("1x2", repeat=r, throughput_samples_s=190.0, fit_time_s=210.0, test_acc=0.89) for r in range(3)),
    make_run("2x2", throughput_samples_s=310.0, fit_time_s=130.0, test_acc=0.85,
             hosts=["<evil>host", "node1"], resumed_from_epoch=1, attempts=2),
    *(make_run("2x2", repeat=r, throughput_samples_s=310.0, fit_time_s=130.0, test_acc=0.85,
               hosts=["<evil>host", "node1"]) for r in (1, 2)),
]


@pytest.fixture(scope="module")
def sim_report(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sim")
    proc = run_report(write_fixtures(tmp, SIM_RUNS), tmp / "report")
    assert proc.returncode == 0, proc.stderr
    return tmp / "report"


def test_all_outputs_written(sim_report):
    for name in OUTPUTS:
        assert (sim_report / name).stat().st_size > 0, name
    for name in PNGS:
        assert (sim_report / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for name in SVGS:  # beside the report, for papers: words as text, not outlines
        assert "<svg" in (sim_report / name).read_text() and "<text" in (sim_report / name).read_text()
    for name in PDFS:  # test_plots checks their fonts
        assert (sim_report / name).read_bytes()[:5] == b"%PDF-"
    # no temp files left behind by the atomic writes
    assert sorted(p.name for p in sim_report.iterdir()) == sorted(OUTPUTS)


def test_every_figure_links_its_svg_and_pdf_beside_the_page(sim_report):
    page = (sim_report / "report.html").read_text()
    lines = re.findall(r'<span class="files">(.*?)</span></figcaption>', page)
    assert len(lines) == len(SVGS)  # the overview and each plot
    linked = [name for line in lines for name in re.findall(r'<a href="([^"]+)"', line)]
    assert sorted(linked) == sorted(SVGS + PDFS)  # by relative name: files in the page's folder


def test_scaling_tsv_values(sim_report):
    tsv = pd.read_csv(sim_report / "scaling.tsv", sep="\t")
    assert list(tsv.columns) == ["topology", *description.COLUMNS, *scaling.SUMMARY_COLUMNS[1:]] + [
        "test_acc", "accuracy_delta", "accuracy_held", "accuracy_test", "accuracy_bound", "accuracy_detectable"] + list(
        scaling.SPREAD_COLUMNS) + list(scaling.COMPUTE_COLUMNS) + list(
        scaling.CAVEAT_COLUMNS) + list(scaling.MEASURE_COLUMNS) + list(scaling.INTERVAL_COLUMNS) + [
        "status", "caveats", *timetoacc.FINAL_COLUMNS]
    # what was measured, on every row (runs without the workflow's flags say unknown)
    assert set(tsv["model_class"]) == {"M"} and set(tsv["experiment"]) == {"unknown"}
    assert tsv["topology"].tolist() == ["1x1", "1x2", "2x2"]
    t = tsv.set_index("topology")
    assert t.loc["1x1", "repeats"] == 3
    assert t.loc["1x1", "throughput_samples_s"] == pytest.approx(105.0)
    # figures to the digits their interval supports, as the tables write them: 1x1's three repeats
    # spread 100-110, so every ratio over it is known to about ±15%: two places, a whole percent
    assert t.loc["1x2", "speedup"] == pytest.approx(round(190 / 105, 2))
    assert t.loc["2x2", "efficiency"] == pytest.approx(round(310 / 105 / 4, 2))
    assert t.loc["1x2", "speedup_low"] < t.loc["1x2", "speedup"] < t.loc["1x2", "speedup_high"]
    assert (t["interval_from"] == ["over repeats", "within run", "within run"]).all()
    assert t.loc["2x2", "gpu_hours"] == pytest.approx(round(130 * 4 / 3600, 6))
    assert t.loc["1x2", "accuracy_held"] == True  # noqa: E712  drop 0.01 <= 0.02
    assert t.loc["2x2", "accuracy_held"] == False  # noqa: E712  drop 0.05


def test_report_html_is_self_contained(sim_report):
    page = (sim_report / "report.html").read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*https?://""", page, re.I)
    assert "http://" not in page and "https://" not in page
    assert page.count('src="data:image/png;base64,') == 5
    assert BANNER in page
    assert "precision 32-true; torch.compile none." in page  # records from before compile existed
    assert "CPU-simulated devices" in page and "device-hours" in page
    assert 'class="held"' in page and 'class="failed"' in page and 'class="failed-row"' in page
    assert "<evil>" not in page and "&lt;evil&gt;host" in page
    assert "2x2 (4 CPU-simulated devices) reached 2.95x (2.54\u20133.43) speedup, 74% (63\u201386%) efficiency" in page
    assert "NOT held in 2x2" in page
    assert "How these numbers are computed" in page
    assert "fixed batch per device" in page and "first 1 warmup epoch(s)" in page


def test_gpu_report_has_no_banner(tmp_path):
    gpu = dict(device_kind="cuda", device_name="NVIDIA A100-SXM4-80GB",
               simulated=False, backend="nccl", scaling="strong", test_acc=None,
               achieved_tflops=24.96, mfu=0.08, precision="bf16-mixed", compile="default",
               compile_graphs=3, compile_graph_breaks=0, compile_recompiles=0, compile_recompile_reasons=[])
    runs = pd.DataFrame([make_run("1x1", **gpu),
                         make_run("1x4", throughput_samples_s=380.0, **gpu)])
    data = reportdata.build(runs, {}, baseline="1x1", metric="test_acc", tolerance=0.02,
                            threshold=0.8, expected=[], repeats=1, log_tails={})
    page = report_html.build_report(data, {"x.png": b"\x89PNG"})
    assert BANNER not in page and "CPU-simulated" not in page
    assert "GPU-hours" in page and "not logged" in page
    assert "1x4 (4 GPUs) reached 3.80x (3.76\u20133.84) speedup, 95% (94\u201396%) efficiency" in page
    assert "fixed global batch" in page
    assert ">MFU</th>" in page and "<td class=\"\">24.9600</td><td class=\"\">8.0%</td>" in page
    assert ("precision bf16-mixed; torch.compile default (3 graph(s), 0 graph break(s), 0 recompilation(s) per run)"
            in page)


def test_bad_metrics_file_exits_2(tmp_path):
    paths = write_fixtures(tmp_path, SIM_RUNS[:1])
    bad = tmp_path / "broken.json"
    bad.write_text("{truncated")
    proc = run_report([*paths, bad], tmp_path / "out")
    _assert_one_line_error(proc, "broken.json", "not valid JSON")
    assert not (tmp_path / "out" / "report.html").exists()


def test_a_file_name_with_escape_sequences_is_printed_escaped(tmp_path):
    paths = write_fixtures(tmp_path, SIM_RUNS[:1])
    bad = tmp_path / "broken\x1b[2J\r.json"
    bad.write_text("{truncated")
    proc = run_report([*paths, bad], tmp_path / "out")
    assert proc.returncode == 2 and "broken\\x1b[2J\\r.json" in proc.stderr, proc.stderr
    assert "\x1b" not in proc.stderr + proc.stdout and "\r" not in proc.stderr + proc.stdout


def test_broken_run_is_never_reported(tmp_path):
    paths = write_fixtures(tmp_path, [make_run("1x1"), make_run("2x2", world_size=3)])
    proc = run_report(paths, tmp_path / "out", "--baseline", "1x1")
    _assert_one_line_error(proc, "2x2", "world_size 3")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("accs, seeds, expected", [
    # held says its power: with no seed noise at all, the tolerance itself
    ([0.9, 0.9, 0.9], 3, "; accuracy held in all topologies (3 seeds each: a drop of 0.02 or more would have "
                         "shown, 80% power)"),
    ([0.9, None, 0.8], 3, "; accuracy (test_acc) NOT held in 2x2 (not logged in 1x2)"),
    ([0.9, None, 0.9], 3, "; accuracy held in all topologies where logged (3 seeds each: a drop of 0.02 or more "
                          "would have shown, 80% power) (not logged in 1x2)"),
    ([None, None, None], 3, "; accuracy not compared (test_acc not logged)"),
    # one seed: the recommendation says "accuracy not tested", once; the headline does not repeat it
    ([0.9, 0.9, 0.8], 1, ""),
    ([0.9, None, 0.8], 1, "; accuracy not logged in 1x2"),
])
def test_headline_accuracy_phrases(accs, seeds, expected):
    runs = pd.DataFrame([make_run(t, repeat=r, test_acc=a, throughput_samples_s=100.0 * i + 100)
                         for i, (t, a) in enumerate(zip(["1x1", "1x2", "2x2"], accs)) for r in range(seeds)])
    comparison = scaling.compare(runs, "1x1", "test_acc", 0.02)
    line = report_html.headline(scaling.summarize(runs, comparison), comparison)
    assert line == ("2x2 (4 CPU-simulated devices) reached 3.00x (2.96\u20133.04) speedup, 75% (74\u201376%) "
                    f"efficiency over 1x1{expected}")


def test_baseline_only_report(tmp_path):
    proc = run_report(write_fixtures(tmp_path, [make_run("1x1")]), tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    page = (tmp_path / "out" / "report.html").read_text()
    assert "Only the baseline 1x1 (1 CPU-simulated device) ran" in page
    assert page.count('src="data:image/png;base64,') == 5


def test_partial_report_marks_failed_and_missing_topologies(tmp_path):
    logs = tmp_path / "logs"
    (logs / "2x2").mkdir(parents=True)
    (logs / "2x2" / "r0.log").write_text("ddpscale train: training loss became non-finite\n")
    paths = write_fixtures(tmp_path, [SIM_RUNS[0], SIM_RUNS[1], SIM_RUNS[3]])  # 1x1 twice, 1x2 once
    proc = run_report(paths, tmp_path / "out", "--expected", "1x1", "1x2", "2x2", "4x2",
                      "--repeats", "2", "--log-dir", str(logs))
    assert proc.returncode == 0, proc.stderr
    tsv = pd.read_csv(tmp_path / "out" / "scaling.tsv", sep="\t").set_index("topology")
    assert tsv["status"].to_dict() == {
        "1x1": "ok", "1x2": "1 of 2 repeats finished",
        "2x2": "failed: ddpscale train: training loss became non-finite", "4x2": "not run"}
    page = (tmp_path / "out" / "report.html").read_text()
    assert page.count('class="missing-row"') == 2
    assert "Not complete: 1x2: 1 of 2 repeats finished; 2x2: failed" in page


def assert_breakdown_prediction_and_bandwidth(out):
    page = (out / "report.html").read_text()
    for heading in ("Where the time goes", "Predicted vs measured", "All-reduce at the gradient size"):
        assert f"<h2>{heading}</h2>" in page
    assert "compute (forward + backward + optimizer) is off: 6.00 ms per step measured" in page
    pred = pd.read_csv(out / "prediction.tsv", sep="\t").set_index("topology")
    assert pred.loc["1x2", "measured_efficiency"] < pred.loc["1x2", "predicted_efficiency"]


def test_probes_in_the_runs_give_breakdown_prediction_and_bandwidth(tmp_path):
    """The workflow's way: the first repeat's metrics.json carries its topology's probe."""
    runs, probes = probed_runs()
    for run in runs:
        run["probe"] = probes[run["topology"]]
    proc = run_report(write_fixtures(tmp_path, runs), tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    assert_breakdown_prediction_and_bandwidth(tmp_path / "out")


def test_a_failed_probe_shows_its_topology_with_the_terms_unknown(tmp_path):
    """A run whose probe was n/a trained anyway: its rows say so, and the plots leave it out."""
    from helpers.records import NO_OPTIMIZER, na_probe

    runs, probes = probed_runs()
    probes["1x2"] = na_probe("1x2", 2)
    for run in runs:
        run["probe"] = probes[run["topology"]]
    proc = run_report(write_fixtures(tmp_path, runs), tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    reason = f"n/a (probe failed: {NO_OPTIMIZER})"
    steps = pd.read_csv(tmp_path / "out/breakdown.tsv", sep="\t").set_index("topology")
    assert steps.loc["1x2", "probe"] == reason and steps.loc["1x2", ["data_s", "compute_s", "comm_s"]].isna().all()
    assert steps.loc["1x1", "probe"] == "ok" and steps.loc["1x1", "compute_s"] > 0
    pred = pd.read_csv(tmp_path / "out/prediction.tsv", sep="\t").set_index("topology")
    assert pred.loc["1x2", "explanation"] == reason and pd.isna(pred.loc["1x2", "predicted_efficiency"])
    page = (tmp_path / "out/report.html").read_text()
    assert page.count(escape(reason)) == 2, "the breakdown and the prediction tables name the reason"
    assert "<h2>All-reduce at the gradient size</h2>" not in page  # 1x2 measured no all-reduce


def test_compare_with_an_earlier_table(tmp_path, sim_report):
    paths = write_fixtures(tmp_path, [make_run("1x1", throughput_samples_s=210.0),
                                      make_run("1x2", throughput_samples_s=380.0)])
    proc = run_report(paths, tmp_path / "out", "--compare", str(sim_report / "scaling.tsv"))
    assert proc.returncode == 0, proc.stderr
    page = (tmp_path / "out" / "report.html").read_text()
    assert "<h2>Change since the earlier run</h2>" in page and "+100.0%" in page
    assert "only earlier" in page  # 2x2 ran before, not now


def test_missing_earlier_table_is_a_one_line_error(tmp_path):
    proc = run_report(write_fixtures(tmp_path, [make_run("1x1")]), tmp_path / "out",
                      "--compare", str(tmp_path / "nope.tsv"))
    _assert_one_line_error(proc, "nope.tsv", "report.compare_with")
