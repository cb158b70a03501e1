"""The whole workflow on the local profile, for real: training, report, reruns, user modules."""

from __future__ import annotations

import json
import shutil
import subprocess

import pandas as pd
import pytest
import yaml

from helpers.workflow import ROOT, WORKFLOW_PYTHON, job_counts, tiny_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]


def test_whole_workflow_then_rerun_only_the_deleted_run(workspace):
    workspace.write_config(tiny_config(topologies=["1x1", "1x2", "2x1"]))
    first = workspace.snakemake()
    assert first.returncode == 0, first.stderr[-4000:]
    # a job per stage's topology, each run's probe inside its job
    assert job_counts(first.stderr) == {"all": 1, "prepare_data": 1, "train_baseline": 1, "train_single_node": 1,
                                        "train_multi_node": 1, "report_scaling": 1}

    for topology, world, node_ranks in [("1x1", 1, [0]), ("1x2", 2, [0, 0]), ("2x1", 2, [0, 1])]:
        metrics = json.loads(workspace.metrics(topology).read_text())
        assert metrics["world_size"] == world and metrics["node_ranks"] == node_ranks
        assert metrics["simulated"] is True and metrics["slurm_job_id"] is None
        # every rank of the local launcher shares the job's cores
        assert metrics["oversubscribed"] is (world > metrics["usable_cores"]) and metrics["usable_cores"] >= 1

    # each rank of the simulated 2-node run records the interface gloo bound to: one of this host's
    import psutil

    ranks = json.loads(workspace.metrics("2x1").read_text())["transport"]
    assert [(r["rank"], r["backend"]) for r in ranks] == [(0, "gloo"), (1, "gloo")]
    iface = ranks[0]["interface"]
    assert iface in psutil.net_if_addrs() and ranks[1]["interface"] == iface
    assert json.loads(workspace.metrics("1x1").read_text())["transport"] is None  # one rank: no network

    report = workspace.results / "report"
    table = pd.read_csv(report / "scaling.tsv", sep="\t")
    assert list(table.topology) == ["1x1", "1x2", "2x1"]
    assert table.loc[table.topology == "2x1", "transport"].item() == f"gloo on {iface}"
    assert table.loc[table.topology == "1x1", "speedup"].item() == pytest.approx(1.0)
    html = (report / "report.html").read_text()
    assert "simulated" in html.lower() and html.count("data:image/png;base64,") == 5
    scaling = html.split('id="scaling"')[1]  # the decision table above it has a 2x1 row too
    row_2x1 = scaling.split('<td class="l">2x1')[1].split("</tr>")[0]  # the scaling table's row
    assert f'<span class="spread">gloo on {iface}</span>' in row_2x1
    # what was measured, in the page's head and on every row of scaling.tsv
    from ddpscale.workloads.models import SpiralMLP

    params = sum(p.numel() for p in SpiralMLP(**tiny_config()["model"]["init_args"]).parameters())
    assert json.loads(workspace.metrics("1x1").read_text())["model_parameters"] == params
    assert f"<h1>ddpscale: spiralmlp: SpiralMLP ({params:,} parameters) on SpiralDataModule</h1>" in html
    head = html.split('id="what-was-measured"')[1].split("</details>")[0]  # its own section
    for shown in ("ddpscale.workloads.models.SpiralMLP", "ddpscale.workloads.spiral_datamodule.SpiralDataModule",
                  "spiral (generated): 1200 samples, noise 0.2, seed 1234, split 0.7/0.15/0.15",
                  "config/config.yaml", "<dt>Epochs</dt><dd>2</dd>",
                  "<dd>strong</dd>", "<dd>64</dd>", "32-true"):
        assert shown in head, shown
    assert set(table["model_parameters"]) == {params} and set(table["experiment"]) == {"spiralmlp"}
    assert set(table["batch_size"]) == {64} and set(table["max_epochs"]) == {2}
    probe = json.loads(workspace.metrics("2x1").read_text())["probe"]
    assert probe["world_size"] == 2 and probe["allreduce"][-1]["bytes"] == probe["gradient_bytes"]
    assert probe["node_ranks"] == [0, 1], "the probe ran on the ranks that trained"
    # the baseline timed its compute at every per-device batch the topologies train with
    timed = json.loads(workspace.metrics("1x1").read_text())["probe"]["step"]["compute_by_batch"]
    assert [r["batch_per_device"] for r in timed] == [32, 64] and all(r["compute_s"] > 0 for r in timed)
    steps = pd.read_csv(report / "breakdown.tsv", sep="\t")
    assert list(steps.topology) == ["1x1", "1x2", "2x1"] and (steps.compute_s > 0).all()
    assert "<h2>Predicted vs measured</h2>" in html
    data_manifest = json.loads((workspace.results / "data/spiral/manifest.json").read_text())
    assert data_manifest["splits"] == {"train": 840, "val": 180, "test": 180}

    kept = {t: workspace.metrics(t).stat().st_mtime_ns for t in ("1x1", "2x1")}
    workspace.metrics("1x2").unlink()
    second = workspace.snakemake()
    assert second.returncode == 0, second.stderr[-4000:]
    assert job_counts(second.stderr) == {"all": 1, "train_single_node": 1, "report_scaling": 1}
    assert "wildcards: topology=1x2, repeat=0" in second.stderr
    assert {t: workspace.metrics(t).stat().st_mtime_ns for t in kept} == kept

    snakemake_report = workspace.snakemake("--report", "snakemake-report.html")
    assert snakemake_report.returncode == 0, snakemake_report.stderr[-4000:]
    assert (workspace.path / "snakemake-report.html").stat().st_size > 10_000


def test_corrupt_data_stops_before_any_job_and_keeps_finished_runs(workspace):
    workspace.write_config(tiny_config(topologies=["1x1", "1x2"]))
    assert workspace.snakemake("baseline").returncode == 0
    baseline = workspace.metrics("1x1").read_bytes()
    data = workspace.results / "data/spiral/data.npz"
    pristine = data.read_bytes()
    data.write_bytes(pristine[:-4] + b"oops")
    result = workspace.snakemake()
    assert result.returncode != 0
    assert "does not match its manifest checksum" in result.stderr
    assert workspace.metrics("1x1").read_bytes() == baseline
    assert not (workspace.results / "logs/train/1x2").exists(), "no job may start"

    # a missing dataset with finished runs also stops, naming the command that regenerates it
    shutil.rmtree(data.parent)
    result = workspace.snakemake()
    assert result.returncode != 0 and "is missing but 1 finished run(s) used it" in result.stderr
    fix = result.stderr.split("keep finished runs: ")[1].splitlines()[0]
    subprocess.run(fix, shell=True, cwd=workspace.path, check=True, capture_output=True)
    assert data.read_bytes() == pristine

    result = workspace.snakemake()
    assert result.returncode == 0, result.stderr[-4000:]
    assert data.read_bytes() == pristine
    assert job_counts(result.stderr) == {"all": 1, "train_single_node": 1, "report_scaling": 1}
    assert workspace.metrics("1x1").read_bytes() == baseline


def test_failing_runs_do_not_stop_the_others_and_rerun_alone(workspace):
    """keep-going: failed topologies leave the others to finish; the next run reruns only them."""
    workspace.write_config(tiny_config(topologies=["1x1", "1x2", "2x1"]))
    # Inside a (pretend) SLURM job the local launcher refuses multi-rank runs: a real failure
    # of 1x2 and 2x1, while the single-rank baseline needs no launcher and finishes.
    first = workspace.snakemake(env={"SLURM_JOB_ID": "4242"})
    assert first.returncode != 0
    assert workspace.metrics("1x1").exists()
    assert not workspace.metrics("1x2").exists() and not workspace.metrics("2x1").exists()
    assert "lacks site_launcher: srun" in (workspace.results / "logs/train/2x1/r0.log").read_text()
    kept = workspace.metrics("1x1").read_bytes()

    # the partial report is built from what finished; the failures are rows, not gaps
    partial = workspace.snakemake("partial_report")
    assert partial.returncode == 0, partial.stderr[-4000:]
    table = pd.read_csv(workspace.results / "report/partial/scaling.tsv", sep="\t")
    status = dict(zip(table.topology, table.status))
    assert status["1x1"] == "ok"
    for topology in ("1x2", "2x1"):
        assert status[topology].startswith("failed: ") and "srun" in status[topology]
    page = (workspace.results / "report/partial/report.html").read_text()
    assert page.count('class="missing-row"') == 2 and "Not complete: 1x2: failed" in page

    second = workspace.snakemake()
    assert second.returncode == 0, second.stderr[-4000:]
    assert job_counts(second.stderr) == {"all": 1, "train_single_node": 1, "train_multi_node": 1,
                                         "report_scaling": 1}
    assert workspace.metrics("1x1").read_bytes() == kept


def test_user_module_trained_through_config(workspace):
    shutil.copytree(ROOT / "tests/fixtures/usermods", workspace.path / "usermods")
    config = tiny_config(topologies=["1x1", "1x2"], dataset={"generator": "none"})
    config["model"] = {"class_path": "usermods.tiny.BlobsClassifier", "init_args": {"width": 6}}
    config["data"] = {"class_path": "usermods.tiny.BlobsData", "init_args": {"samples": 300}, "files": []}
    config["accuracy"] = {"metric": "val_acc", "tolerance": 0.5}
    workspace.write_config(config)
    result = workspace.snakemake()
    assert result.returncode == 0, result.stderr[-4000:]
    assert "prepare_data" not in job_counts(result.stderr)
    metrics = json.loads(workspace.metrics("1x2").read_text())
    assert metrics["model_class"] == "usermods.tiny.BlobsClassifier"
    assert metrics["world_size"] == 2 and metrics["test_acc"] is None
    assert 0.0 <= metrics["val_acc"] <= 1.0
    table = pd.read_csv(workspace.results / "report/scaling.tsv", sep="\t")
    assert "val_acc" in table.columns and len(table) == 2


def test_each_experiment_keeps_its_own_folder(workspace):
    """Another config (an overlay naming another model) never replaces this one's runs or report;
    the status command follows the config it is given; a config naming this folder for another
    workload is refused before any job instead of deleting the runs there to rerun them."""
    shutil.copytree(ROOT / "tests/fixtures/usermods", workspace.path / "usermods")
    workspace.write_config(tiny_config(topologies=["1x1"]))
    first = workspace.snakemake()
    assert first.returncode == 0, first.stderr[-4000:]
    assert "ddpscale: experiment spiralmlp: results in results/spiralmlp/" in first.stderr
    spiral = workspace.path / "results/spiralmlp"
    kept = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in spiral.rglob("*") if p.is_file()}
    assert spiral / "report/report.html" in kept and spiral / "runs/1x1/r0/metrics.json" in kept

    blobs = {"dataset": {"generator": "none"}, "accuracy": {"metric": "val_acc"},
             "model": {"class_path": "usermods.tiny.BlobsClassifier", "init_args": {"width": 6}},
             "data": {"class_path": "usermods.tiny.BlobsData", "init_args": {"samples": 300}}}
    (workspace.path / "blobs.yaml").write_text(yaml.safe_dump(blobs))
    second = workspace.snakemake("--configfile", "blobs.yaml")
    assert second.returncode == 0, second.stderr[-4000:]
    other = workspace.path / "results/blobsclassifier"
    record = json.loads((other / "runs/1x1/r0/metrics.json").read_text())
    assert record["model_class"] == "usermods.tiny.BlobsClassifier" and (other / "report/report.html").exists()
    # the two reports say which workload each measured
    titles = {folder: (folder / "report/report.html").read_text().split("<h1>")[1].split("</h1>")[0]
              for folder in (spiral, other)}
    assert titles[other] == f"ddpscale: blobsclassifier: BlobsClassifier ({record['model_parameters']:,} parameters) on BlobsData"
    assert titles[spiral].startswith("ddpscale: spiralmlp: SpiralMLP (")
    other_table = pd.read_csv(other / "report/scaling.tsv", sep="\t")
    assert set(other_table["config_files"]) == {"config/config.yaml + blobs.yaml"}
    assert set(other_table["dataset"]) == {"the data module's own (BlobsData: samples 300)"}
    assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in kept} == kept, "the first experiment was touched"

    def status(*args) -> str:
        done = subprocess.run([WORKFLOW_PYTHON, "scripts/status.py", *args], cwd=workspace.path,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout

    spiral_fit = json.loads((spiral / "runs/1x1/r0/metrics.json").read_text())["throughput_samples_s"]
    assert f"{spiral_fit:.1f} samples/s" in status()
    assert f"{record['throughput_samples_s']:.1f} samples/s" in status("--configfile", "blobs.yaml")

    (workspace.path / "clash.yaml").write_text(yaml.safe_dump({**blobs, "experiment": "spiralmlp"}))
    refused = workspace.snakemake("--dry-run", "--configfile", "clash.yaml")
    assert refused.returncode != 0
    message = [line for line in refused.stdout.splitlines() if "is a finished run of" in line]
    assert len(message) == 1 and "set `experiment:` to a new name" in message[0], refused.stdout[-2000:]
    assert "config/config.yaml + clash.yaml" in message[0]
    assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in kept} == kept


def test_any_logged_metric_is_compared_and_a_missing_one_is_said(workspace):
    """A module logging "valid/accuracy" (torchmetrics, no test step), first with a misnamed
    accuracy.metric: the baseline's log says so at its first validation, the report still builds
    and says accuracy was not compared and what the runs logged, and its recommendation is by
    speed alone. Naming the logged metric then rebuilds the report alone, no training again."""
    shutil.copytree(ROOT / "tests/fixtures/usermods", workspace.path / "usermods")
    config = tiny_config(topologies=["1x1", "1x2"], dataset={"generator": "none"})
    config["model"] = {"class_path": "usermods.renamed.RingsClassifier", "init_args": {"width": 12}}
    config["data"] = {"class_path": "usermods.renamed.RingsData", "init_args": {}, "files": []}
    config["accuracy"] = {"metric": "valid/acc", "tolerance": 0.5}
    workspace.write_config(config)
    first = workspace.snakemake()
    assert first.returncode == 0, first.stderr[-4000:]
    log = (workspace.results / "logs/train/1x1/r0.log").read_text()
    assert ("ddpscale: warning: accuracy.metric valid/acc is not logged (the first validation logged: "
            "train/loss, valid/accuracy, valid/loss) and this run has no test pass") in log
    report = workspace.results / "report"
    page = (report / "report.html").read_text()
    said = "accuracy not compared: valid/acc not logged; the runs logged: train/loss, valid/accuracy, valid/loss"
    assert said in page and "by speed alone (accuracy not compared: valid/acc not logged), the fastest " in page
    table = pd.read_csv(report / "scaling.tsv", sep="\t")
    assert table["accuracy_held"].isna().all() and table["valid/acc"].isna().all()
    trained = {t: workspace.metrics(t).stat().st_mtime_ns for t in ("1x1", "1x2")}

    config["accuracy"] = {"metric": "valid/accuracy", "tolerance": 0.5}
    workspace.write_config(config)
    second = workspace.snakemake()
    assert second.returncode == 0, second.stderr[-4000:]
    assert job_counts(second.stderr) == {"all": 1, "report_scaling": 1}, "another metric retrained a run"
    assert {t: workspace.metrics(t).stat().st_mtime_ns for t in trained} == trained
    table = pd.read_csv(report / "scaling.tsv", sep="\t").set_index("topology")
    for topology in ("1x1", "1x2"):
        logged = json.loads(workspace.metrics(topology).read_text())["logged_metrics"]["valid/accuracy"]
        assert table.loc[topology, "valid/accuracy"] == pytest.approx(logged, abs=1e-4)
    # compared now, and one seed each: the baseline is the reference, 1x2 not tested
    assert table["accuracy_test"].tolist() == ["baseline", "one seed: not tested"]
    page = (report / "report.html").read_text()
    assert "accuracy not compared" not in page and "higher is better" in page
