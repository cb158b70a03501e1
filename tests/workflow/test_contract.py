"""The user's modules checked while the workflow is parsed: facts read by importing them once in
a process of their own (scripts/contract.py), kept while their files stay the same
(ddpscale.plan.contractfacts) (the facts judged into one line per problem naming key, file and
fix: tests/unit/run/test_contract.py)."""

from __future__ import annotations

import shutil
import sys

import pytest

from helpers.workflow import ROOT
from ddpscale.plan import contractfacts

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


@pytest.mark.slow
def test_a_module_that_prints_at_import_is_a_valid_module(tmp_path):
    """The facts travel in a file of their own: what a module prints (print, or a write on fd 1)
    goes to stderr and cannot corrupt them."""
    shutil.copytree(ROOT / "tests/fixtures/usermods", tmp_path / "usermods")
    pending = facts_of(tmp_path, "usermods.noisy.NoisyNet", "usermods.noisy.NoisyData")
    assert pending.process is not None
    facts = contractfacts.finish(pending)
    assert facts["model"] == {"problem": None, "accepts": ["width", "dropout"], "required": []}
    assert facts["data"] == {"problem": None, "accepts": ["batch_size", "num_workers"], "required": ["batch_size"]}


@pytest.mark.slow
@pytest.mark.parametrize("optimizer,kind", [
    ("os.system", "a builtin_function_or_method, not a class"),
    ("subprocess.Popen", "a class of subprocess"),
])
def test_an_optimizer_that_is_not_an_optimizer_class_is_named_never_called(tmp_path, optimizer, kind):
    """The contract's process imports the named module and looks at the attribute; it calls nothing."""
    root = user_root(tmp_path)
    cli = {"optimizer": {"class_path": optimizer, "init_args": {"command": "touch marker"}},
           "lr_scheduler": {"class_path": "torch.optim.lr_scheduler.StepLR", "init_args": {"step_size": 1}}}
    facts = contractfacts.finish(contractfacts.start(sys.executable, SCRIPT, "mine.nets.Net", "mine.nets.Data",
                                                     str(root), VERSIONS, cli))
    assert facts["optimizer"] == {"problem": "base", "kind": kind}
    assert facts["lr_scheduler"]["problem"] is None
    assert not (root / "marker").exists()
