"""A LightningCLI config as ddpscale's settings (config `lightning_config`).

Many Lightning users describe their training in the YAML a LightningCLI reads (what
`python main.py fit --print_config` writes): `model:` and `data:` (a class_path and init_args,
or the init arguments alone when the CLI was made with fixed classes), `trainer:` with every
Trainer argument, `seed_everything`, `optimizer` and `lr_scheduler`. ddpscale takes from it the
model, the data and the trainer settings that change what is measured (a DDP strategy's
settings become config ddp, file loggers are kept in each run's folder); it sets per
topology what it owns (devices, nodes, callbacks, the batch per device) and names those as
overridden in one line; a setting it cannot measure under (another strategy than DDP) is
refused in one line.

Pure: the file is read as YAML; nothing is imported (the parse stays fast, the classes are
checked with the rest of the contract); a TensorBoardLogger's package is only looked for.
"""

from __future__ import annotations

import copy
import math
import re
from dataclasses import dataclass, field

from ddpscale.plan.config.check import ALIASES
from ddpscale.plan import ddpsettings
from ddpscale.plan.contract import LOADER_KEYS

# pl.Trainer.__init__'s defaults in pytorch_lightning 2.6, as --print_config writes them; a key
# at its default was not set by the user (tests/workflow/test_lightningcli.py checks the signature).
TRAINER_DEFAULTS = {
    "accelerator": "auto", "strategy": "auto", "devices": "auto", "num_nodes": 1, "precision": None,
    "logger": None, "callbacks": None, "fast_dev_run": False, "max_epochs": None, "min_epochs": None,
    "max_steps": -1, "min_steps": None, "max_time": None, "limit_train_batches": None,
    "limit_val_batches": None, "limit_test_batches": None, "limit_predict_batches": None,
    "overfit_batches": 0.0, "val_check_interval": None, "check_val_every_n_epoch": 1,
    "num_sanity_val_steps": None, "log_every_n_steps": None, "enable_checkpointing": None,
    "enable_progress_bar": None, "enable_model_summary": None, "accumulate_grad_batches": 1,
    "gradient_clip_val": None, "gradient_clip_algorithm": None, "deterministic": None, "benchmark": None,
    "inference_mode": True, "use_distributed_sampler": True, "profiler": None, "detect_anomaly": False,
    "barebones": False, "plugins": None, "sync_batchnorm": False, "reload_dataloaders_every_n_epochs": 0,
    "default_root_dir": None, "enable_autolog_hparams": True, "model_registry": None,
}
# Trainer settings ddpscale has keys of its own for: the CLI's value becomes the config's.
MAPPED = ("max_epochs", "precision", "accumulate_grad_batches")
# Passed to every run's pl.Trainer as they are: they change what is trained and measured, and
# ddpscale's timing measures them as they come.
PASSED = ("gradient_clip_val", "gradient_clip_algorithm", "deterministic", "benchmark", "inference_mode",
          "use_distributed_sampler", "detect_anomaly", "sync_batchnorm", "limit_train_batches",
          "limit_val_batches", "limit_test_batches", "check_val_every_n_epoch", "reload_dataloaders_every_n_epochs")
# Read into ddpscale's own settings where they say DDP (config ddp), refused where they do not.
READ = ("strategy", "logger")
# Set by ddpscale for every topology (or of no use in a benchmark): the CLI's value is overridden.
OWNED = ("accelerator", "devices", "num_nodes", "callbacks", "plugins", "profiler",
         "enable_checkpointing", "enable_progress_bar", "enable_model_summary", "num_sanity_val_steps",
         "log_every_n_steps", "default_root_dir", "enable_autolog_hparams", "model_registry", "barebones",
         "min_epochs", "max_time", "limit_predict_batches")
# Settings under which ddpscale's figures would not mean what they say: refused, with the fix.
REFUSED = {
    "max_steps": "ddpscale measures whole epochs; remove it and set trainer.max_epochs "
                 "(trainer.limit_train_batches shortens an epoch)",
    "min_steps": "ddpscale trains exactly trainer.max_epochs; remove it",
    "fast_dev_run": "a debugging run measures nothing; remove it",
    "overfit_batches": "ddpscale measures training on the whole train set; remove it "
                       "(trainer.limit_train_batches shortens an epoch)",
    "val_check_interval": "validation inside an epoch would split its timed training phase; remove it "
                          "(trainer.check_val_every_n_epoch validates less often)",
}
# trainer.logger: the file loggers a run can keep beside its record (ddpscale.job.build.build_loggers),
# by the packages LightningCLI writes them from, with the arguments a user may set; where they
# write is the run's folder (LOGGER_PLACE, overridden). A logger that sends its figures away
# (W&B, MLflow, Comet, Neptune) would reach the network from every rank of every topology:
# overridden by the run's default logger (Lightning's: ddpscale.job.build.default_logger_kind).
LOGGER_PACKAGES = ("pytorch_lightning.loggers", "lightning.pytorch.loggers")
# Each logger's arguments ddpscale passes on, with their defaults (Lightning 2.6; for
# TensorBoard also tensorboardX's SummaryWriter's), as --print_config writes them all: at its
# default an argument was not set by the user.
LOGGERS = {"CSVLogger": ("csv", {"prefix": "", "flush_logs_every_n_steps": 100}),
           "TensorBoardLogger": ("tensorboard", {"prefix": "", "log_graph": False, "default_hp_metric": True,
                                                 "max_queue": 10, "flush_secs": 120, "filename_suffix": ""})}
# Where a logger writes, with its defaults: the run's folder instead (overridden where set)
LOGGER_PLACE = {"save_dir": None, "root_dir": None, "name": "lightning_logs", "version": None, "sub_dir": None,
                "logdir": None}
# Left at their defaults only: they would change what is written or where
LOGGER_FIXED = {"comment": "", "purge_step": None, "write_to_disk": True, "comet_config": {"disabled": True}}
# trainer.strategy as a class: DDPStrategy by the names LightningCLI writes it with
DDP_CLASS_PATHS = ("pytorch_lightning.strategies.DDPStrategy", "pytorch_lightning.strategies.ddp.DDPStrategy",
                   "lightning.pytorch.strategies.DDPStrategy", "lightning.pytorch.strategies.ddp.DDPStrategy")
# trainer.strategy as a name: Lightning's registered names that mean DDP with popen
DDP_NAMES = {"ddp": {}, "ddp_find_unused_parameters_true": {"find_unused_parameters": True},
             "ddp_find_unused_parameters_false": {"find_unused_parameters": False}}
# DDPStrategy's and DistributedDataParallel's init arguments with their defaults (Lightning 2.6,
# torch 2.13), as --print_config writes them all; one at its default was not set by the user
# (tests/workflow/test_lightningcli.py checks the signatures).
STRATEGY_DEFAULTS = {
    "accelerator": None, "parallel_devices": None, "cluster_environment": None, "checkpoint_io": None,
    "precision_plugin": None, "ddp_comm_state": None, "ddp_comm_hook": None, "ddp_comm_wrapper": None,
    "model_averaging_period": None, "process_group_backend": None, "timeout": "0:30:00", "start_method": "popen",
    "output_device": None, "dim": 0, "broadcast_buffers": None, "init_sync": True, "process_group": None,
    "bucket_cap_mb": None, "find_unused_parameters": False, "check_reduction": False,
    "gradient_as_bucket_view": False, "static_graph": False, "delay_all_reduce_named_params": None,
    "param_to_hook_all_reduce": None, "mixed_precision": None, "device_mesh": None,
    "skip_all_reduce_unused_params": False, "bucket_cap_mb_list": None, "batched_grad_copy": False,
    "forward_sync_buffers": None,
}
# DDPStrategy arguments ddpscale sets per topology (the timeout is config collective_timeout_s)
STRATEGY_OWNED = ("accelerator", "parallel_devices", "cluster_environment", "checkpoint_io", "precision_plugin",
                  "process_group_backend", "timeout", "start_method")
TOP_LEVEL = ("seed_everything", "trainer", "model", "data", "optimizer", "lr_scheduler", "ckpt_path", "weights_only")


# optimizer and lr_scheduler: a class by its import path, or by its name in torch's namespace (as
# LightningCLI reads them), of the kind LightningCLI requires (CLASS_BASES, checked where torch is
# imported: the contract's process and the run itself).
CLASS_NAMESPACES = {"optimizer": "torch.optim", "lr_scheduler": "torch.optim.lr_scheduler"}
CLASS_BASES = {"optimizer": ("torch.optim.Optimizer",),
               "lr_scheduler": ("torch.optim.lr_scheduler.LRScheduler", "torch.optim.lr_scheduler.ReduceLROnPlateau")}
IMPORT_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")


@dataclass
class Applied:
    config: dict  # the ddpscale config with what the CLI file sets
    layer: dict = field(default_factory=dict)  # what it set, as ddpscale keys (the file that set a key)
    trainer_args: dict = field(default_factory=dict)  # for every run's pl.Trainer
    optimizers: dict = field(default_factory=dict)  # LightningCLI's optimizer / lr_scheduler, if given
    overridden: list = field(default_factory=list)  # "trainer.devices (4)", for the one line
    read: list = field(default_factory=list)  # what became ddpscale's settings beyond model and data
    loggers: list | None = None  # trainer.logger as [{"kind", "init_args"}] (None: not set; []: false)
    problems: list = field(default_factory=list)


def _shown(value) -> str:
    return "" if value is None or isinstance(value, (dict, list)) else f" ({value})"


def _module(section: str, given, config: dict, name: str, user_set, out: Applied) -> None:
    """model: / data: of the CLI file into the config's section."""
    if given is None:
        return
    if not isinstance(given, dict):
        out.problems.append(f"{name}: {section} is {given!r}; give class_path and init_args (or the init "
                            "arguments) under it, as --print_config writes them")
        return
    if "class_path" in given:
        class_path, args = given["class_path"], dict(given.get("init_args") or {})
    elif user_set((section, "class_path")):  # a CLI made with a fixed class: ddpscale's config names it
        class_path, args = config[section]["class_path"], dict(given)
    else:
        out.problems.append(
            f"{name}: {section} has no class_path (the LightningCLI was made with a fixed {section} class); "
            f"name the class: class_path and init_args under {section} in {name}, or {section}.class_path in "
            "your ddpscale config")
        return
    # A null is passed as None: --print_config writes null for an argument whose default is None
    # (the same call), and a user who writes null over another default means None.
    if section == "data":
        if args.get("batch_size") is not None:  # null: not set (a required argument --print_config leaves)
            out.overridden.append(f"data batch_size{_shown(args['batch_size'])} (the batch per device "
                                  "comes from batch.size and batch.scaling)")
        args.pop("batch_size", None)
        for knob in LOADER_KEYS:
            if knob in args and args[knob] is None:
                del args[knob]  # not set: ddpscale's dataloader setting stands
            elif knob in args:  # the data loader's knobs are ddpscale's dataloader settings
                out.config["dataloader"][knob] = out.layer.setdefault("dataloader", {})[knob] = args.pop(knob)
    out.config[section] = {**out.config[section], "class_path": class_path, "init_args": args}
    out.layer[section] = {"class_path": class_path, "init_args": args}


def _trainer(given, name: str, out: Applied) -> None:
    if given is None:
        return
    if not isinstance(given, dict):
        out.problems.append(f"{name}: trainer is {given!r}; give the Trainer's arguments under it")
        return
    for key, value in given.items():
        if key not in TRAINER_DEFAULTS:
            out.problems.append(f"{name}: trainer.{key} is not an argument of pytorch_lightning's Trainer "
                                "(2.6); remove it or fix its name")
        elif value == TRAINER_DEFAULTS[key]:
            continue  # not set by the user
        elif key in MAPPED:
            value = ALIASES["precision"].get(str(value), value) if key == "precision" else value
            out.config[key] = out.layer[key] = value
        elif key in PASSED:
            problem = trainer_value_problem(key, value)
            if problem:
                out.problems.append(f"{name}: trainer.{key} is {value!r}, but {problem}")
            else:
                out.trainer_args[key] = value
        elif key == "logger":
            _loggers(value, name, out)
        elif key in READ:
            _strategy(value, name, out)
        elif key in OWNED:
            out.overridden.append(f"trainer.{key}{_shown(value)}")
        else:
            out.problems.append(f"{name}: trainer.{key} is {value!r}, but {REFUSED[key]}")


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _batches_problem(key: str, value) -> str | None:
    """limit_*_batches as Lightning 2.6 reads them (trainer/setup.py, _determine_batch_limits): a
    whole number of batches, or a fraction from 0.0 to 1.0 of them; 0 runs none."""
    least = 1 if key == "limit_train_batches" else 0
    fix = (f"give a whole number of batches (at least {least}) or a fraction of them "
           f"{'above 0.0' if least else 'from 0.0'} up to 1.0 (all of them)")
    if _whole(value):
        if value >= least:
            return None
        why = "0 trains nothing, and an epoch of nothing would be recorded as finished" if value == 0 else (
            "a count cannot be negative")
        return f"{why}; {fix}"
    if isinstance(value, float) and math.isfinite(value):
        if (0.0 < value <= 1.0) or (value == 0.0 and not least):
            return None
        if value > 1.0 and value.is_integer():
            return f"a fraction is at most 1.0; for {int(value)} batches write {int(value)} without the decimal point"
        return f"{'0.0 trains nothing' if value == 0.0 else 'a fraction is from 0.0 to 1.0'}; {fix}"
    return f"it is not a number of batches; {fix}"


def trainer_value_problem(key: str, value) -> str | None:
    """Why a passed Trainer value (PASSED) would fail or mislead in every job, as the rest of one
    line; None when pl.Trainer 2.6 takes it as documented."""
    if key.startswith("limit_"):
        return _batches_problem(key, value)
    if key in ("inference_mode", "use_distributed_sampler", "detect_anomaly", "sync_batchnorm", "benchmark"):
        return None if isinstance(value, bool) else "it must be true or false"
    if key == "deterministic":
        return None if isinstance(value, bool) or value == "warn" else "it must be true, false or warn"
    if key == "gradient_clip_val":
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0
        return None if ok else "it must be a finite number of at least 0 (or null for no clipping)"
    if key == "gradient_clip_algorithm":
        return None if value in ("norm", "value") else "it must be norm or value (or null for norm)"
    least = 1 if key == "check_val_every_n_epoch" else 0
    return None if _whole(value) and value >= least else f"it must be a whole number of at least {least}"


def _loggers(given, name: str, out: Applied) -> None:
    """trainer.logger: false (no logger: the module's self.logger is None), or one or a list of
    CSVLogger and TensorBoardLogger, kept with their own arguments and written in the run's
    folder; any other logger is overridden by the run's default logger."""
    import importlib.util

    if given is False:
        out.loggers = []
        out.read.append("trainer.logger (false): no logger")
        return
    kept, said = [], []
    for entry in given if isinstance(given, list) else [given]:
        path = entry.get("class_path") if isinstance(entry, dict) else entry
        package, _, cls = str(path).rpartition(".")
        if not (isinstance(entry, dict) and cls in LOGGERS and package.startswith(LOGGER_PACKAGES)):
            out.overridden.append(f"trainer.logger ({path}: ddpscale keeps only CSVLogger and TensorBoardLogger, "
                                  "written in each run's folder)")
            continue
        kind, settable = LOGGERS[cls]
        init_args = entry.get("init_args") or {}
        if not isinstance(init_args, dict):
            out.problems.append(f"{name}: trainer.logger {cls}'s init_args is {init_args!r}; give its arguments "
                                "by name under it")
            continue
        if kind == "tensorboard" and not any(importlib.util.find_spec(m) for m in ("tensorboard", "tensorboardX")):
            out.problems.append(f"{name}: trainer.logger is a TensorBoardLogger, which needs tensorboard, and "
                                ".venv has neither tensorboard nor tensorboardX; install one (.venv/bin/pip "
                                "install tensorboard) or remove the logger (every run then has a CSVLogger, "
                                "Lightning's default without tensorboard)")
            continue
        args = {}
        for key, value in init_args.items():
            if key in LOGGER_PLACE:
                if value != LOGGER_PLACE[key]:
                    out.overridden.append(f"trainer.logger.init_args.{key}{_shown(value)} (the run's folder)")
            elif key in settable and type(value) is type(settable[key]):
                if value != settable[key]:
                    args[key] = value
            elif key in LOGGER_FIXED and value == LOGGER_FIXED[key]:
                continue
            else:
                out.problems.append(f"{name}: trainer.logger {cls}'s init_args.{key} is {value!r}; ddpscale "
                                    f"passes only {', '.join(settable)} (it writes in each run's folder); remove it")
        kept.append({"kind": kind, "init_args": args})
        said.append(cls)
    if kept:
        out.loggers = kept
        out.read.append(f"trainer.logger ({', '.join(said)}): written in each run's folder")


def _strategy(given, name: str, out: Applied) -> None:
    """trainer.strategy: DDP (by name or as DDPStrategy with init_args) becomes config ddp, the
    CLI file's value winning as it does for max_epochs; any other strategy is refused."""
    refuse = ("but ddpscale measures DDP, built per topology; use ddp, ddp_find_unused_parameters_true "
              "or pytorch_lightning.strategies.DDPStrategy, or remove it and set ddp: in your ddpscale config")
    if isinstance(given, str) and given.lower() in DDP_NAMES:
        settings, shown = dict(DDP_NAMES[given.lower()]), given
    elif isinstance(given, str):
        out.problems.append(f"{name}: trainer.strategy is {given!r}, {refuse}")
        return
    elif isinstance(given, dict) and given.get("class_path") in DDP_CLASS_PATHS:
        settings, shown = _ddp_init_args(given.get("init_args") or {}, name, out), "DDPStrategy"
        if settings is None:
            return
    else:
        what = given.get("class_path") if isinstance(given, dict) else given
        out.problems.append(f"{name}: trainer.strategy is {what!r}, {refuse}")
        return
    for key, value in settings.items():
        out.config.setdefault("ddp", {})[key] = out.layer.setdefault("ddp", {})[key] = value
    out.read.append(f"trainer.strategy ({shown}) as ddp: {ddpsettings.said(settings)}")


def _ddp_init_args(init_args, name: str, out: Applied) -> dict | None:
    """DDPStrategy's init_args as config ddp's keys; None (and one problem each) if any is refused."""
    if not isinstance(init_args, dict):
        out.problems.append(f"{name}: trainer.strategy.init_args is {init_args!r}; give DDPStrategy's "
                            "arguments by name under it")
        return None
    settings, refused = {}, False
    for key, value in init_args.items():
        at = f"{name}: trainer.strategy.init_args.{key}"
        if key not in STRATEGY_DEFAULTS:
            out.problems.append(f"{at} is not an argument of DDPStrategy or DistributedDataParallel; remove it "
                                "or fix its name")
        elif value is None or value == STRATEGY_DEFAULTS[key]:
            continue  # --print_config writes every argument; at its default the user did not set it
        elif key == "ddp_comm_hook" and value in ddpsettings.HOOK_PATHS:
            settings["comm_hook"] = ddpsettings.HOOK_PATHS[value]
            continue
        elif key in ddpsettings.DEFAULTS:
            settings[key] = value
            continue
        elif key in STRATEGY_OWNED:
            out.overridden.append(f"trainer.strategy.init_args.{key}{_shown(value)}")
            continue
        elif key == "ddp_comm_hook":
            out.problems.append(f"{at} is {value!r}, but ddpscale runs only torch's named hooks "
                                f"({', '.join(ddpsettings.HOOK_PATHS)}); name one of them, or remove it")
        else:
            out.problems.append(f"{at} is {value!r}, but ddpscale sets only "
                                f"{', '.join(k for k in ddpsettings.DEFAULTS if k != 'comm_hook')} and "
                                "ddp_comm_hook of DDP (config ddp); remove it")
        refused = True
    return None if refused else settings


def apply(cli, config: dict, name: str, user_set) -> Applied:
    """The config with the CLI file's model, data and trainer settings. user_set(key path) says
    whether a file other than config/config.yaml set a ddpscale key (a fixed-class CLI's class, a
    dataset the user chose)."""
    out = Applied(copy.deepcopy(config))
    if not isinstance(cli, dict):
        out.problems.append(f"{name}: a LightningCLI config is a mapping of model, data, trainer, ...; "
                            f"this file holds {type(cli).__name__}")
        return out
    for key in cli:
        if key not in TOP_LEVEL:
            out.problems.append(f"{name}: '{key}' is not a key of a LightningCLI fit config (those are "
                                f"{', '.join(TOP_LEVEL)}); remove it")
    _module("model", cli.get("model"), config, name, user_set, out)
    _module("data", cli.get("data"), config, name, user_set, out)
    if "data" in out.layer and not user_set(("dataset", "generator")):
        # the CLI's data module brings its own data: no spiral dataset to generate for it
        out.config["dataset"]["generator"] = out.layer.setdefault("dataset", {})["generator"] = "none"
    _trainer(cli.get("trainer"), name, out)
    seed = cli.get("seed_everything")
    if isinstance(seed, int) and not isinstance(seed, bool):
        out.config["seed"] = out.layer["seed"] = seed
    elif seed is True:
        out.overridden.append(f"seed_everything (true: ddpscale seeds repeat r of every topology with seed "
                              f"{config['seed']} + r, so that topologies train alike and repeats are seeds)")
    for key in CLASS_NAMESPACES:
        if cli.get(key) is not None:
            problem = class_setting_problem(key, cli[key])
            if problem:
                out.problems.append(f"{name}: {problem}")
            else:
                out.optimizers[key] = cli[key]
    if "lr_scheduler" in out.optimizers and "optimizer" not in out.optimizers:
        out.problems.append(f"{name}: lr_scheduler is set without an optimizer, and LightningCLI schedules only "
                            "an optimizer it made; set optimizer too, or schedule in configure_optimizers")
    for key in ("ckpt_path", "weights_only"):
        if cli.get(key) is not None:
            out.overridden.append(f"{key}{_shown(cli[key])} (ddpscale resumes from its own checkpoints)")
    return out


def class_path_of(given, key: str) -> str:
    """The import path an optimizer / lr_scheduler setting names (a bare name is torch's)."""
    class_path = given if isinstance(given, str) else given["class_path"]
    return class_path if "." in class_path else f"{CLASS_NAMESPACES[key]}.{class_path}"


def class_setting_problem(key: str, given) -> str | None:
    """The shape of an optimizer / lr_scheduler setting: a class name, or class_path and init_args."""
    fix = (f"write {key}: {{class_path: {CLASS_NAMESPACES[key]}.{'SGD' if key == 'optimizer' else 'StepLR'}, "
           "init_args: {...}}, as --print_config writes it")
    if isinstance(given, dict):
        unknown = sorted(str(k) for k in given if k not in ("class_path", "init_args"))
        if unknown:
            return f"{key} has {', '.join(map(repr, unknown))}, which LightningCLI does not read here; {fix}"
        class_path, init_args = given.get("class_path"), given.get("init_args")
        if init_args is not None and not (isinstance(init_args, dict) and all(isinstance(k, str) for k in init_args)):
            return f"{key}.init_args is {init_args!r}; give the arguments by name under it"
    else:
        class_path = given
    if not (isinstance(class_path, str) and IMPORT_NAME.fullmatch(class_path)):
        return f"{key} names {class_path!r}, which is not a class's import path; {fix}"
    return None


def contract_classes(applied: Applied | None) -> dict[str, dict]:
    """{'optimizer': {class_path, init_args}, ...}: the classes the contract's process checks for
    their kind and arguments (ddpscale.plan.contract.cli_class_problems)."""
    return {key: {"class_path": class_path_of(given, key),
                  "init_args": {} if isinstance(given, str) else dict(given.get("init_args") or {})}
            for key, given in (applied.optimizers if applied else {}).items()}


def read_line(name: str, applied: Applied) -> str | None:
    """The one line naming what the CLI file set beyond model, data and trainer arguments."""
    if not applied.read:
        return None
    return f"ddpscale: {name}: read into ddpscale's settings: {'; '.join(applied.read)}"


def overridden_line(name: str, applied: Applied) -> str | None:
    """The one line naming what ddpscale sets instead of the CLI file."""
    if not applied.overridden:
        return None
    return f"ddpscale: {name}: set by ddpscale for every topology, so overridden: {'; '.join(applied.overridden)}"


# -- in the run: LightningCLI's optimizer and lr_scheduler ----------------------------------------

def _instance(given, key: str, *first):
    """A class_path (+ init_args) setting, or a bare class name of torch's namespace, built; only a
    class of the kind LightningCLI takes is called (the workflow checked it too, in the contract's
    process, but a run never calls a function a config names)."""
    import importlib
    import inspect

    class_path = class_path_of(given, key)
    init = {} if isinstance(given, str) else given.get("init_args") or {}
    bases = tuple(getattr(importlib.import_module(b.rpartition(".")[0]), b.rpartition(".")[2])
                  for b in CLASS_BASES[key])
    module, _, name = class_path.rpartition(".")
    found = getattr(importlib.import_module(module), name, None)
    if not (inspect.isclass(found) and issubclass(found, bases)):
        raise TypeError(f"{key} {class_path!r} is not a subclass of {' or '.join(CLASS_BASES[key])}; "
                        "LightningCLI takes only such a class")
    return found(*first, **init)


def attach_optimizers(model, spec: dict) -> None:
    """The model's configure_optimizers becomes what LightningCLI makes of its optimizer and
    lr_scheduler settings (it replaces the model's own there too): the optimizer alone, or it with
    its scheduler (ReduceLROnPlateau with the metric it monitors)."""
    import types

    def configure_optimizers(self):
        optimizer = _instance(spec["optimizer"], "optimizer", self.parameters())
        if "lr_scheduler" not in spec:
            return optimizer
        scheduler = _instance(spec["lr_scheduler"], "lr_scheduler", optimizer)
        monitor = getattr(scheduler, "monitor", None)
        if monitor:
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "monitor": monitor}}
        return [optimizer], [scheduler]

    model.configure_optimizers = types.MethodType(configure_optimizers, model)
