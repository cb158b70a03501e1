"""A LightningCLI config as the experiment, through the whole local workflow as README runs it:
the file LightningCLI writes (--print_config of a user's cli_main.py) names
the model, the data, the epochs, gradient clipping, an optimizer with its schedule, and the
devices and strategy of the user's own cluster runs. The runs train the CLI's model with its
settings; what ddpscale sets per topology is named in one line; the report and the status
command follow the CLI's experiment; a setting ddpscale cannot measure under is refused."""

from __future__ import annotations

import json
import shutil
import subprocess

import pandas as pd
import pytest
import yaml

from helpers.workflow import ROOT, WORKFLOW_PYTHON, tiny_config
from workflow.test_lightningcli import print_config  # a bare test_lightningcli is tests/unit's

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

CLI_ARGS = ("--subclass", "--model", "usermods.renamed.RingsClassifier", "--model.width", "12",
            "--data", "usermods.renamed.RingsData", "--data.batch_size", "32", "--data.samples", "400",
            "--trainer.max_epochs", "2", "--trainer.devices", "4",
            "--trainer.strategy", "ddp_find_unused_parameters_true",
            "--trainer.gradient_clip_val", "0.5", "--optimizer", "torch.optim.AdamW", "--optimizer.lr", "0.01",
            "--lr_scheduler", "torch.optim.lr_scheduler.StepLR", "--lr_scheduler.step_size", "1",
            "--seed_everything", "7")


@pytest.fixture
def cli_workspace(workspace):
    shutil.copytree(ROOT / "tests/fixtures/usermods", workspace.path / "usermods")
    workspace.write_config(tiny_config())
    (workspace.path / "cli.yaml").write_text(yaml.safe_dump(print_config(*CLI_ARGS), sort_keys=False))
    overlay = {"lightning_config": "cli.yaml", "topologies": ["1x1", "1x2"],
               "accuracy": {"metric": "valid/accuracy", "tolerance": 0.5}}
    (workspace.path / "my.yaml").write_text(yaml.safe_dump(overlay))
    return workspace


def test_a_lightningcli_config_is_the_experiment(cli_workspace):
    workspace = cli_workspace
    result = workspace.snakemake("--configfile", "my.yaml")
    assert result.returncode == 0, result.stderr[-4000:]
    assert ("ddpscale: cli.yaml: set by ddpscale for every topology, so overridden: data batch_size (32) (the "
            "batch per device comes from batch.size and batch.scaling); trainer.devices (4)") in result.stderr
    assert ("ddpscale: cli.yaml: read into ddpscale's settings: trainer.strategy (ddp_find_unused_parameters_true) "
            "as ddp: find_unused_parameters true") in result.stderr
    results = workspace.path / "results/ringsclassifier"  # the CLI's model names the experiment
    width = 12  # RingsClassifier: Linear(2, width), ReLU, Linear(width, 3)

    for topology, world in (("1x1", 1), ("1x2", 2)):
        metrics = json.loads((results / f"runs/{topology}/r0/metrics.json").read_text())
        assert metrics["model_class"] == "usermods.renamed.RingsClassifier" and metrics["world_size"] == world
        assert metrics["model_parameters"] == 2 * width + width + width * 3 + 3, "the CLI's init_args"
        assert metrics["max_epochs"] == 2 and metrics["epochs_completed"] == 2
        assert metrics["trainer_settings"] == {"gradient_clip_val": 0.5}, "read back from the Trainer"
        assert metrics["optimizers"] == ["AdamW"], "LightningCLI's optimizer replaced the module's SGD"
        assert metrics["ddp"]["find_unused_parameters"] is True and metrics["ddp"]["used"] is (world > 1)
        assert metrics["batch_per_device"] == 64 // world, "ddpscale's batch, not the CLI's 32"
        assert metrics["probe"]["status"] == "ok", metrics["probe"]
        assert "valid/accuracy" in metrics["logged_metrics"]
    table = pd.read_csv(results / "report/scaling.tsv", sep="\t")
    assert set(table["config_files"]) == {"config/config.yaml + my.yaml + cli.yaml"}
    assert set(table["dataset"]) == {"the data module's own (RingsData: samples 400)"}
    assert set(table["trainer_settings"]) == {"gradient_clip_val 0.5"} and set(table["optimizers"]) == {"AdamW"}
    assert set(table["ddp"]) == {"find_unused_parameters true"}
    assert table["accuracy_test"].tolist() == ["baseline", "one seed: not tested"]  # compared, one seed each

    status = subprocess.run([WORKFLOW_PYTHON, "scripts/status.py", "--configfile", "my.yaml"], cwd=workspace.path,
                            capture_output=True, text=True, timeout=60)
    assert status.returncode == 0 and "2 done, 0 running" in status.stdout, status.stdout + status.stderr


def test_a_setting_ddpscale_cannot_measure_under_is_refused_before_any_job(cli_workspace):
    workspace = cli_workspace
    cli = yaml.safe_load((workspace.path / "cli.yaml").read_text())
    cli["trainer"]["max_steps"] = 100
    (workspace.path / "cli.yaml").write_text(yaml.safe_dump(cli))
    result = workspace.snakemake("--dry-run", "--configfile", "my.yaml")
    assert result.returncode != 0 and "Job stats" not in result.stdout
    assert ("cli.yaml: trainer.max_steps is 100, but ddpscale measures whole epochs; remove it and set "
            "trainer.max_epochs") in result.stdout
    assert not (workspace.path / "results").exists()


@pytest.fixture
def hand_written(workspace):
    """A workspace for a LightningCLI config written by hand (hand_written_cli)."""
    shutil.copytree(ROOT / "tests/fixtures/usermods", workspace.path / "usermods")
    workspace.write_config(tiny_config())
    (workspace.path / "my.yaml").write_text(yaml.safe_dump({"lightning_config": "cli.yaml"}))
    return workspace


def hand_written_cli(workspace, **sections) -> None:
    cli = {"model": {"class_path": "usermods.tiny.BlobsClassifier", "init_args": {"width": 8}},
           "data": {"class_path": "usermods.tiny.BlobsData", "init_args": {}}, **sections}
    (workspace.path / "cli.yaml").write_text(yaml.safe_dump(cli))


@pytest.mark.parametrize("optimizer,kind", [
    ({"class_path": "os.system", "init_args": {"command": "touch marker"}},
     "'os.system' is a builtin_function_or_method, not a class, not an optimizer"),
    ({"class_path": "subprocess.run", "init_args": {"args": ["touch", "marker"]}},
     "'subprocess.run' is a function, not a class, not an optimizer"),
])
def test_an_optimizer_that_runs_a_command_is_refused_before_any_job(hand_written, optimizer, kind):
    """The run would have called it on every rank; LightningCLI takes only an Optimizer subclass."""
    workspace = hand_written
    hand_written_cli(workspace, optimizer=optimizer)
    result = workspace.snakemake("--dry-run", "--configfile", "my.yaml")
    assert result.returncode != 0 and "Job stats" not in result.stdout, result.stdout[-3000:]
    assert f"cli.yaml: optimizer.class_path: {kind} (a subclass of torch.optim.Optimizer" in result.stdout
    assert "Traceback" not in result.stdout + result.stderr
    assert not (workspace.path / "marker").exists()


def test_an_explicit_null_init_argument_reaches_the_job_as_none(hand_written):
    """NoisyNet's dropout defaults to 0.1; the CLI file's null means no dropout, and the job's
    spec (its command line) carries it. The module prints while it imports: still a valid module."""
    workspace = hand_written
    hand_written_cli(workspace,
                     model={"class_path": "usermods.noisy.NoisyNet", "init_args": {"width": 8, "dropout": None}},
                     data={"class_path": "usermods.noisy.NoisyData", "init_args": {}})
    result = workspace.snakemake("--dry-run", "--printshellcmds", "--configfile", "my.yaml")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    commands = [line for line in result.stdout.splitlines() if line.startswith("Shell command:") and "train.py" in line]
    assert commands and all("'--model-args={\"dropout\": null, \"width\": 8}'" in line for line in commands), commands
