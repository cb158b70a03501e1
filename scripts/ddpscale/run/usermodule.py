"""The user's modules: loaded from the import paths config names, and the contract they keep.

The job loads the LightningModule and LightningDataModule from model.class_path and
data.class_path (`load_class`, `data_init_args`); before any job is submitted the workflow
checks that they can be (`check_importable` while it parses, then scripts/contract.py imports
them once in a process of its own and reports facts: did the module import, which classes it
holds, the class's base, what its __init__ takes). `problems` turns those facts and the config
into one line per broken piece of the contract, each naming the key, the file that set it and
the fix. Torch-free: the checks never import the user's code in the workflow's process (the
parse stays fast, and the facts are cached by the files' content, plan.contractfacts).
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import importlib.machinery
import importlib.util
import inspect
import json
import os
import re
import sys
import traceback

from ddpscale.run.identity import file_sha256

# The knobs of config `dataloader`, passed to a data module whose __init__ takes them.
LOADER_KEYS = ("num_workers", "pin_memory", "persistent_workers", "prefetch_factor")
LOADER_DEFAULTS = {"num_workers": 0, "pin_memory": False, "persistent_workers": False, "prefetch_factor": None}
BASES = {"model": "LightningModule", "data": "LightningDataModule"}
# A LightningCLI config's optimizer and lr_scheduler: what LightningCLI takes (the kinds of
# ddpscale.run.lightningcli.CLASS_BASES), with an example, and what ddpscale passes first.
CLI_KINDS = {"optimizer": ("an optimizer", "torch.optim.Optimizer", "torch.optim.SGD", "params"),
             "lr_scheduler": ("an LR scheduler", "torch.optim.lr_scheduler.LRScheduler or ReduceLROnPlateau",
                              "torch.optim.lr_scheduler.StepLR", "optimizer")}
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
    """What the contract check needs of one class, importing its module (class_problem
    reads the problems, init_arg_problems the arguments)."""
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


# -- the contract, judged from the facts ----------------------------------------------------------

def _did_you_mean(word: str, choices) -> str:
    match = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"; did you mean '{match[0]}'?" if match else ""


def batch_size_fix(class_path: str) -> str:
    """The three-line subclass that gives a data module the batch_size the workflow passes."""
    name = class_path.rpartition(".")[2]
    return (f"subclass it in a module of yours, `class {name}B({name}): def __init__(self, batch_size, **kwargs): "
            f"super().__init__(**kwargs); self.batch_size = batch_size`, use self.batch_size in its dataloaders, "
            f"and name that class in data.class_path")


def no_batch_size(class_path: str) -> str:
    return (f"{class_path}.__init__ takes no batch_size, and ddpscale sets the batch per device for every "
            f"topology; {batch_size_fix(class_path)}")


def class_problem(section: str, class_path: str, facts: dict) -> str | None:
    """The import, name or base of one class, or None when it is a usable class."""
    module, _, name = class_path.rpartition(".")
    problem = facts.get("problem")
    base = BASES.get(section, "LightningModule")
    if problem == "import":
        missing = facts.get("missing")
        if missing == "lightning":
            return (f"module '{module}' imports 'lightning' (the unified package), but ddpscale trains with "
                    f"pytorch_lightning: write `import pytorch_lightning as pl` and subclass pl.{base} "
                    f"({facts.get('where') or module})")
        fix = f"install {missing} in .venv or remove that import" if missing else "fix the module"
        return f"importing module '{module}' failed: {facts.get('error')} ({facts.get('where') or module}); {fix}"
    if problem == "missing":
        classes = facts.get("classes") or []
        listed = f" (it holds: {', '.join(classes)})" if classes and not _did_you_mean(name, classes) else ""
        return f"module '{module}' has no '{name}'{_did_you_mean(name, classes)}{listed}"
    if problem == "base" and section in CLI_KINDS:
        what, bases, example, _ = CLI_KINDS[section]
        return (f"'{class_path}' is {facts.get('kind', 'not a class')}, not {what} (a subclass of {bases}, as "
                f"LightningCLI requires), and the run would call it; name one, e.g. {example}")
    if problem == "base":
        return (f"'{class_path}' is {facts.get('kind', 'not a class')}, not a {base} (a subclass of "
                f"pytorch_lightning.{base}); name your {base} subclass")
    return None


def init_arg_problems(section: str, class_path: str, facts: dict, init_args: dict, given_by_ddpscale: set) -> list:
    """(key path, text) for each init argument the class cannot take, or needs and is not given."""
    name = class_path.rpartition(".")[2]
    accepts, required = facts.get("accepts"), facts.get("required") or []
    out = []
    if accepts is not None:  # None: **kwargs, anything goes
        for key in init_args:
            if key not in accepts:
                choices = [a for a in accepts if a not in given_by_ddpscale]
                out.append(((section, "init_args", key),
                            f"{section}.init_args.{key}: {name}.__init__ takes no '{key}'{_did_you_mean(key, choices)} "
                            f"(it takes: {', '.join(choices) or 'nothing else'})"))
    for key in required:
        if key not in init_args and key not in given_by_ddpscale:
            out.append(((section, "class_path"),
                        f"{section}.init_args: {name}.__init__ needs '{key}' (it has no default); give it under "
                        f"{section}.init_args"))
    return out


def ddpscale_args(config: dict) -> set:
    """The data module arguments the workflow passes itself."""
    given = {"batch_size", *LOADER_KEYS}
    if config["dataset"]["generator"] != "none":
        given.add("data_file")
    return given


def cli_class_problems(facts: dict, cli_classes: dict, cli_file: str) -> list[str]:
    """A LightningCLI config's optimizer and lr_scheduler (cli_classes: {key: {class_path,
    init_args}}, lightningcli.contract_classes): each a class of its kind taking its arguments."""
    out = []
    for key, given in cli_classes.items():
        found = class_problem(key, given["class_path"], facts.get(key, {}))
        if found:
            out.append(f"{cli_file}: {key}.class_path: {found}")
            continue
        out += [f"{cli_file}: {text}" for _, text in init_arg_problems(
            key, given["class_path"], facts.get(key, {}), given["init_args"], {CLI_KINDS[key][3]})]
    return out


def problems(facts: dict, config: dict, source, cli_classes: dict | None = None) -> list[str]:
    """One line per broken piece of the contract. source(key path) names the file that set it;
    cli_classes: a LightningCLI config's optimizer and lr_scheduler (cli_class_problems)."""
    out = []
    cli = cli_class_problems(facts, cli_classes, config["lightning_config"]) if cli_classes else []

    def say(path, text):
        out.append(f"{source(path)}: {text}")

    for section in ("model", "data"):
        class_path = config[section]["class_path"]
        found = class_problem(section, class_path, facts[section])
        if found:
            say((section, "class_path"), f"{section}.class_path: {found}")
    if out:
        return out + cli  # the arguments of a class that is not there say nothing more
    data, data_path = facts["data"], config["data"]["class_path"]
    accepts = data.get("accepts")
    if accepts is not None and "batch_size" not in accepts:
        say(("data", "class_path"), f"data.class_path: {no_batch_size(data_path)}")
    if config["dataset"]["generator"] != "none" and accepts is not None and "data_file" not in accepts:
        say(("data", "class_path"),
            f"data.class_path: {data_path.rpartition('.')[2]} does not accept 'data_file', but config 'dataset' "
            "generates one; accept it or set dataset.generator: none")
    for knob in LOADER_KEYS:
        value = config["dataloader"][knob]
        if accepts is not None and knob not in accepts and value != LOADER_DEFAULTS[knob]:
            say(("dataloader", knob), f"dataloader.{knob} is set to {value!r} but {data_path.rpartition('.')[2]} "
                                      f"does not accept '{knob}'; add it to its __init__ or remove the setting")
    for path, text in (init_arg_problems("model", config["model"]["class_path"], facts["model"],
                                         config["model"]["init_args"], set())
                       + init_arg_problems("data", data_path, data, config["data"]["init_args"],
                                           ddpscale_args(config))):
        say(path, text)
    return out + cli


def owned_init_args(config: dict, source) -> list[str]:
    """batch_size and loader knobs in data.init_args: the workflow sets them itself, so a value
    there would be replaced silently. Needs no import."""
    out = []
    args = config["data"]["init_args"]
    if "batch_size" in args:
        scaling, size = config["batch"]["scaling"], config["batch"]["size"]
        per = "per device" if scaling == "weak" else "over all devices"
        out.append(f"{source(('data', 'init_args', 'batch_size'))}: data.init_args.batch_size is set, but ddpscale "
                   f"sets the batch per device for every topology from batch.size ({size} {per}, {scaling} "
                   "scaling); remove it and set batch.size instead")
    for knob in LOADER_KEYS:
        if knob in args:
            out.append(f"{source(('data', 'init_args', knob))}: data.init_args.{knob} is set, but ddpscale passes "
                       f"the data loader's knobs itself; remove it and set dataloader.{knob} instead")
    return out


# -- the facts' cache -------------------------------------------------------------------------

def cache_key(model_class: str, data_class: str, root: str, python: str, versions: dict,
              cli_classes: dict | None = None) -> str:
    blob = json.dumps([model_class, data_class, root, python, versions, cli_classes or {}], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def still_valid(cached: dict, digest_of) -> bool:
    """Whether every module file the facts were read from is unchanged (digest_of(path) is its
    sha256 now, None when gone)."""
    files = cached.get("files")
    return isinstance(files, dict) and bool(files) and all(digest_of(p) == d for p, d in files.items())


def cacheable(facts: dict) -> bool:
    """An import that failed may work once a package is installed, without any file changing."""
    return all(facts[s].get("problem") != "import" for s in ("model", "data", *CLI_KINDS) if s in facts)
