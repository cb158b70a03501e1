"""A LightningCLI config as ddpscale's settings (ddpscale.run.lightningcli): every Trainer and
DDPStrategy argument classified with Lightning's own default, and configs written by hand read
or refused in one line each (the files LightningCLI itself writes, and a run writing the
loggers a config names: tests/workflow/test_lightningcli.py)."""

from __future__ import annotations

import inspect

import pytest

from helpers.configs import ddpscale_config
from ddpscale.run import lightningcli


def test_every_trainer_argument_is_classified_with_lightnings_own_default():
    """A new Lightning's new Trainer argument fails here until it is classified."""
    import pytorch_lightning as pl

    params = {name: p.default for name, p in inspect.signature(pl.Trainer.__init__).parameters.items() if name != "self"}
    assert lightningcli.TRAINER_DEFAULTS == params
    kinds = [set(lightningcli.MAPPED), set(lightningcli.PASSED), set(lightningcli.READ), set(lightningcli.OWNED),
             set(lightningcli.REFUSED)]
    assert set().union(*kinds) == set(params) and sum(map(len, kinds)) == len(params), "each argument in one kind"


def test_settings_ddpscale_cannot_measure_under_are_refused_in_one_line_each():
    cli = {"trainer": {"max_steps": 500, "val_check_interval": 0.25, "max_epocs": 3}, "fit": {}}
    problems = lightningcli.apply(cli, ddpscale_config(), "cli.yaml", lambda key: False).problems
    assert problems == [
        "cli.yaml: 'fit' is not a key of a LightningCLI fit config (those are seed_everything, trainer, model, data, "
        "optimizer, lr_scheduler, ckpt_path, weights_only); remove it",
        "cli.yaml: trainer.max_steps is 500, but ddpscale measures whole epochs; remove it and set trainer.max_epochs "
        "(trainer.limit_train_batches shortens an epoch)",
        "cli.yaml: trainer.val_check_interval is 0.25, but validation inside an epoch would split its timed training "
        "phase; remove it (trainer.check_val_every_n_epoch validates less often)",
        "cli.yaml: trainer.max_epocs is not an argument of pytorch_lightning's Trainer (2.6); remove it or fix its name"]


def test_the_cli_loader_knobs_become_the_dataloader_settings():
    cli = {"data": {"class_path": "m.D", "init_args": {"num_workers": 4, "pin_memory": True, "root": "x"}}}
    applied = lightningcli.apply(cli, ddpscale_config(), "cli.yaml", lambda key: False)
    assert applied.config["dataloader"]["num_workers"] == 4 and applied.config["dataloader"]["pin_memory"] is True
    assert applied.config["data"]["init_args"] == {"root": "x"}


def test_every_ddp_strategy_argument_has_lightnings_and_torchs_default():
    """--print_config writes each of them; a new one fails here until it is classified."""
    import torch
    from pytorch_lightning.strategies import DDPStrategy

    params = {**{n: p.default for n, p in inspect.signature(DDPStrategy.__init__).parameters.items()
                 if n not in ("self", "kwargs")},
              **{n: p.default for n, p in inspect.signature(torch.nn.parallel.DistributedDataParallel.__init__)
                 .parameters.items() if n not in ("self", "module", "device_ids")}}
    params["timeout"] = str(params["timeout"])  # as --print_config writes a timedelta
    assert lightningcli.STRATEGY_DEFAULTS == params


@pytest.mark.parametrize("strategy, ddp", [
    ("ddp", {}),
    ("ddp_find_unused_parameters_true", {"find_unused_parameters": True}),
    ("DDP_FIND_UNUSED_PARAMETERS_FALSE", {"find_unused_parameters": False}),
    ({"class_path": "lightning.pytorch.strategies.DDPStrategy",
      "init_args": {"find_unused_parameters": True, "static_graph": True, "bucket_cap_mb": 50,
                    "ddp_comm_hook": "torch.distributed.algorithms.ddp_comm_hooks.default_hooks.bf16_compress_hook"}},
     {"find_unused_parameters": True, "static_graph": True, "bucket_cap_mb": 50, "comm_hook": "bf16_compress"}),
    ({"class_path": "pytorch_lightning.strategies.DDPStrategy", "init_args": {"gradient_as_bucket_view": True}},
     {"gradient_as_bucket_view": True}),
])
def test_a_ddp_strategy_is_read_into_the_ddp_block(strategy, ddp):
    config = ddpscale_config()
    applied = lightningcli.apply({"trainer": {"strategy": strategy}}, config, "cli.yaml", lambda key: False)
    assert applied.problems == [] and applied.overridden == []
    assert applied.config["ddp"] == {**config["ddp"], **ddp} and applied.layer.get("ddp", {}) == ddp
    assert lightningcli.read_line("cli.yaml", applied).startswith("ddpscale: cli.yaml: read into ddpscale's settings: "
                                                                 "trainer.strategy (")


def test_the_cli_file_s_ddp_settings_win_over_the_config_s_as_its_max_epochs_do():
    config = ddpscale_config()
    config["ddp"].update(static_graph=True, bucket_cap_mb=25)
    cli = {"trainer": {"max_epochs": 7, "strategy": {"class_path": "pytorch_lightning.strategies.DDPStrategy",
                                                     "init_args": {"bucket_cap_mb": 100, "timeout": "0:05:00"}}}}
    applied = lightningcli.apply(cli, config, "cli.yaml", lambda key: True)
    assert applied.config["ddp"]["static_graph"] is True and applied.config["ddp"]["bucket_cap_mb"] == 100
    assert applied.layer["ddp"] == {"bucket_cap_mb": 100} and applied.config["max_epochs"] == 7
    assert applied.overridden == ["trainer.strategy.init_args.timeout (0:05:00)"]


@pytest.mark.parametrize("strategy, expected", [
    ("fsdp", "cli.yaml: trainer.strategy is 'fsdp', but ddpscale measures DDP, built per topology; use ddp, "
             "ddp_find_unused_parameters_true or pytorch_lightning.strategies.DDPStrategy, or remove it and set ddp: "
             "in your ddpscale config"),
    ("deepspeed_stage_2", "trainer.strategy is 'deepspeed_stage_2', but ddpscale measures DDP"),
    ("ddp_spawn", "trainer.strategy is 'ddp_spawn', but ddpscale measures DDP"),
    ({"class_path": "lightning.pytorch.strategies.FSDPStrategy"},
     "trainer.strategy is 'lightning.pytorch.strategies.FSDPStrategy', but ddpscale measures DDP"),
    ({"class_path": "pytorch_lightning.strategies.DDPStrategy", "init_args": {"find_unused": True}},
     "cli.yaml: trainer.strategy.init_args.find_unused is not an argument of DDPStrategy or DistributedDataParallel; "
     "remove it or fix its name"),
    ({"class_path": "pytorch_lightning.strategies.DDPStrategy", "init_args": {"ddp_comm_hook": "os.system"}},
     "trainer.strategy.init_args.ddp_comm_hook is 'os.system', but ddpscale runs only torch's named hooks"),
    ({"class_path": "pytorch_lightning.strategies.DDPStrategy", "init_args": {"broadcast_buffers": False}},
     "trainer.strategy.init_args.broadcast_buffers is False, but ddpscale sets only find_unused_parameters, "
     "static_graph, gradient_as_bucket_view, bucket_cap_mb and ddp_comm_hook of DDP (config ddp); remove it"),
    ({"class_path": "pytorch_lightning.strategies.DDPStrategy", "init_args": [1]},
     "trainer.strategy.init_args is [1]; give DDPStrategy's arguments by name under it"),
])
def test_another_strategy_or_an_unknown_argument_is_refused_in_one_line(strategy, expected):
    applied = lightningcli.apply({"trainer": {"strategy": strategy}}, ddpscale_config(), "cli.yaml", lambda key: False)
    [problem] = applied.problems
    assert expected in problem and "\n" not in problem and "ddp" not in applied.layer


# -- trainer.logger: kept where it writes files, in each run's folder ----------------------------

@pytest.mark.parametrize("logger,loggers,said", [
    (False, [], None),
    ({"class_path": "lightning.pytorch.loggers.WandbLogger", "init_args": {"project": "x"}}, None,
     "trainer.logger (lightning.pytorch.loggers.WandbLogger: ddpscale keeps only CSVLogger and TensorBoardLogger"),
    ([{"class_path": "pytorch_lightning.loggers.CSVLogger", "init_args": {"flush_logs_every_n_steps": 10}},
      {"class_path": "lightning.pytorch.loggers.TensorBoardLogger"}],
     [{"kind": "csv", "init_args": {"flush_logs_every_n_steps": 10}}, {"kind": "tensorboard", "init_args": {}}], None),
])
def test_trainer_logger_forms(logger, loggers, said):
    applied = lightningcli.apply({"trainer": {"logger": logger}}, ddpscale_config(), "cli.yaml", lambda key: False)
    assert applied.problems == [] and applied.loggers == loggers
    assert (said is None) == (not any(str(o).startswith("trainer.logger (") for o in applied.overridden))
    if said:
        assert any(o.startswith(said) for o in applied.overridden)


@pytest.mark.parametrize("init_args", [{"log_graph": "$(reboot)\n"}, {"flush_logs_every_n_steps": [1]},
                                       {"experiment_key": "x"}])
def test_a_logger_argument_ddpscale_cannot_pass_is_refused_in_one_line(init_args):
    logger = {"class_path": "pytorch_lightning.loggers.CSVLogger", "init_args": init_args}
    problems = lightningcli.apply({"trainer": {"logger": logger}}, ddpscale_config(), "cli.yaml",
                                  lambda key: False).problems
    if "log_graph" in init_args:  # CSVLogger takes no log_graph
        assert problems and "log_graph" in problems[0]
    assert len(problems) == 1 and problems[0].startswith("cli.yaml: trainer.logger CSVLogger's init_args.")


def test_a_tensorboard_logger_without_tensorboard_is_refused_before_any_job(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("tensorboard", "tensorboardX") else real(name, *a))
    logger = {"class_path": "pytorch_lightning.loggers.TensorBoardLogger"}
    problems = lightningcli.apply({"trainer": {"logger": logger}}, ddpscale_config(), "cli.yaml",
                                  lambda key: False).problems
    assert len(problems) == 1 and "needs tensorboard" in problems[0] and ".venv/bin/pip install tensorboard" in problems[0]


@pytest.mark.parametrize("key,value,words", [
    ("limit_train_batches", 0, "0 trains nothing, and an epoch of nothing would be recorded as finished"),
    ("limit_train_batches", 0.0, "0.0 trains nothing"),
    ("limit_train_batches", -3, "a count cannot be negative"),
    ("limit_train_batches", float("nan"), "it is not a number of batches"),
    ("limit_train_batches", 1.5, "a fraction is from 0.0 to 1.0"),
    ("limit_train_batches", 20.0, "for 20 batches write 20 without the decimal point"),
    ("limit_train_batches", True, "it is not a number of batches"),
    ("limit_val_batches", "all", "it is not a number of batches; give a whole number of batches (at least 0)"),
    ("limit_test_batches", float("inf"), "it is not a number of batches"),
    ("gradient_clip_val", -1.0, "it must be a finite number of at least 0"),
    ("gradient_clip_val", float("nan"), "it must be a finite number of at least 0"),
    ("gradient_clip_val", "0.5", "it must be a finite number of at least 0"),
    ("gradient_clip_algorithm", "Norm", "it must be norm or value"),
    ("deterministic", "yes", "it must be true, false or warn"),
    ("sync_batchnorm", "true", "it must be true or false"),
    ("check_val_every_n_epoch", 0, "it must be a whole number of at least 1"),
    ("check_val_every_n_epoch", 2.0, "it must be a whole number of at least 1"),
    ("reload_dataloaders_every_n_epochs", -1, "it must be a whole number of at least 0"),
])
def test_a_trainer_value_every_job_would_fail_or_mislead_on_is_refused_in_one_line(key, value, words):
    """Types and ranges as pl.Trainer 2.6 documents them: limit_train_batches: 0 trained nothing
    and was recorded as finished, 'all' or NaN ended every job."""
    applied = lightningcli.apply({"trainer": {key: value}}, ddpscale_config(), "cli.yaml", lambda key: False)
    assert len(applied.problems) == 1 and key not in applied.trainer_args
    assert applied.problems[0].startswith(f"cli.yaml: trainer.{key} is {value!r}, but ")
    assert words in applied.problems[0]


@pytest.mark.parametrize("key,value", [
    ("limit_train_batches", 5), ("limit_train_batches", 0.25), ("limit_train_batches", 1.0),
    ("limit_val_batches", 0), ("limit_test_batches", 0.0), ("gradient_clip_val", 0), ("gradient_clip_val", 0.5),
    ("gradient_clip_algorithm", "value"), ("deterministic", "warn"), ("benchmark", True),
    ("check_val_every_n_epoch", 3), ("reload_dataloaders_every_n_epochs", 2), ("inference_mode", False),
])
def test_a_trainer_value_lightning_takes_is_passed(key, value):
    applied = lightningcli.apply({"trainer": {key: value}}, ddpscale_config(), "cli.yaml", lambda key: False)
    assert applied.problems == [] and applied.trainer_args == {key: value}


def test_an_explicit_null_init_argument_reaches_the_module_as_none():
    """null over a default that is not None means None; the loader knobs are ddpscale's."""
    cli = {"model": {"class_path": "m.Net", "init_args": {"width": 8, "dropout": None}},
           "data": {"class_path": "m.Data", "init_args": {"root": None, "num_workers": None, "batch_size": None}}}
    applied = lightningcli.apply(cli, ddpscale_config(), "cli.yaml", lambda key: False)
    assert applied.problems == []
    assert applied.config["model"]["init_args"] == {"width": 8, "dropout": None}
    assert applied.config["data"]["init_args"] == {"root": None}
    assert applied.config["dataloader"]["num_workers"] == ddpscale_config()["dataloader"]["num_workers"]


@pytest.mark.parametrize("given,words", [
    ({"class_path": 5}, "optimizer names 5, which is not a class's import path"),
    ("os.system; touch x", "optimizer names 'os.system; touch x', which is not a class's import path"),
    ({"class_path": "torch.optim.SGD", "init_args": [0.1]},
     "optimizer.init_args is [0.1]; give the arguments by name"),
    ({"class_path": "torch.optim.SGD", "dict_kwargs": {}}, "optimizer has 'dict_kwargs', which LightningCLI does not"),
])
def test_an_optimizer_setting_of_the_wrong_shape_is_refused_in_one_line(given, words):
    applied = lightningcli.apply({"optimizer": given}, ddpscale_config(), "cli.yaml", lambda key: False)
    assert len(applied.problems) == 1 and applied.problems[0].startswith("cli.yaml: ") and words in applied.problems[0]
    assert applied.optimizers == {}


def test_the_classes_the_contract_checks_are_named_by_their_import_path():
    cli = {"optimizer": "Adam", "lr_scheduler": {"class_path": "StepLR", "init_args": {"step_size": 2}}}
    applied = lightningcli.apply(cli, ddpscale_config(), "cli.yaml", lambda key: False)
    assert lightningcli.contract_classes(applied) == {
        "optimizer": {"class_path": "torch.optim.Adam", "init_args": {}},
        "lr_scheduler": {"class_path": "torch.optim.lr_scheduler.StepLR", "init_args": {"step_size": 2}}}
    assert lightningcli.contract_classes(None) == {}


@pytest.mark.parametrize("class_path,init_args", [
    ("os.system", lambda marker: {"command": f"touch {marker}"}),
    ("subprocess.run", lambda marker: {"args": ["touch", str(marker)]}),
    ("subprocess.Popen", lambda marker: {"args": ["touch", str(marker)]}),
])
def test_the_run_calls_nothing_but_a_class_of_the_right_kind(tmp_path, class_path, init_args):
    """Defence in depth: the workflow refuses these (tests/workflow/test_workflow_lightningcli.py),
    and the run itself never calls them either."""
    marker = tmp_path / "marker"
    with pytest.raises(TypeError, match=f"optimizer '{class_path}' is not a subclass of torch.optim.Optimizer"):
        lightningcli._instance({"class_path": class_path, "init_args": init_args(marker)}, "optimizer")
    assert not marker.exists()


def test_the_run_builds_the_optimizer_and_scheduler_it_names():
    import torch

    params = [torch.nn.Parameter(torch.zeros(2))]
    optimizer = lightningcli._instance({"class_path": "SGD", "init_args": {"lr": 0.1}}, "optimizer", params)
    assert isinstance(optimizer, torch.optim.SGD)
    plateau = lightningcli._instance("ReduceLROnPlateau", "lr_scheduler", optimizer)
    assert isinstance(plateau, torch.optim.lr_scheduler.ReduceLROnPlateau)
    with pytest.raises(TypeError, match="is not a subclass of torch.optim.lr_scheduler.LRScheduler or "):
        lightningcli._instance("torch.optim.SGD", "lr_scheduler", optimizer)
