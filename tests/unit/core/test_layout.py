"""Where an experiment's files live (ddpscale.core.layout): pure, so every naming rule is checked here
and the workflow test (test_workflow_local::test_each_experiment_keeps_its_own_folder) checks one
end to end."""

from __future__ import annotations

import re

import pytest

from ddpscale.core.layout import NAME_PATTERN, experiment_name, layout, legacy_note, other_workload


@pytest.mark.parametrize("config,name", [
    ({"experiment": "gpt-small_v2", "model": {"class_path": "x.Y"}}, "gpt-small_v2"),
    ({"experiment": None, "model": {"class_path": "ddpscale.workloads.models.SpiralMLP"}}, "spiralmlp"),
    ({"model": {"class_path": "mypkg.models.Classifier"}}, "classifier"),
    ({"model": {}}, "experiment"),
    ({}, "experiment"),
])
def test_the_experiment_is_named_by_the_config_else_by_the_model_class(config, name):
    assert experiment_name(config) == name


def test_every_path_of_an_experiment_is_under_its_own_folder():
    where = layout({"model": {"class_path": "mypkg.models.Classifier"}})
    assert where.metrics("2x4", 1) == "results/classifier/runs/2x4/r1/metrics.json"
    assert where.train_log("1x1", 0) == "results/classifier/logs/train/1x1/r0.log"
    assert where.checkpoint_dir("1x2", 2) == "results/classifier/checkpoints/1x2/r2"
    assert where.report == "results/classifier/report" and where.data == "results/classifier/data"


@pytest.mark.parametrize("name,allowed", [("spiralmlp", True), ("a.b-c_1", True), ("../up", False),
                                          ("a/b", False), (".hidden", False), ("", False), ("foo\n", False),
                                          ("x" * 64, True), ("x" * 65, False), ("a b", False)])
def test_an_experiment_name_is_one_folder_never_a_path(name, allowed):
    assert bool(re.search(NAME_PATTERN, name)) is allowed  # re.search: as jsonschema applies a pattern


def test_the_schema_holds_the_same_name_pattern():
    import yaml

    from helpers.workflow import ROOT

    schema = yaml.safe_load((ROOT / "workflow/schemas/config.schema.yaml").read_text())
    assert schema["properties"]["experiment"]["pattern"] == NAME_PATTERN


def test_finished_runs_of_another_workload_are_named_and_the_same_workload_is_not():
    records = {"results/x/runs/1x1/r0/metrics.json": {"model_class": "a.Model", "data_class": "a.Data"},
               "results/x/runs/1x2/r0/metrics.json": {"model_class": "b.Other", "data_class": "a.Data"}}
    why = other_workload(records, "a.Model", "a.Data")
    assert why == ("results/x/runs/1x2/r0/metrics.json is a finished run of b.Other on a.Data, but this "
                   "config trains a.Model on a.Data")
    assert other_workload({k: v for k, v in records.items() if "1x1" in k}, "a.Model", "a.Data") is None
    assert other_workload({"old.json": {}}, "a.Model", "a.Data") is None, "records from before the fields"


def test_the_legacy_note_says_where_the_results_are_and_how_to_keep_old_ones():
    note = legacy_note("spiralmlp")
    assert "results/runs/" in note and "results/spiralmlp/" in note and "move" in note


def test_only_the_layout_spells_a_run_s_paths():
    """The rule files, the status command and the scripts ask Layout for a run's metrics, log
    and checkpoint paths; a second spelling would drift from the one the rules write."""
    from helpers.workflow import ROOT

    spelled = re.compile(r"""r\{\{?repeat\}?\}?/metrics\.json|/r\{\{?repeat\}?\}?\.log|["']runs/|logs/train/""")
    files = [*(ROOT / "workflow").rglob("*.smk"), ROOT / "workflow/Snakefile", *(ROOT / "scripts").rglob("*.py")]
    found = [f"{path.relative_to(ROOT)}:{n}" for path in files if path.name != "layout.py"
             for n, line in enumerate(path.read_text().splitlines(), 1) if spelled.search(line)]
    assert found == [], found
