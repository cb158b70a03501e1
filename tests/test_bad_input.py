"""Bad input stops before any job runs, with one message that names the fix."""

from __future__ import annotations

import pytest

from conftest import tiny_config

pytestmark = pytest.mark.timeout(120)


def dry_run_error(workspace, config: dict) -> str:
    workspace.write_config(config)
    result = workspace.snakemake("--dry-run")
    assert result.returncode != 0, "the dry run should have refused this config"
    assert not (workspace.path / "results").exists()
    return result.stdout + result.stderr


def test_misspelt_key_is_rejected(workspace):
    config = tiny_config()
    config["max_epoch"] = config.pop("max_epochs")
    assert "max_epoch" in dry_run_error(workspace, config)


def test_zero_nodes_is_rejected(workspace):
    assert "'0x2' has 0 nodes" in dry_run_error(workspace, tiny_config(topologies=["1x1", "0x2"]))


def test_too_many_devices_per_node_for_the_profile(workspace):
    message = dry_run_error(workspace, tiny_config(topologies=["1x1", "1x9"]))
    assert "'1x9'" in message and "site_gpus_per_node" in message


def test_model_import_path_that_does_not_resolve(workspace):
    config = tiny_config()
    config["model"]["class_path"] = "ddpscale.modelz.SpiralMLP"
    message = dry_run_error(workspace, config)
    assert "ddpscale.modelz" in message and "fix the path" in message


def test_missing_user_data_file_is_named_before_training(workspace):
    config = tiny_config(dataset={"generator": "none"})
    config["data"]["files"] = ["data/mine.csv"]
    assert "data/mine.csv" in dry_run_error(workspace, config)


def test_missing_baseline(workspace):
    message = dry_run_error(workspace, tiny_config(topologies=["1x2"]))
    assert "baseline '1x1'" in message


def test_earlier_table_to_compare_with_must_exist(workspace):
    config = tiny_config()
    config["report"] = {"efficiency_threshold": 0.8, "compare_with": "old/scaling.tsv"}
    message = dry_run_error(workspace, config)
    assert "report.compare_with is 'old/scaling.tsv', which is not a file" in message


def test_efficiency_threshold_above_one_is_rejected(workspace):
    config = tiny_config()
    config["report"] = {"efficiency_threshold": 80}
    assert "efficiency_threshold" in dry_run_error(workspace, config)
