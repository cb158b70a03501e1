"""Load the user's LightningModule / LightningDataModule from an import path in config."""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import inspect
import os
import re
import sys
import traceback

from ddpscale.plan.contract import LOADER_DEFAULTS, LOADER_KEYS, no_batch_size
from ddpscale.plan.identity import file_sha256
# The built-in workloads moved into ddpscale.workloads; a config written before names the old
# module, and the error says what to write instead.
MOVED = {f"ddpscale.{name}": f"ddpscale.workloads.{name}" for name in (
    "models", "spiral_datamodule", "markov_datamodule", "synthetic_datamodule", "transformer", "resident")}


class PluginError(ValueError):
    """An import path or init argument in config that cannot work; names the fix."""


# Python identifiers joined by dots, the whole text: a relative path ("../x"), a newline or a
# space is named as this key's mistake rather than met as an ImportError naming no key.
IMPORT_PATH = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)+")


def split_path(path: str, key: str) -> tuple[str, str]:
    if not isinstance(path, str) or not IMPORT_PATH.fullmatch(path):
        raise PluginError(f"{key}: {path!r} is not an import path; write package.module.ClassName")
    module, _, name = path.rpartition(".")
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
        raise PluginError(f"{key}: '{path}' moved to '{MOVED[module]}.{name}'; write that instead")
    found = find_under(module, root) if root is not None else None
    if found is None:
        try:
            found = importlib.util.find_spec(module)
        except ModuleNotFoundError:
            found = None
    if found is None:
        raise PluginError(
            f"{key}: module '{module}' of '{path}' was not found; it must be importable from "
            "the repository root or an installed package (fix the path)"
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
    names them, and a knob set away from its default that it cannot take is an error. A module
    taking **kwargs gets a knob only when the config sets it: such a module often hands its
    kwargs to a parent that takes no such argument (the subclass a refusal of Lightning's
    BoringDataModule suggests did, and failed on num_workers=0).
    """
    names = accepted(cls)
    args = dict(user_args)
    if names is not None and "batch_size" not in names:
        raise PluginError(f"{key}.class_path: {no_batch_size(f'{cls.__module__}.{cls.__qualname__}')}")
    args["batch_size"] = batch_size
    if data_file is not None:
        if names is not None and "data_file" not in names:
            raise PluginError(
                f"{key}.class_path: {cls.__name__} does not accept 'data_file', but config "
                "'dataset' generates one; accept it or set dataset.generator: none"
            )
        args["data_file"] = data_file
    for name in LOADER_KEYS:
        chosen = loader[name] != LOADER_DEFAULTS[name]
        if (names is None and chosen) or (names is not None and name in names):
            args[name] = loader[name]
        elif names is not None and chosen:
            raise PluginError(
                f"dataloader.{name} is set to {loader[name]!r} but {cls.__name__} does not accept "
                f"'{name}'; add it to its __init__ or remove the setting"
            )
    return args


# -- facts for the parse-time contract check (scripts/contract.py) -------------------------------

def _user_frame(tb, root: str) -> str | None:
    """'file:line' of the deepest frame of a traceback in the user's files (under root)."""
    found = None
    for frame in traceback.extract_tb(tb):
        path = os.path.abspath(frame.filename)
        if path.startswith(os.path.abspath(root) + os.sep):
            found = f"{os.path.relpath(path, root)}, line {frame.lineno}"
    return found


def class_facts(path: str, base: type, root: str) -> dict:
    """What the contract check needs of one class, importing its module (contract.class_problem
    reads the problems, contract.init_arg_problems the arguments)."""
    module_name, name = path.rpartition(".")[::2]
    try:
        module = importlib.import_module(module_name)
    except Exception as err:  # noqa: BLE001 - whatever a user's module raises at import
        first = str(err).splitlines()[0] if str(err) else "no detail"
        return {"problem": "import", "error": f"{type(err).__name__}: {first}",
                "missing": err.name if isinstance(err, ModuleNotFoundError) else None,
                "where": _user_frame(err.__traceback__, root)}
    cls = getattr(module, name, None)
    if cls is None:
        return {"problem": "missing", "classes": sorted(n for n, v in vars(module).items()
                                                        if inspect.isclass(v) and not n.startswith("_"))}
    if not (inspect.isclass(cls) and issubclass(cls, base)):
        kind = f"a class of {cls.__module__}" if inspect.isclass(cls) else f"a {type(cls).__name__}, not a class"
        return {"problem": "base", "kind": kind}
    params = [p for p in inspect.signature(cls.__init__).parameters.values()][1:]  # after self
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
    named = [p for p in params if p.kind not in (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL)]
    return {"problem": None, "accepts": None if takes_any else [p.name for p in named],
            "required": [p.name for p in named if p.default is inspect.Parameter.empty]}


def sha256_of(path: str) -> str | None:
    """identity.file_sha256, or None when the file cannot be read (gone since it was imported)."""
    try:
        return file_sha256(path)
    except OSError:
        return None


# The pinned stack: its versions are part of the facts' cache key, its files need no hash.
STACK_PACKAGES = {"torch", "pytorch_lightning", "lightning_fabric", "lightning_utilities", "torchmetrics"}


def loaded_files(root: str, packages: set[str]) -> dict[str, str]:
    """sha256 of every imported module file under root or in one of packages (the user's top-level
    packages, wherever installed): what the facts were read from."""
    root = os.path.abspath(root)
    files = {}
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        top = name.split(".")[0]
        if not path or not path.endswith(".py") or top in STACK_PACKAGES:
            continue
        path = os.path.abspath(path)
        if path.startswith(root + os.sep) or top in packages:
            digest = sha256_of(path)
            if digest:
                files[path] = digest
    return files
