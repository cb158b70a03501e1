"""Load the user's LightningModule / LightningDataModule from an import path in config."""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import inspect
import sys

LOADER_KEYS = ("num_workers", "pin_memory", "persistent_workers", "prefetch_factor")
# The built-in workloads moved into ddpscale.workloads; a config written before names the old
# module, and the error says what to write instead.
MOVED = {f"ddpscale.{name}": f"ddpscale.workloads.{name}" for name in (
    "models", "spiral_datamodule", "markov_datamodule", "synthetic_datamodule", "transformer", "resident")}


class PluginError(ValueError):
    """An import path or init argument in config that cannot work; names the fix."""


def split_path(path: str, key: str) -> tuple[str, str]:
    module, _, name = path.rpartition(".")
    if not module or not name:
        raise PluginError(f"{key}: '{path}' is not an import path; write package.module.ClassName")
    return module, name


def find_under(module: str, root: str):
    """The spec of `module` found under the folder `root` alone, or None.

    Walks the dotted name one package at a time with the path finder, so nothing is imported
    and sys.path is left as it was (a parse-time check must not change what later imports see).
    """
    search = [root]
    spec = None
    parts = module.split(".")
    for depth in range(len(parts)):
        spec = importlib.machinery.PathFinder.find_spec(".".join(parts[: depth + 1]), search)
        if spec is None:
            return None
        if depth < len(parts) - 1:
            search = list(spec.submodule_search_locations or [])
            if not search:
                return None  # a plain module cannot hold submodules
    return spec


def check_importable(path: str, key: str, root: str | None = None) -> None:
    """Cheap check, without importing the module, made before any job is submitted.

    `root` is the folder train.py runs in (the workflow's working directory): train.py puts it
    first on sys.path (load_class), so a module there is found as train.py will find it. The
    console script `snakemake` does not have that folder on sys.path (`python -m snakemake`
    does), so it is searched here explicitly.
    """
    module, name = split_path(path, key)
    if module in MOVED:
        raise PluginError(f"{key}: '{path}' moved to '{MOVED[module]}.{name}'; write that in config/config.yaml")
    found = find_under(module, root) if root is not None else None
    if found is None:
        try:
            found = importlib.util.find_spec(module)
        except ModuleNotFoundError:
            found = None
    if found is None:
        raise PluginError(
            f"{key}: module '{module}' of '{path}' was not found; it must be importable from "
            "the repository root or an installed package (fix the path in config/config.yaml)"
        )


def load_class(path: str, key: str, base: type):
    module_name, name = split_path(path, key)
    if "" not in sys.path and "." not in sys.path:
        sys.path.insert(0, "")  # user code next to the workflow, run from the repository root
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        raise PluginError(f"{key}: cannot import module '{module_name}' ({err}); fix the path in config/config.yaml") from err
    cls = getattr(module, name, None)
    if cls is None:
        raise PluginError(f"{key}: module '{module_name}' has no '{name}'; fix the path in config/config.yaml")
    if not (inspect.isclass(cls) and issubclass(cls, base)):
        raise PluginError(f"{key}: '{path}' is not a {base.__name__} subclass")
    return cls


def accepted(cls) -> set[str] | None:
    """Names the class's __init__ takes; None when it takes **kwargs (accepts anything)."""
    params = inspect.signature(cls.__init__).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return {p.name for p in params}


def data_init_args(cls, user_args: dict, batch_size: int, loader: dict, data_file: str | None,
                   key: str = "data") -> dict:
    """The pipeline's arguments for a data module, merged with the user's.

    Contract: a data module takes `batch_size` (per device, set by the scaling mode); it takes
    `data_file` when the workflow generates its dataset; the loader knobs are passed where it
    accepts them, and a knob set away from its default that it cannot take is an error.
    """
    names = accepted(cls)
    args = dict(user_args)
    if names is not None and "batch_size" not in names:
        raise PluginError(f"{key}.class_path: {cls.__name__} must accept 'batch_size' (the per-device batch)")
    args["batch_size"] = batch_size
    if data_file is not None:
        if names is not None and "data_file" not in names:
            raise PluginError(
                f"{key}.class_path: {cls.__name__} does not accept 'data_file', but config "
                "'dataset' generates one; accept it or set dataset.generator: none"
            )
        args["data_file"] = data_file
    defaults = {"num_workers": 0, "pin_memory": False, "persistent_workers": False, "prefetch_factor": None}
    for name in LOADER_KEYS:
        if names is None or name in names:
            args[name] = loader[name]
        elif loader[name] != defaults[name]:
            raise PluginError(
                f"dataloader.{name} is set to {loader[name]!r} but {cls.__name__} does not accept "
                f"'{name}'; add it to its __init__ or remove the setting"
            )
    return args
