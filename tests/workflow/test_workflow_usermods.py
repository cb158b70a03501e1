"""User modules written the ordinary Lightning way, through the whole local workflow as README
runs it: a learning-rate schedule sized by self.trainer, data modules that build
their own DistributedSampler (from self.trainer or from torch.distributed, with a training
set that does not divide by the world size, padded or drop_last), manual optimisation, and a
module the probe cannot time. Each run is probed and counted exactly, or its probe is n/a
with the reason, the run trains anyway, and the report shows the unknown terms."""

from __future__ import annotations

import json
import shutil

import pandas as pd
import pytest

from helpers.workflow import ROOT, tiny_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

TRAIN_SAMPLES = 301  # two ranks cannot divide it: a padded sampler repeats one, drop_last drops one
NODE_RANKS = {"1x1": [0], "1x2": [0, 0], "2x1": [0, 1]}


def run_workflow(workspace, model: str, data: str, topologies: list[str], data_args: dict | None = None,
                 config_changes: dict | None = None):
    """The workflow on the usermods fixtures (two epochs, the first one warm-up), finished."""
    shutil.copytree(ROOT / "tests/fixtures/usermods", workspace.path / "usermods")
    config = tiny_config(topologies=topologies, dataset={"generator": "none"}, **(config_changes or {}))
    config["model"] = {"class_path": f"usermods.{model}", "init_args": {}}
    config["data"] = {"class_path": f"usermods.{data}",
                      "init_args": {"train_samples": TRAIN_SAMPLES, **(data_args or {})}, "files": []}
    config["accuracy"] = {"metric": "val_acc", "tolerance": 1.0}
    workspace.write_config(config)
    result = workspace.snakemake()
    assert result.returncode == 0, result.stderr[-4000:]
    assert (workspace.results / "report/report.html").exists()
    return {t: json.loads(workspace.metrics(t).read_text()) for t in topologies}


def check_probe(probe: dict, topology: str) -> None:
    assert probe.get("status") == "ok", probe
    world = len(NODE_RANKS[topology])
    assert probe["world_size"] == world and probe["node_ranks"] == NODE_RANKS[topology], probe
    assert probe["step"]["compute_s"] > 0 and probe["allreduce"][-1]["bytes"] == probe["gradient_bytes"]


def test_schedule_sized_by_the_trainer_and_a_sampler_built_from_it(workspace):
    """OneCycleLR over self.trainer.estimated_stepping_batches; DistributedSampler(num_replicas=
    self.trainer.world_size, rank=self.trainer.global_rank), padded: the repeat is not counted."""
    runs = run_workflow(workspace, "cnn.SmallCNN", "imagedata.TrainerShardedImages", ["1x1", "1x2", "2x1"])
    for topology, metrics in runs.items():
        assert metrics["world_size"] == len(NODE_RANKS[topology])
        assert metrics["steady_samples"] == TRAIN_SAMPLES, topology  # one steady epoch, each sample once
        check_probe(metrics["probe"], topology)
    steps = pd.read_csv(workspace.results / "report/breakdown.tsv", sep="\t")
    assert list(steps.topology) == ["1x1", "1x2", "2x1"] and (steps.probe == "ok").all()
    assert (steps.compute_s > 0).all()


def test_manual_optimisation_and_a_sampler_built_from_torch_distributed_with_drop_last(workspace):
    """automatic_optimization = False (optimizers(), manual_backward(), clip_gradients(), a
    OneCycleLR stepped every step); DistributedSampler(num_replicas=dist.get_world_size(),
    rank=dist.get_rank(), drop_last=True): two ranks train 150 samples each, one device all 301."""
    runs = run_workflow(workspace, "manual.ManualCNN", "imagedata.DistShardedImages", ["1x1", "1x2"],
                        {"drop_last": True})
    assert runs["1x1"]["steady_samples"] == TRAIN_SAMPLES
    assert runs["1x2"]["steady_samples"] == 2 * (TRAIN_SAMPLES // 2)
    for topology, metrics in runs.items():
        check_probe(metrics["probe"], topology)
        assert metrics["probe"]["step"]["optimization"] == "manual"
    step = runs["1x2"]["probe"]["step"]
    # the manual backward synchronised under the probe's DDP, and not under no_sync()
    assert step["allreduce_calls_per_batch"] == 1.0 and step["allreduce_calls_per_batch_no_sync"] == 0.0


def test_a_module_the_probe_cannot_time_trains_and_the_report_says_why(workspace):
    """configure_optimizers() returns None: Lightning trains it "with no optimizer"; the probe
    has no optimizer step to time, records n/a with the reason, and the run finishes."""
    runs = run_workflow(workspace, "unprobeable.NoOptimizerCNN", "imagedata.TrainerShardedImages", ["1x1", "1x2"])
    reason = ("PluginError: NoOptimizerCNN.configure_optimizers() returned no optimizer: Lightning trains "
              "without one, but the probe times an optimizer step (in building the optimizers)")
    for topology, metrics in runs.items():
        assert metrics["probe"] == {"status": "n/a", "reason": reason, "topology": topology,
                                    "world_size": len(NODE_RANKS[topology])}
        assert metrics["epochs_completed"] == 2 and metrics["steady_samples"] == TRAIN_SAMPLES
    log = (workspace.results / "logs/train/1x2/r0.log").read_text()
    assert f"ddpscale probe: n/a for 1x2: {reason}; training goes on" in log
    report = workspace.results / "report"
    steps = pd.read_csv(report / "breakdown.tsv", sep="\t")
    assert list(steps.topology) == ["1x1", "1x2"]
    assert (steps.probe == f"n/a (probe failed: {reason})").all()
    assert steps[["step_s", "data_s", "compute_s", "comm_s", "overhead_s"]].isna().all().all()
    prediction = pd.read_csv(report / "prediction.tsv", sep="\t")
    assert list(prediction.topology) == ["1x1", "1x2"] and prediction.predicted_efficiency.isna().all()
    assert "probe failed: PluginError: NoOptimizerCNN" in (report / "report.html").read_text()
    assert f"The probe could not measure 1x1 and 1x2 ({reason}): where the step" in (report / "report.html").read_text()


def test_lightnings_own_demo_classes(workspace):
    """BoringModel unchanged (a dict loss, StepLR, logs nothing) on BoringDataModule made to take
    batch_size as its refusal says: it trains on every topology, counted exactly, probed, and
    the report builds, saying accuracy was not compared because nothing was logged."""
    shutil.copytree(ROOT / "tests/fixtures/usermods", workspace.path / "usermods")
    config = tiny_config(topologies=["1x1", "1x2"], dataset={"generator": "none"})
    config["model"] = {"class_path": "pytorch_lightning.demos.boring_classes.BoringModel", "init_args": {}}
    config["data"] = {"class_path": "usermods.boring.BoringDataModuleB", "init_args": {}, "files": []}
    workspace.write_config(config)
    result = workspace.snakemake()
    assert result.returncode == 0, result.stderr[-4000:]
    for topology in ("1x1", "1x2"):
        metrics = json.loads(workspace.metrics(topology).read_text())
        assert metrics["steady_samples"] == 64, "BoringDataModule trains on 64 samples, each counted once"
        check_probe(metrics["probe"], topology)
    page = (workspace.results / "report/report.html").read_text()
    assert workspace.results.name == "boringmodel"
    assert "accuracy not compared: test_acc not logged; the runs logged: no scalar metric" in page
    assert "by speed alone (accuracy not compared: test_acc not logged)" in page


def test_several_training_loaders_are_counted_through_the_workflow(workspace):
    """Issue 45 item 1 as a user meets it: a dict of a labeled and an unlabeled loader (Lightning
    combines them, max_size_cycle) and two validation loaders, through the whole workflow. Every
    loader's samples count (a cycling one's again, the padding repeat apart) in the record, the
    throughput and the report's table, against the truth computed from the data module."""
    from helpers.training import epoch_truth, loader_sizes

    shutil.copytree(ROOT / "tests/fixtures/usermods", workspace.path / "usermods")
    config = tiny_config(topologies=["1x1", "1x2"], dataset={"generator": "none"}, measure="full")
    config["model"] = {"class_path": "usermods.multiloader.SemiSupervised", "init_args": {}}
    config["data"] = {"class_path": "usermods.multiloader.LabeledAndUnlabeled", "init_args": {}, "files": []}
    config["accuracy"] = {"metric": "val_acc/dataloader_idx_0", "tolerance": 1.0}
    workspace.write_config(config)
    result = workspace.snakemake()
    assert result.returncode == 0, result.stderr[-4000:]
    scaling = pd.read_csv(workspace.results / "report/scaling.tsv", sep="\t").set_index("topology")
    for topology, world in (("1x1", 1), ("1x2", 2)):
        m = json.loads(workspace.metrics(topology).read_text())
        real, padding = epoch_truth(loader_sizes(), world, "max_size_cycle", batch=config["batch"]["size"] // world)
        assert m["samples_per_epoch"] == real and m["padding_per_epoch"] == padding, topology
        assert m["steady_samples"] == real and m["samples_uncounted"] is None, topology  # one steady epoch
        assert m["throughput_samples_s"] == pytest.approx(m["steady_samples"] / m["steady_time_s"], rel=1e-9)
        assert scaling.loc[topology, "throughput_samples_s"] == pytest.approx(m["throughput_samples_s"], rel=1e-2)


def test_layerdrop_with_accumulation_is_probed_and_its_settings_named_through_the_workflow(workspace):
    """Issue 45 items 4 and 8 as a user meets them: a LayerDrop module (each rank skips its own
    blocks) with ddp.find_unused_parameters: true and accumulate_grad_batches: 2, through the whole
    workflow. Every topology's probe times it (1x2 and 2x1 were n/a, blaming DDP), and the report
    names the accumulation with the other settings that change what a step is."""
    import html
    import re

    runs = run_workflow(workspace, "layerdrop.LayerDropMLP", "imagedata.TrainerShardedImages", ["1x1", "1x2", "2x1"],
                        config_changes={"accumulate_grad_batches": 2, "ddp": {"find_unused_parameters": True}})
    for topology, metrics in runs.items():
        check_probe(metrics["probe"], topology)
        assert metrics["probe"]["step"]["accumulate_grad_batches"] == 2
    steps = pd.read_csv(workspace.results / "report/breakdown.tsv", sep="\t")
    assert (steps.probe == "ok").all() and steps[["compute_s", "comm_s"]].notna().all(axis=None)
    text = html.unescape(re.sub(r"<[^>]+>", " ", (workspace.results / "report/report.html").read_text()))
    assert "accumulate_grad_batches 2" in re.sub(r"\s+", " ", text) or "accumulate_grad_batches: 2" in text
