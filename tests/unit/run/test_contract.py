"""The user's modules checked while the workflow is parsed (ddpscale.run.usermodule): the facts
read by importing them judged into one line per problem naming key, file and fix (reading
and keeping those facts: tests/workflow/test_contract.py)."""

from __future__ import annotations

from ddpscale.plan.config.source import key_source
from ddpscale.run import usermodule


def config(**sections):
    base = {"dataset": {"generator": "none"}, "batch": {"scaling": "strong", "size": 64},
            "dataloader": {"num_workers": 0, "pin_memory": False, "persistent_workers": False, "prefetch_factor": None},
            "model": {"class_path": "m.Net", "init_args": {}}, "data": {"class_path": "m.Data", "init_args": {}}}
    base.update(sections)
    return base


OK = {"problem": None, "accepts": ["batch_size", "num_workers"], "required": ["batch_size"]}


def judged(facts, cfg):
    return usermodule.problems(facts, cfg, lambda path: "my.yaml")


def test_a_class_that_is_not_there_is_said_once_without_its_arguments():
    facts = {"model": {"problem": "missing", "classes": ["Net2", "Other"]}, "data": OK}
    assert judged(facts, config()) == ["my.yaml: model.class_path: module 'm' has no 'Net'; did you mean 'Net2'?"]
    facts["model"]["classes"] = ["Zebra"]
    assert judged(facts, config()) == ["my.yaml: model.class_path: module 'm' has no 'Net' (it holds: Zebra)"]


def test_init_arguments_the_class_cannot_take_or_needs():
    facts = {"model": {"problem": None, "accepts": ["width", "depth"], "required": ["width"]}, "data": OK}
    cfg = config(model={"class_path": "m.Net", "init_args": {"widht": 3}})
    assert judged(facts, cfg) == [
        "my.yaml: model.init_args.widht: Net.__init__ takes no 'widht'; did you mean 'width'? (it takes: width, depth)",
        "my.yaml: model.init_args: Net.__init__ needs 'width' (it has no default); give it under model.init_args"]
    anything = {"model": {"problem": None, "accepts": None, "required": []}, "data": OK}
    assert judged(anything, cfg) == [], "**kwargs takes any argument"


def test_what_the_workflow_passes_itself_is_not_asked_of_the_user():
    facts = {"model": {"problem": None, "accepts": [], "required": []},
             "data": {"problem": None, "accepts": ["batch_size", "data_file"], "required": ["batch_size", "data_file"]}}
    cfg = config(dataset={"generator": "spiral"})
    assert judged(facts, cfg) == []
    cfg["dataloader"]["num_workers"] = 2
    assert judged(facts, cfg) == ["my.yaml: dataloader.num_workers is set to 2 but Data does not accept "
                                  "'num_workers'; add it to its __init__ or remove the setting"]


def test_the_file_that_set_a_key_is_named():
    layers = [("config/config.yaml", {"model": {"class_path": "a.B", "init_args": {"x": 1}}, "max_epochs": 3}),
              ("my.yaml", {"model": {"init_args": {"y": 2}}}),
              ("--config", {"max_epochs": 5})]
    assert key_source(("max_epochs",), layers) == "--config"
    assert key_source(("model", "init_args", "x"), layers) == "config/config.yaml"
    assert key_source(("model", "init_args", "y"), layers) == "my.yaml"
    assert key_source(("model", "class_path"), layers) == "config/config.yaml"
    assert key_source(("seed",), layers) == "config/config.yaml + my.yaml + --config", "set by no file: a default"
    # an overlay naming its own class brings its init_args alone (common.smk own_init_args)
    swapped = layers + [("other.yaml", {"model": {"class_path": "c.D"}})]
    assert key_source(("model", "init_args", "x"), swapped) != "config/config.yaml"


def test_a_cli_optimizer_that_is_not_a_class_of_its_kind_is_named_with_the_cli_file():
    facts = {"model": {"problem": None, "accepts": None, "required": []}, "data": OK, "optimizer": {"problem": "base",
             "kind": "a builtin_function_or_method, not a class"},
             "lr_scheduler": {"problem": "base", "kind": "a class of subprocess"}}
    cli = {"optimizer": {"class_path": "os.system", "init_args": {"command": "touch x"}},
           "lr_scheduler": {"class_path": "subprocess.Popen", "init_args": {}}}
    assert usermodule.problems(facts, config(lightning_config="cli.yaml"), lambda path: "my.yaml", cli) == [
        "cli.yaml: optimizer.class_path: 'os.system' is a builtin_function_or_method, not a class, not an optimizer "
        "(a subclass of torch.optim.Optimizer, as LightningCLI requires), and the run would call it; name one, e.g. "
        "torch.optim.SGD",
        "cli.yaml: lr_scheduler.class_path: 'subprocess.Popen' is a class of subprocess, not an LR scheduler (a "
        "subclass of torch.optim.lr_scheduler.LRScheduler or ReduceLROnPlateau, as LightningCLI requires), and the "
        "run would call it; name one, e.g. torch.optim.lr_scheduler.StepLR"]


def test_a_cli_optimizer_s_arguments_are_checked_as_a_module_s_are():
    facts = {"model": {"problem": None, "accepts": None, "required": []}, "data": OK,
             "optimizer": {"problem": None, "accepts": ["params", "lr", "momentum"], "required": ["params"]},
             "lr_scheduler": {"problem": None, "accepts": ["optimizer", "step_size", "gamma"],
                              "required": ["optimizer", "step_size"]}}
    cli = {"optimizer": {"class_path": "torch.optim.SGD", "init_args": {"lr": 0.1, "momentun": 0.9}},
           "lr_scheduler": {"class_path": "torch.optim.lr_scheduler.StepLR", "init_args": {}}}
    assert usermodule.problems(facts, config(lightning_config="cli.yaml"), lambda path: "my.yaml", cli) == [
        "cli.yaml: optimizer.init_args.momentun: SGD.__init__ takes no 'momentun'; did you mean 'momentum'? "
        "(it takes: lr, momentum)",
        "cli.yaml: lr_scheduler.init_args: StepLR.__init__ needs 'step_size' (it has no default); give it under "
        "lr_scheduler.init_args"]
