"""The contract between ddpscale and a user's modules, judged while the workflow is parsed.

scripts/contract.py imports model.class_path and data.class_path once and reports facts (did
the module import, which classes it holds, the class's base, what its __init__ takes); this
module turns those facts and the config into one line per problem, each naming the key, the
file that set it and the fix, before any job is submitted. Pure: no torch, no import of the
user's code (the parse stays fast, and the facts are cached by the files' content).
"""

from __future__ import annotations

import difflib
import hashlib
import json

# The knobs of config `dataloader`, passed to a data module whose __init__ takes them.
LOADER_KEYS = ("num_workers", "pin_memory", "persistent_workers", "prefetch_factor")
LOADER_DEFAULTS = {"num_workers": 0, "pin_memory": False, "persistent_workers": False, "prefetch_factor": None}
BASES = {"model": "LightningModule", "data": "LightningDataModule"}
# A LightningCLI config's optimizer and lr_scheduler: what LightningCLI takes (the kinds of
# ddpscale.plan.lightningcli.CLASS_BASES), with an example, and what ddpscale passes first.
CLI_KINDS = {"optimizer": ("an optimizer", "torch.optim.Optimizer", "torch.optim.SGD", "params"),
             "lr_scheduler": ("an LR scheduler", "torch.optim.lr_scheduler.LRScheduler or ReduceLROnPlateau",
                              "torch.optim.lr_scheduler.StepLR", "optimizer")}


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
