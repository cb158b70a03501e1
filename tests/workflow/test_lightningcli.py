"""A LightningCLI config as ddpscale's settings (ddpscale.run.lightningcli), read from the
files LightningCLI itself writes (--print_config of tests/fixtures/usermods/cli_main.py), and
a run writing the loggers one names (configs written by hand, and the Trainer and DDP
arguments classified: tests/unit/run/test_lightningcli.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from helpers.configs import ddpscale_config
from helpers.workflow import ROOT
from ddpscale.run import lightningcli

FIXTURES = ROOT / "tests/fixtures"


def print_config(*args: str) -> dict:
    """What `python cli_main.py fit ... --print_config` writes, as a user would save it."""
    done = subprocess.run([sys.executable, "usermods/cli_main.py", "fit", *args, "--print_config"], cwd=FIXTURES,
                          capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(FIXTURES)})
    assert done.returncode == 0, done.stderr[-2000:]
    return yaml.safe_load(done.stdout)


@pytest.mark.slow
def test_a_subclass_mode_cli_config_brings_model_data_and_what_changes_the_measurement():
    cli = print_config("--subclass", "--model", "usermods.renamed.RingsClassifier", "--model.width", "12",
                       "--data", "usermods.renamed.RingsData", "--data.batch_size", "32", "--data.samples", "400",
                       "--trainer.max_epochs", "3", "--trainer.precision", "bf16", "--trainer.devices", "4",
                       "--trainer.strategy", "ddp", "--trainer.gradient_clip_val", "0.5",
                       "--trainer.accumulate_grad_batches", "2", "--seed_everything", "7")
    applied = lightningcli.apply(cli, ddpscale_config(), "cli.yaml", lambda key: False)
    assert applied.problems == []
    config = applied.config
    assert config["model"] == {"class_path": "usermods.renamed.RingsClassifier", "init_args": {"width": 12, "lr": 0.05}}
    assert config["data"]["class_path"] == "usermods.renamed.RingsData"
    assert config["data"]["init_args"] == {"samples": 400}, "batch_size is ddpscale's, per topology"
    assert config["dataset"]["generator"] == "none", "the CLI's data module brings its data"
    assert (config["max_epochs"], config["precision"], config["accumulate_grad_batches"], config["seed"]) == (
        3, "bf16-mixed", 2, 7)
    assert applied.trainer_args == {"gradient_clip_val": 0.5}
    line = lightningcli.overridden_line("cli.yaml", applied)
    assert line == ("ddpscale: cli.yaml: set by ddpscale for every topology, so overridden: data batch_size (32) "
                    "(the batch per device comes from batch.size and batch.scaling); trainer.devices (4)")
    assert lightningcli.read_line("cli.yaml", applied) == (
        "ddpscale: cli.yaml: read into ddpscale's settings: trainer.strategy (ddp) as ddp: torch's defaults")
    assert applied.layer["model"]["init_args"]["width"] == 12 and applied.layer["max_epochs"] == 3


@pytest.mark.slow
def test_a_fixed_class_cli_config_needs_the_class_named_once():
    cli = print_config("--model.width", "10")
    assert "class_path" not in cli["model"]
    config = ddpscale_config()
    refused = lightningcli.apply(cli, config, "cli.yaml", lambda key: False)
    assert refused.problems[0].startswith("cli.yaml: model has no class_path (the LightningCLI was made with a "
                                          "fixed model class); name the class")
    config["model"]["class_path"] = "usermods.renamed.RingsClassifier"
    config["data"]["class_path"] = "usermods.renamed.RingsData"
    named = lightningcli.apply(cli, config, "cli.yaml", lambda key: key[1] == "class_path")
    assert named.problems == [] and named.config["model"]["init_args"] == {"width": 10, "lr": 0.05}
    assert named.config["data"]["init_args"] == {"samples": 480}
    assert lightningcli.overridden_line("cli.yaml", named) == (
        "ddpscale: cli.yaml: set by ddpscale for every topology, so overridden: seed_everything (true: ddpscale "
        "seeds repeat r of every topology with seed 42 + r, so that topologies train alike and repeats are seeds)")


@pytest.mark.slow
def test_a_print_config_ddp_strategy_is_read_with_its_settings_only():
    """--print_config writes every DDPStrategy and DDP argument; only those the user set are read."""
    hook = "torch.distributed.algorithms.ddp_comm_hooks.default_hooks.fp16_compress_hook"
    cli = print_config("--trainer.strategy", "pytorch_lightning.strategies.DDPStrategy",
                       "--trainer.strategy.init_args.find_unused_parameters", "true",
                       "--trainer.strategy.init_args.ddp_comm_hook", hook)
    applied = lightningcli.apply(cli, ddpscale_config(), "cli.yaml", lambda key: key[1] == "class_path")
    assert applied.problems == []
    assert applied.layer["ddp"] == {"find_unused_parameters": True, "comm_hook": "fp16_compress"}
    assert lightningcli.read_line("cli.yaml", applied) == (
        "ddpscale: cli.yaml: read into ddpscale's settings: trainer.strategy (DDPStrategy) as ddp: "
        "find_unused_parameters true, comm_hook fp16_compress")


# -- trainer.logger: kept where it writes files, in each run's folder ----------------------------

@pytest.mark.slow
def test_a_cli_config_s_tensorboard_logger_is_kept_with_its_arguments_in_the_run_s_folder():
    cli = print_config("--trainer.logger", "TensorBoardLogger", "--trainer.logger.save_dir", "tb_logs",
                       "--trainer.logger.default_hp_metric", "false", "--trainer.logger.prefix", "run")
    applied = lightningcli.apply(cli, ddpscale_config(), "cli.yaml", lambda key: key[1] == "class_path")
    assert [p for p in applied.problems if "logger" in p] == []
    assert applied.loggers == [{"kind": "tensorboard", "init_args": {"default_hp_metric": False, "prefix": "run"}}]
    assert "trainer.logger (TensorBoardLogger): written in each run's folder" in lightningcli.read_line("cli.yaml", applied)
    assert "trainer.logger.init_args.save_dir (tb_logs) (the run's folder)" in applied.overridden


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_run_writes_the_loggers_the_cli_config_names_beside_its_record(tmp_path, data_file):
    from helpers.training import run_user_module

    loggers = [{"kind": "csv", "init_args": {}}, {"kind": "tensorboard", "init_args": {"default_hp_metric": False}}]
    done = run_user_module(tmp_path, "from ddpscale.workloads.models import SpiralMLP as Model\n", "plain.Model",
                           data_file, "--loggers", json.dumps(loggers))
    assert done.returncode == 0, done.stderr[-3000:]
    logs = tmp_path / "logs" / "attempt-1"
    assert (logs / "metrics.csv").exists() and list(logs.glob("events.out.tfevents.*"))
    m = json.loads((tmp_path / "metrics.json").read_text())
    assert m["epochs_completed"] == 2 and m["loggers"] == ["CSVLogger", "TensorBoardLogger"]
