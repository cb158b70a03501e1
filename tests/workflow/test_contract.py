"""The user's modules checked while the workflow is parsed (ddpscale.plan.contract): facts read
by importing them once in a process of their own (scripts/contract.py), kept while their files
stay the same (contractfacts), and judged into one line per problem naming key, file and fix."""

from __future__ import annotations

import sys

import pytest

from conftest import ROOT
from ddpscale.plan.configsource import key_source
from ddpscale.plan import contract, contractfacts

SCRIPT = str(ROOT / "scripts/contract.py")
VERSIONS = {"torch": "t", "lightning": "l"}


def user_root(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine/__init__.py").write_text("")
    (tmp_path / "mine/nets.py").write_text(
        "import pytorch_lightning as pl\n\nfrom mine.parts import WIDTH\n\n\n"
        "class Net(pl.LightningModule):\n    def __init__(self, width=WIDTH):\n        super().__init__()\n\n\n"
        "class Data(pl.LightningDataModule):\n    def __init__(self, batch_size, **kwargs):\n        super().__init__()\n")
    (tmp_path / "mine/parts.py").write_text("WIDTH = 8\n")
    return tmp_path


def facts_of(root, model="mine.nets.Net", data="mine.nets.Data") -> contractfacts.Pending:
    return contractfacts.start(sys.executable, SCRIPT, model, data, str(root), VERSIONS)


@pytest.mark.slow
def test_facts_are_read_once_and_kept_while_every_imported_file_is_unchanged(tmp_path):
    root = user_root(tmp_path)
    first = facts_of(root)
    assert first.process is not None, "nothing cached yet: the import runs"
    facts = contractfacts.finish(first)
    assert facts["model"] == {"problem": None, "accepts": ["width"], "required": []}
    assert facts["data"] == {"problem": None, "accepts": None, "required": ["batch_size"]}  # **kwargs
    assert str(root / "mine/parts.py") in facts["files"], "a module the class's module imports counts too"

    again = facts_of(root)
    assert again.process is None and contractfacts.finish(again) == facts, "unchanged files: no import"
    (root / "mine/parts.py").write_text("WIDTH = 16  # changed\n")
    changed = facts_of(root)
    assert changed.process is not None, "a changed file is imported again"
    contractfacts.finish(changed)
    assert facts_of(root).process is None


@pytest.mark.slow
def test_a_failed_import_is_never_kept(tmp_path):
    """Installing the missing package fixes it without changing a file."""
    root = user_root(tmp_path)
    (root / "mine/nets.py").write_text("import not_installed_here\n")
    facts = contractfacts.finish(facts_of(root))
    assert facts["model"]["problem"] == "import" and facts["model"]["missing"] == "not_installed_here"
    assert facts["model"]["where"] == "mine/nets.py, line 1"
    assert facts_of(root).process is not None
    assert not list((root / contractfacts.CACHE_DIR).glob("*.json"))


@pytest.mark.slow
def test_a_module_that_ends_the_process_at_import_is_named_in_one_line(tmp_path):
    root = user_root(tmp_path)
    (root / "mine/nets.py").write_text("import sys\nsys.exit('no GPU here, bye')\n")
    with pytest.raises(ValueError, match=r"importing mine.nets.Net and mine.nets.Data ended the process "
                                         r"\(exit 1\): no GPU here, bye; fix the module"):
        contractfacts.finish(facts_of(root))


def config(**sections):
    base = {"dataset": {"generator": "none"}, "batch": {"scaling": "strong", "size": 64},
            "dataloader": {"num_workers": 0, "pin_memory": False, "persistent_workers": False, "prefetch_factor": None},
            "model": {"class_path": "m.Net", "init_args": {}}, "data": {"class_path": "m.Data", "init_args": {}}}
    base.update(sections)
    return base


OK = {"problem": None, "accepts": ["batch_size", "num_workers"], "required": ["batch_size"]}


def judged(facts, cfg):
    return contract.problems(facts, cfg, lambda path: "my.yaml")


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
