"""The plan of an experiment's runs: built from a config, a site and the host, and what the rules
read from it (targets, stages, each run's spec, resources, flags, what blocks the workflow on disk)."""

from __future__ import annotations

import json

import pytest

from ddpscale.run.topology import TopologyError
from ddpscale.plan import runplan
from ddpscale.run.hostdevices import AcceleratorError, VisibleGpus
from ddpscale.plan.site.resources import Site
from helpers.configs import default_config, plan, source
from helpers.records import make_run

SRUN = Site(launcher="srun", gpus_per_node=4, cpus_per_gpu=8, mem_mb_per_gpu=1000)


def test_targets_are_every_topology_and_repeat_under_the_layout():
    p = plan(topologies=["1x1", "1x2", "2x2"], repeats=2)
    assert p.runs() == [(t, r) for t in ("1x1", "1x2", "2x2") for r in (0, 1)]
    assert p.metrics()[:2] == ["results/spiralmlp/runs/1x1/r0/metrics.json", "results/spiralmlp/runs/1x1/r1/metrics.json"]
    assert p.stage_topologies == {"baseline": ["1x1"], "single_node": ["1x2"], "multi_node": ["2x2"]}
    assert p.stage_metrics("multi_node") == ["results/spiralmlp/runs/2x2/r0/metrics.json",
                                             "results/spiralmlp/runs/2x2/r1/metrics.json"]
    # plan.json, for make status: the experiment, and what every stage trains (ddpscale.plan.planfile)
    assert p.record() == {"version": 1, "experiment": "spiralmlp", "measure": "full", "baseline": "1x1",
                          "stages": {"baseline": {"topologies": ["1x1"], "repeats": 2},
                                     "single_node": {"topologies": ["1x2"], "repeats": 2},
                                     "multi_node": {"topologies": ["2x2"], "repeats": 2}}}


def test_repeats_auto_follow_the_measure_mode_of_the_site():
    # 50 epochs of the spiral (the Raven tutorial's): long enough for throughput mode to win
    assert plan(repeats="auto", max_epochs=50).repeats == (0,)  # local: full
    assert plan(site=SRUN, repeats="auto", max_epochs=50).repeats == (0, 1, 2)  # a cluster: throughput
    assert plan(site=SRUN, repeats="auto", max_epochs=50, measure="full").repeats == (0,)


def test_auto_trains_in_full_on_a_cluster_where_throughput_mode_cannot_win():
    """The shipped spiral trains 330 batches per rank, and throughput mode's three repeats of the 300
    before its stopping rule's first look cost more: auto resolves to full (one repeat), and the
    next line says why, with the numbers; measure: throughput still runs as set, saying the same;
    plan.json records what resolved."""
    auto = plan(site=SRUN, repeats="auto")
    assert auto.measure == "full" and auto.repeats == (0,) and auto.record()["measure"] == "full"
    assert {stage["repeats"] for stage in auto.record()["stages"].values()} == {1}
    assert auto.notes[0].startswith("measure full (measure: auto on a cluster profile, where throughput mode "
                                    "costs more than full training on every topology")
    assert auto.notes[1].startswith("throughput mode cannot win here: it runs each topology 3 times (repeats: auto) "
                                    "for at least 300 batches per rank")
    assert auto.notes[1].endswith("measure: auto trains in full; set measure: throughput to measure throughput anyway")
    asked = plan(site=SRUN, repeats="auto", measure="throughput")
    assert asked.measure == "throughput" and asked.repeats == (0, 1, 2)
    assert asked.notes[1].endswith("measure: throughput runs as set; measure: full or auto trains in full")
    assert plan(site=SRUN, measure="full").notes[1:] == ()  # full was asked for: nothing to say
    assert plan(repeats="auto").notes[0].startswith("measure full (measure: auto on the local profile")
    assert not any("cannot win" in note for note in plan(repeats="auto").notes)


def test_a_stage_pattern_matches_its_topologies_only():
    import re

    p = plan(topologies=["1x1", "1x2", "1x4", "2x2"])
    assert re.fullmatch(p.stage_pattern("single_node"), "1x4")
    assert not re.fullmatch(p.stage_pattern("single_node"), "2x2")
    assert not re.fullmatch(p.stage_pattern("single_node"), "1x1")


def test_each_run_spec_is_built_once_and_names_its_own_files():
    p = plan(topologies=["1x1", "1x2"])
    spec = p.spec("1x2", "0")
    assert p.spec("1x2", 0) is spec
    assert spec.metrics == p.metrics(["1x2"])[0]
    assert spec.data_file == p.data_file == "results/spiralmlp/data/spiral/data.npz"
    assert spec.accelerator == "cpu" and spec.threads == 1


def test_the_host_decides_the_local_accelerator_and_says_why():
    two = VisibleGpus(2, ("0", "1"), "nvidia-smi -L")
    p = plan(topologies=["1x1", "1x2"], gpus=two, cores=8)
    assert (p.accelerator, p.gpu_ids, p.local_threads) == ("gpu", ("0", "1"), 4)
    assert "CUDA_VISIBLE_DEVICES" not in p.launch("1x2") and "--gpu-ids 0,1" in p.launch("1x2")
    cpu = plan(topologies=["1x1", "1x2"])
    assert cpu.accelerator == "cpu" and cpu.gpu_ids is None
    assert any(note.startswith("no GPU found") for note in cpu.notes)
    assert cpu.notes[0].startswith("measure full (")
    crowded = plan(topologies=["1x1", "1x4"], cores=2)
    assert any(note.startswith("warning: 1x4: more simulated devices") for note in crowded.notes)


def test_a_local_topology_beyond_the_hosts_memory_is_refused_not_warned():
    with pytest.raises(TopologyError) as refused:
        plan(topologies=["1x1", "1x2", "99999x8"], cores=2, memory_mb=24_000, batch={"scaling": "weak", "size": 64})
    assert str(refused.value).startswith("config/config.yaml: '99999x8' runs 799,992 processes")
    assert "this machine has 24 GB. Use at most 240 devices" in str(refused.value)
    # oversubscribed but within memory: measured, with the warning
    assert any(n.startswith("warning: 1x4") for n in plan(topologies=["1x1", "1x4"], cores=2, memory_mb=24_000).notes)
    # a cluster's nodes are not this host
    assert plan(site=SRUN, topologies=["1x1", "999x4"], memory_mb=24_000, batch={"scaling": "weak", "size": 64}).topologies[-1].name == "999x4"


def test_a_topology_message_names_the_file_that_set_the_key():
    overlay = {("topologies",): "presets/big.yaml", ("baseline",): "--config"}
    where = lambda key: overlay.get(key, "config/config.yaml")  # noqa: E731
    with pytest.raises(TopologyError, match=r"^presets/big.yaml, topologies\[1\]: '0x4' has 0 nodes"):
        plan(topologies=["1x1", "0x4"], source=where)
    with pytest.raises(TopologyError, match=r"^--config: baseline '1x4' is not among"):
        plan(topologies=["1x1", "1x2"], baseline="1x4", source=where)
    with pytest.raises(TopologyError, match=r"^presets/big.yaml: '99999x8' runs"):
        plan(topologies=["1x1", "99999x8"], memory_mb=24_000, source=where, batch={"scaling": "weak", "size": 64})
    with pytest.raises(AcceleratorError, match=r"^config/config.yaml: accelerator is gpu"):
        plan(topologies=["1x1", "1x2"], accelerator="gpu", source=where)


def test_a_plan_the_site_or_host_cannot_run_is_refused_in_one_line():
    with pytest.raises(TopologyError):
        plan(site=SRUN, topologies=["1x1", "1x8"])
    with pytest.raises(AcceleratorError):
        plan(topologies=["1x1", "1x2"], accelerator="gpu")


def test_a_cluster_plan_reads_no_host_and_gives_the_plugin_its_resources():
    p = plan(site=SRUN, topologies=["1x1", "2x4"])
    assert (p.accelerator, p.gpu_ids, p.local_threads) == ("auto", None, None)
    assert p.resources("2x4")["nodes"] == 2 and p.resources("2x4")["tasks"] == 8
    assert p.launch("2x4").startswith("env -u MASTER_ADDR") and "srun --nodes=2" in p.launch("2x4")


def test_report_flags_hold_what_the_config_wrote_and_name_every_expected_topology():
    config = default_config(topologies=["1x1", "1x2"], experiment="a-b")
    config["dataset"]["noise"] = 0.25
    words = plan(config).report_argv({"train_baseline": None})
    given = dict(word.split("=", 1) for word in words if "=" in word)
    assert given["--experiment"] == "a-b"
    assert json.loads(given["--dataset"])["noise"] == 0.25
    assert words[-3:] == ["--expected", "1x1", "1x2"]
    assert "--job-limits" not in given  # the local profile has no time limits
    limited = plan(site=SRUN, topologies=["1x1", "1x2"]).report_argv({"train_baseline": 60, "train_single_node": 30})
    limits = next(word for word in limited if word.startswith("--job-limits="))
    assert json.loads(limits.partition("=")[2])["1x2"]["limit_s"] == 1800


def test_run_identity_holds_the_generated_data_settings_and_versions_only():
    assert json.loads(plan().run_identity())["versions"] == {"torch": "2.13.0"}
    config = default_config()
    config["dataset"]["generator"] = "none"
    p = plan(config)
    assert json.loads(p.run_identity())["dataset"] is None
    assert p.data_file is None and p.generated_files == [] and not p.data_settings_changed()
    assert "--out results/spiralmlp/data/none/data.npz" in p.prepare_flags()  # unused, but well formed


def test_nothing_on_disk_blocks_a_fresh_experiment(in_tmp):
    assert runplan.disk_problems(plan(), source) == []


def test_finished_runs_of_another_workload_block_the_workflow(in_tmp):
    p = plan()
    metrics = in_tmp / p.metrics()[0]
    metrics.parent.mkdir(parents=True)
    metrics.write_text(json.dumps(make_run(model_class="other.Net", data_class=p.config["data"]["class_path"])))
    (problem,) = [line for line in runplan.disk_problems(p, source) if "other.Net" in line]
    assert problem.startswith("config/config.yaml: ") and "set `experiment:`" in problem


def test_a_missing_dataset_that_finished_runs_used_names_the_command_that_remakes_it(in_tmp):
    p = plan()
    metrics = in_tmp / p.metrics()[0]
    metrics.parent.mkdir(parents=True)
    metrics.write_text(json.dumps(make_run(model_class=p.config["model"]["class_path"],
                                           data_class=p.config["data"]["class_path"])))
    (problem,) = runplan.disk_problems(p, source)
    assert problem.startswith(f"data file {p.data_file} is missing but 1 finished run(s) used it.")
    assert f"/v/bin/python scripts/prepare_data.py {p.prepare_flags()}" in problem


def test_an_unreadable_record_is_set_aside_keeping_earlier_ones_and_the_good_ones(in_tmp):
    p = plan()
    good, bad = (in_tmp / path for path in p.metrics()[:2])
    for path in (good, bad):
        path.parent.mkdir(parents=True, exist_ok=True)
    good.write_text(json.dumps(make_run()))
    for content in ('{"topology": "1x', "[]"):  # cut short, then of the wrong shape
        bad.write_text(content)
        (line,) = runplan.set_aside_unreadable(p)
        assert line.startswith(f"{p.metrics()[1]} is unreadable (") and line.endswith(": this run will rerun")
        assert not bad.exists()
    assert (bad.parent / "metrics.json.unreadable").read_text() == '{"topology": "1x'
    assert (bad.parent / "metrics.json.unreadable.1").read_text() == "[]"
    assert runplan.set_aside_unreadable(p) == [] and good.exists()


def test_a_report_to_compare_with_that_is_not_a_file_is_named_with_its_source(in_tmp):
    config = default_config()
    config["report"]["compare_with"] = "old"
    (in_tmp / "old").mkdir()  # a folder where a file goes
    (problem,) = runplan.disk_problems(plan(config), source)
    assert problem.startswith("overlay.yaml: report.compare_with is 'old', which is not a file")


@pytest.mark.parametrize("content, said", [
    (b"\x89PNG\r\n\x1a\n\x00", "not UTF-8 text"), (b"", "no column topology, throughput_samples_s, efficiency, fit_time_s"),
    (b"topology\tefficiency\n1x1\t0.9\n", "no column throughput_samples_s, fit_time_s"),
])
def test_a_report_to_compare_with_that_is_not_a_scaling_table_is_refused_before_any_job(in_tmp, content, said):
    config = default_config()
    config["report"]["compare_with"] = "old.tsv"
    (in_tmp / "old.tsv").write_bytes(content)
    (problem,) = runplan.disk_problems(plan(config), source)
    assert problem.startswith(f"overlay.yaml: report.compare_with: old.tsv is not a ddpscale scaling.tsv ({said})")
    assert problem.endswith("or set it to null")
