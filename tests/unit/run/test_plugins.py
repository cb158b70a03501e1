"""The parse-time import check (ddpscale.run.usermodule.check_importable) finds a user's module where
train.py will import it from: the workflow's working directory, then sys.path."""
import sys

import pytest

from ddpscale.run.usermodule import PluginError, check_importable


@pytest.fixture
def user_root(tmp_path):
    """A repository root holding a user package, as a user would lay it out."""
    (tmp_path / "userpkg").mkdir()
    (tmp_path / "userpkg/__init__.py").write_text("raise RuntimeError('the check must not import me')\n")
    (tmp_path / "userpkg/stripes.py").write_text("class StripesNet: pass\n")
    (tmp_path / "flat.py").write_text("class Model: pass\n")
    return tmp_path


def test_a_module_under_the_root_is_found_without_importing_or_touching_sys_path(user_root, monkeypatch):
    # the console script's sys.path: the working directory is not on it
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(user_root))])
    before = list(sys.path)
    check_importable("userpkg.stripes.StripesNet", "model.class_path", root=str(user_root))
    check_importable("flat.Model", "model.class_path", root=str(user_root))
    assert sys.path == before
    assert "userpkg" not in sys.modules and "flat" not in sys.modules


def test_missing_modules_under_the_root_still_fail_with_the_fix(user_root):
    for path in ("userpkg.nothere.Net", "flat.sub.Model", "nopkg.Model"):
        with pytest.raises(PluginError, match=r"model.class_path: module '.*' of '.*' was not found; .*fix the path"):
            check_importable(path, "model.class_path", root=str(user_root))


@pytest.mark.parametrize("path", ["../../etc/passwd", "/abs/path.Model", "userpkg..stripes.Net", "userpkg.stripes.\nNet",
                                  "user pkg.Net", "SpiralMLP", "", ".flat.Model", "flat.Model.", None])
def test_a_class_path_that_is_not_dotted_identifiers_is_named_with_its_key(user_root, path):
    """A relative path went on to an ImportError that named no key."""
    with pytest.raises(PluginError, match=r"^model.class_path: .* is not an import path; write package.module.ClassName"):
        check_importable(path, "model.class_path", root=str(user_root))


def test_installed_and_scripts_modules_are_still_found(user_root):
    check_importable("ddpscale.workloads.models.SpiralMLP", "model.class_path", root=str(user_root))
    check_importable("json.JSONDecoder", "model.class_path", root=str(user_root))


def test_loader_knobs_reach_a_kwargs_data_module_only_when_the_config_sets_them():
    """A **kwargs module often hands them on to a parent that takes none (the subclass that a
    refusal of Lightning's BoringDataModule suggests failed on num_workers=0)."""
    from ddpscale.run.usermodule import data_init_args

    class Forwards:
        def __init__(self, batch_size, **kwargs):
            pass

    class Names:
        def __init__(self, batch_size, num_workers=0, pin_memory=False):
            pass

    defaults = {"num_workers": 0, "pin_memory": False, "persistent_workers": False, "prefetch_factor": None}
    assert data_init_args(Forwards, {}, 32, defaults, None) == {"batch_size": 32}
    chosen = {**defaults, "num_workers": 4}
    assert data_init_args(Forwards, {}, 32, chosen, None) == {"batch_size": 32, "num_workers": 4}
    assert data_init_args(Names, {}, 32, defaults, None) == {"batch_size": 32, "num_workers": 0, "pin_memory": False}
    with pytest.raises(PluginError, match="dataloader.prefetch_factor is set to 2 but Names does not accept"):
        data_init_args(Names, {}, 32, {**defaults, "prefetch_factor": 2}, None)
