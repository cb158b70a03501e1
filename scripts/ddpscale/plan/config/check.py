"""Config checks made while the workflow is parsed: each problem is one line naming key and fix.

Snakemake's own `validate` prints the schema and the config for one misspelt key (401 lines
for a top-level key of config/config.yaml, with the message on line 4), so the schema is checked here first and each error rewritten as one line.
The checks the schema cannot express (keys that depend on each other, a dataset too small for
the batch) run on the validated config, with the schema's defaults filled in. Pure functions:
no I/O, no torch, so a dry run stays fast and the tests need no workflow.
"""

from __future__ import annotations

import difflib
import math
import os
import re

import yaml

from ddpscale.core.io import CONTROL_CHARACTER, terminal_safe
from ddpscale.core.layout import experiment_name, layout, reserved_problem
from ddpscale.run.topology import Topology
from ddpscale.run import ddpsettings
from ddpscale.run.lightningcli import ALIASES
from ddpscale.plan.config.source import DEFAULT_CONFIG
from ddpscale.core.spiral import split_sizes

SPIRAL_MODULE = "ddpscale.workloads.spiral_datamodule.SpiralDataModule"
JSON_TYPES = {"object": "a mapping of keys", "array": "a list", "string": "text", "integer": "a whole number",
              "number": "a number", "boolean": "true or false", "null": "null"}


def key_name(path) -> str:
    """['dataset', 'split', 0] -> 'dataset.split[0]'; [] -> 'the config'."""
    name = ""
    for part in path:
        name += f"[{part}]" if isinstance(part, int) else (f".{part}" if name else str(part))
    return name or "the config"




def shown(value) -> str:
    """A value as the user wrote it in YAML, with what YAML made of it when that surprises."""
    if value is None:
        return "empty (null)"
    if isinstance(value, bool):
        return f"{str(value).lower()} (true/false)"
    if isinstance(value, str):
        # a control character is shown escaped: a newline would split the one-line message
        return f"'{terminal_safe(value)}'"
    return repr(value)


def closest(word, choices, key: str = "") -> str:
    alias = ALIASES.get(key, {}).get(str(word).lower())
    if alias:
        return f"; did you mean '{alias}'?"
    match = difflib.get_close_matches(str(word).lower(), [str(c) for c in choices], n=1, cutoff=0.6)
    return f"; did you mean '{match[0]}'?" if match else ""


def _type_problem(key: str, value, expected, schema: dict) -> str:
    wanted = [expected] if isinstance(expected, str) else list(expected)
    names = " or ".join(JSON_TYPES.get(t, t) for t in wanted)
    fix = f"give {names}"
    if isinstance(value, str) and {"integer", "number"} & set(wanted):
        try:
            number = float(value)
        except ValueError:
            pass
        else:
            text = value.strip()
            fix = f"write {text} without quotes" if "integer" not in wanted or number.is_integer() else fix
    elif isinstance(value, str) and "array" in wanted:
        parts = [p.strip() for p in value.replace(";", ",").split(",") if p.strip()]
        fix = "write a list in brackets, e.g. [" + ", ".join(f'"{p}"' for p in parts) + "]"
    elif value is None and "object" in wanted:
        fix = f"give its keys indented below it, or remove the '{key.rpartition('.')[2]}:' line for the defaults"
    elif "object" in wanted and schema.get("properties"):
        first = next(iter(schema["properties"]))
        fix = (f"give its keys ({', '.join(schema['properties'])}) indented below it, "
               f"e.g. {first}: {value}" if isinstance(value, str) else f"give its keys ({', '.join(schema['properties'])})")
    elif "object" in wanted:
        fix = "give it as name: value lines indented below it (each argument by its name)"
    elif isinstance(value, bool) and "string" in wanted:
        fix = "quote the value, or use one of the allowed words"
    elif isinstance(value, (int, float)) and "string" in wanted:
        alias = ALIASES.get(key, {}).get(str(value))
        fix = f"write '{alias}'" if alias else f"write it in quotes: \"{value}\""
    return f"{key} is {shown(value)}{' (text)' if isinstance(value, str) else ''} but must be {names}; {fix}"


def schema_error_message(error, where) -> str:
    """One jsonschema ValidationError as one line: where (the file that set the key, when `where`
    is a function of the key's path), key, what is wrong, how to fix it."""
    key = key_name(error.absolute_path)
    value, rule, limit = error.instance, error.validator, error.validator_value
    about = error.schema.get("description")
    path = tuple(error.absolute_path)
    if rule == "additionalProperties":
        known = sorted(error.schema.get("properties", {}))
        unknown = sorted(k for k in value if k not in known)
        path += (unknown[0],)
    where = where(path) if callable(where) else where
    if rule == "additionalProperties":
        section = "at the top level" if key == "the config" else f"in {key}"
        hints = [closest(k, known) for k in unknown]
        fix = hints[0] if len(unknown) == 1 and hints[0] else f"; the keys allowed there are {', '.join(known)}"
        return f"{where}: unknown key {', '.join(repr(k) for k in unknown)} {section}{fix} (a misspelt key is never ignored)"
    if rule == "type":
        text = _type_problem(key, value, limit, error.schema)
    elif rule == "enum":
        choices = ", ".join(str(c) for c in limit)
        text = f"{key} is {shown(value)} but must be one of: {choices}{closest(value, limit, key)}"
        if isinstance(value, bool):
            text += " (YAML reads yes/no/true/false as true/false: quote the word)"
    elif rule in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"):
        bound = {"minimum": "at least", "exclusiveMinimum": "greater than",
                 "maximum": "at most", "exclusiveMaximum": "less than"}[rule]
        text = f"{key} is {value!r}; it must be {bound} {limit}"
        if rule == "maximum" and limit == 1 and isinstance(value, (int, float)) and 1 < value <= 100:
            text += f" (a fraction: {value}% is {value / 100:g})"
    elif rule == "pattern" and key.startswith("topologies["):
        text = (f"{key} is {shown(value)}, which is not a topology; write NODESxDEVICES, e.g. '1x4' "
                "for one node with 4 devices or '2x4' for two such nodes")
    elif rule == "pattern" and limit.startswith("^") and limit.endswith("$") and limit[1:-1].isalpha():
        # a number or one word (repeats: auto): name both, not the regular expression
        text = f"{key} is {shown(value)}; it must be a whole number or {limit[1:-1]} (without quotes for a number)"
    elif rule == "pattern":
        text = f"{key} is {shown(value)}, which does not have the form {limit}; fix it"
    elif rule in ("minItems", "maxItems"):
        bound = "at least" if rule == "minItems" else "at most"
        text = f"{key} has {len(value)} entries but needs {bound} {limit}; fix the list"
    else:
        text = f"{key}: {error.message}; fix it"
    return f"{where}: {text}" + (f" ({key}: {about.strip()})" if about and rule != "type" else "")


def schema_problems(config: dict, schema: dict, where: str = DEFAULT_CONFIG) -> list[str]:
    """Every violation of the schema, one line each, outermost key first."""
    # imported here: train.py imports this module's constants, and a GPU node's shared Python
    # may have the training stack without jsonschema, which only the workflow's parse needs
    from jsonschema import Draft202012Validator

    errors = sorted(Draft202012Validator(schema).iter_errors(config), key=lambda e: [str(p) for p in e.absolute_path])
    # A value of the wrong type fails its enum or bounds too: the type says it best, once.
    mistyped = {tuple(e.absolute_path) for e in errors if e.validator == "type"}
    named = {tuple(e.absolute_path) for e in errors}
    return [schema_error_message(e, where) for e in errors
            if e.validator == "type" or tuple(e.absolute_path) not in mistyped] + [
        non_finite_message(path, value, where) for path, value in non_finite(config) if path not in named]


def non_finite(tree, path=()) -> list[tuple[tuple, float]]:
    """(path, value) of every NaN or infinite number (YAML's .nan, .inf): every comparison with
    NaN is false, so the schema's bounds let it through, and a bound-less key takes .inf."""
    if isinstance(tree, dict):
        return [found for key, value in tree.items() for found in non_finite(value, (*path, key))]
    if isinstance(tree, list):
        return [found for i, value in enumerate(tree) for found in non_finite(value, (*path, i))]
    return [(path, tree)] if isinstance(tree, float) and not math.isfinite(tree) else []


def non_finite_message(path: tuple, value: float, where) -> str:
    where = where(path) if callable(where) else where
    return f"{where}: {key_name(path)} is {value!r}, which no setting can use; give a finite number"


def epoch_problems(config: dict, where: str) -> list[str]:
    warmup, epochs = config["warmup_epochs"], config["max_epochs"]
    if warmup < epochs:
        return []
    return [f"{where}: warmup_epochs is {warmup} but max_epochs is {epochs}, so no steady epoch is left "
            f"to measure throughput and every run would report none; set warmup_epochs below max_epochs "
            f"(e.g. warmup_epochs: {epochs - 1}) or raise max_epochs above {warmup}"]


def loader_problems(config: dict, where: str) -> list[str]:
    """DataLoader knobs that only work together; PyTorch would refuse them inside every rank."""
    loader, data_args = config["dataloader"], config["data"]["init_args"]
    workers = loader["num_workers"]
    problems = []
    if loader["persistent_workers"] and workers == 0:
        problems.append(f"{where}: dataloader.persistent_workers is true but dataloader.num_workers is 0, so "
                        "there are no workers to keep; set num_workers above 0 or persistent_workers: false")
    if loader["prefetch_factor"] is not None and workers == 0:
        problems.append(f"{where}: dataloader.prefetch_factor is {loader['prefetch_factor']} but "
                        "dataloader.num_workers is 0, so no worker loads ahead; set num_workers above 0 "
                        "or prefetch_factor: null")
    if data_args.get("resident") is True and workers > 0:
        problems.append(f"{where}: dataloader.num_workers is {workers} but data.init_args.resident is true, "
                        "which slices batches in the training process without a DataLoader; set "
                        "dataloader.num_workers: 0 or data.init_args.resident: false")
    return problems


def global_batch(config: dict, topo: Topology) -> int:
    size = config["batch"]["size"]
    return size if config["batch"]["scaling"] == "strong" else size * topo.world_size


def fewest_samples(split: list[float], need: dict[str, int]) -> int | None:
    """The smallest dataset.samples whose split holds `need` samples in each part, or None.

    Rounding makes it a search; it starts just below the exact bound, so parsing stays instant.
    """
    start = max(1, max(math.floor(need[name] / fraction) for name, fraction in zip(("train", "val", "test"), split)) - 5)
    return next((n for n in range(start, start + 1000)
                 if all(split_sizes(n, split)[k] >= need[k] for k in need)), None)


def dataset_problems(config: dict, topologies: list[Topology], where: str) -> list[str]:
    """A generated dataset must sum its split to 1 and hold a batch of every topology."""
    dataset = config["dataset"]
    if dataset["generator"] == "none":
        if config["data"]["class_path"] == SPIRAL_MODULE:
            return [f"{where}: dataset.generator is none, but data.class_path {SPIRAL_MODULE} reads the "
                    "generated spiral dataset; set dataset.generator: spiral, or name your own data module "
                    "in data.class_path"]
        return []  # the module brings its own data: a data_file in its init_args is its own argument
    problems = []
    if "data_file" in config["data"]["init_args"]:
        problems.append(f"{where}: data.init_args.data_file is set, but the workflow passes the generated "
                        "dataset's file itself; remove data.init_args.data_file (or set dataset.generator: "
                        "none to bring your own data)")
    split = dataset["split"]
    if not math.isclose(sum(split), 1.0, abs_tol=1e-6):
        problems.append(f"{where}: dataset.split {split} sums to {sum(split):g}, not 1; give train, validation "
                        "and test fractions that add up to 1, e.g. [0.7, 0.15, 0.15]")
        return problems
    sizes = split_sizes(dataset["samples"], split)
    largest = max(topologies, key=lambda t: (global_batch(config, t), t.world_size))
    need = {"train": global_batch(config, largest), "val": largest.world_size, "test": largest.world_size}
    short = [name for name in ("train", "val", "test") if sizes[name] < need[name]]
    if short:
        name = short[0]
        enough = fewest_samples(split, need)
        what = (f"one global batch of {need['train']} on '{largest.name}' (batch.size {config['batch']['size']}, "
                f"{config['batch']['scaling']} scaling)" if name == "train"
                else f"one sample per device of '{largest.name}' ({need[name]})")
        other = "lower batch.size" if name == "train" else f"give {name} a larger fraction in dataset.split"
        problems.append(f"{where}: dataset.samples {dataset['samples']} gives {sizes[name]} {name} samples, "
                        f"fewer than {what}; raise dataset.samples"
                        + (f" to at least {enough}" if enough else "") + f" or {other}")
    return problems


def file_problems(config: dict, where: str, exists=os.path.exists, is_file=os.path.isfile) -> list[str]:
    """The files the user's data module reads must be there before any run starts, each a
    regular file: a directory or a device has no checksum, so a change inside it would rerun
    nothing (and /dev/zero never ends)."""
    files = config["data"]["files"]
    # Snakemake reads braces in an input path as a wildcard, and a control character would
    # reach the rule's log and shell line
    odd = [f for f in files if re.search(r"[{}]", f) or CONTROL_CHARACTER.search(f)]
    if odd:
        return [f"{where}: data.files lists {', '.join(map(repr, odd))}, whose name holds a brace or a control "
                "character, which Snakemake cannot take as an input; rename the file"]
    missing = [f for f in files if not exists(f)]
    other = [f for f in files if exists(f) and not is_file(f)]
    problems = []
    if missing:
        problems.append(f"{where}: data.files lists {', '.join(missing)}, which "
                        f"{'does' if len(missing) == 1 else 'do'} not exist (paths are relative to the directory "
                        "snakemake runs in); fix the path or create the file")
    if other:
        problems.append(f"{where}: data.files lists {', '.join(other)}, which "
                        f"{'is not a regular file' if len(other) == 1 else 'are not regular files'} (a directory or "
                        "a device); list the files inside it that the data module reads")
    return problems


def setting_problems(config: dict, topologies: list[Topology], where: str = DEFAULT_CONFIG) -> list[str]:
    """Checks across keys of a validated config (defaults filled), one line per problem."""
    return (epoch_problems(config, where) + loader_problems(config, where) + dataset_problems(config, topologies, where)
            + ddp_problems(config, topologies, where))


def ddp_problems(config: dict, topologies: list[Topology], where: str) -> list[str]:
    """DDP settings no module can train with, on any device: a static graph under gradient
    accumulation asserts inside torch at the first step of every topology above one device
    (1x1 trains without DDP, so it alone would finish, and no report would follow)."""
    ddp = config.get("ddp") if isinstance(config.get("ddp"), dict) else {}
    accumulate = config["accumulate_grad_batches"]
    above_one = [t.name for t in topologies if t.world_size > 1]
    if ddp.get("static_graph") is True and accumulate > 1 and above_one:
        return [f"{where}: " + ddpsettings.STATIC_GRAPH_ACCUMULATION.format(accumulate=accumulate)
                + f", or {above_one[0]} dies at its first step"]
    return []


# -- settings the runs' devices cannot run, refused once the plan knows the devices --

def device_problems(config: dict, accelerator: str, topologies: list[Topology], trainer_args: dict, source,
                    gpu_torch: bool | None = None) -> list[str]:
    """Settings that Lightning or torch refuse, or replace, on the devices every run trains on,
    one line each; accelerator: the runs' own (`cpu` where devices are CPU processes; a cluster's
    auto is its GPUs), trainer_args: a LightningCLI config's passed Trainer arguments, source(key
    path): the file that set a config key, gpu_torch: whether torch was built for CUDA or ROCm
    (None: unknown). A 1x1 run trains without DDP, so DDP's refusals stop only larger topologies:
    without this check 1x1 trains and the first of them dies, leaving no report."""
    if accelerator != "cpu":
        return []
    devices = ("accelerator is cpu" if config["accelerator"] == "cpu"
               else "accelerator auto found too few GPUs here")
    ddp = [t.name for t in topologies if t.world_size > 1]
    problems = []
    if trainer_args.get("sync_batchnorm") is True and ddp:
        problems.append(
            f"{config['lightning_config']}: trainer.sync_batchnorm is true, but every run here trains on CPU "
            f"processes ({devices}) and torch's DDP refuses SyncBatchNorm on CPU (\"SyncBatchNorm layers only "
            f"work with GPU modules\"), so {ddp[0]} would die; remove trainer.sync_batchnorm here (each process "
            "then normalises over its own batch), or run on GPUs (accelerator: gpu, or a cluster profile)")
    if config["precision"] == "16-mixed":
        # Lightning 2.6's accelerator connector: "AMP with fp16 is not supported on CPU. Using
        # precision='bf16-mixed' instead", so the record would name a precision that did not train
        problems.append(
            f"{source(('precision',))}: precision is 16-mixed, but every run here trains on CPU processes "
            f"({devices}), which have no fp16 mixed precision: Lightning would train bf16-mixed instead and the "
            "report would name a precision that did not train; set precision: bf16-mixed or 32-true, or run on GPUs")
    hook = config.get("ddp", {}).get("comm_hook")
    if hook == "bf16_compress" and ddp and gpu_torch is False:
        problems.append(
            f"{source(('ddp', 'comm_hook'))}: ddp.comm_hook is bf16_compress, but torch here is built without "
            "CUDA and DDP refuses that hook without NCCL (\"BF16 all reduce communication hook required CUDA 11+ "
            f"and NCCL 2.10+\"), so {ddp[0]} would die; set ddp.comm_hook: fp16_compress (which CPU processes "
            "can send) or none")
    return problems


# -- inputs that cannot work, refused before the schema (input_problems: plan/workflowplan.py) --

# Files of the running system: no data a run can use, /dev/zero never ends, and a checksum that
# changes at every read would rerun every run.
SYSTEM_ROOTS = ("/proc", "/sys", "/dev")


def under(path: str, folder: str) -> bool:
    """Whether path is folder or inside it, links resolved."""
    real, root = os.path.realpath(path), os.path.realpath(folder)
    return real == root or real.startswith(root.rstrip(os.sep) + os.sep)


def data_source_problems(config: dict, source) -> list[str]:
    """A data file (data.files, data.init_args.data_file) that is this experiment's own output, or
    a file of the running system. Its own output: training would read what training writes, and
    Snakemake would rerun every run each time one finishes. source: key path -> the file that set it."""
    data = config.get("data") if isinstance(config.get("data"), dict) else {}
    files = data.get("files") if isinstance(data.get("files"), list) else []
    init_args = data.get("init_args") if isinstance(data.get("init_args"), dict) else {}
    named = [(("data", "files"), "data.files lists", path) for path in files if isinstance(path, str)]
    if isinstance(init_args.get("data_file"), str):
        named.append((("data", "init_args", "data_file"), "data.init_args.data_file is", init_args["data_file"]))
    root = layout(config).root
    problems = []
    for key, said, path in named:
        if any(under(path, system) for system in SYSTEM_ROOTS):
            problems.append(f"{source(key)}: {said} {path!r}, a file of the running system "
                            f"({', '.join(SYSTEM_ROOTS)}), not data: name the files your data module reads")
        elif under(path, root):
            problems.append(f"{source(key)}: {said} {path!r}, which is this experiment's own output ({root}/): "
                            "training would read what it writes; copy the file out of results/ and name the copy")
    return problems


def experiment_problems(config: dict, source) -> list[str]:
    """An experiment whose folder under results/ is one the project uses otherwise (layout)."""
    name = experiment_name(config)
    why = reserved_problem(name)
    if not why:
        return []
    said = "experiment is" if config.get("experiment") else "experiment is null, so the model class's name,"
    return [f"{source(('experiment',))}: {said} {name!r}, but {why}; set experiment: to another name"]


def override_problems(overrides, schema: dict | None = None) -> list[str]:
    """A mapping or list given with --config (`--config report='{efficiency_threshold: 0.8}'`):
    Snakemake reads it with YAML's BaseLoader (snakemake.cli.parse_config), which keeps every value
    as text, so a number there arrives as '0.8' and the schema would ask to drop quotes the user
    never wrote. Text where the schema takes text (a topology '0x2', which YAML would read as a
    hexadecimal 2) is what it is. A dotted key (report.x=3) Snakemake itself refuses before the
    workflow runs."""
    problems = []
    for key, value in (overrides or {}).items():
        found = text_number(value, (key,), schema or {}) if isinstance(value, (dict, list)) else None
        if found:
            path, text = found
            problems.append(f"--config: {key_name(path)} arrives as the text {text!r}: Snakemake reads a mapping or "
                            f"list given with --config as text throughout; put nested keys in an overlay file "
                            f"and pass it with --configfile (e.g. a file holding `{key}: {{...}}`)")
    return problems


def schema_at(schema: dict, path: tuple) -> dict:
    """The part of a JSON schema that describes the value at path; {} where it does not say."""
    for part in path:
        if isinstance(part, int):
            schema = schema.get("items") if isinstance(schema.get("items"), dict) else {}
        else:
            schema = (schema.get("properties") or {}).get(part) or {}
    return schema


def takes_text(schema: dict) -> bool:
    kinds = schema.get("type")
    return kinds == "string" or (isinstance(kinds, list) and "string" in kinds)


def text_number(tree, path: tuple, schema: dict | None = None) -> tuple[tuple, str] | None:
    """The first text in tree that YAML would read as a number, true/false or null, with its path,
    where the schema (the whole config's) does not take text there."""
    if isinstance(tree, dict):
        items = tree.items()
    elif isinstance(tree, list):
        items = enumerate(tree)
    else:
        if not isinstance(tree, str) or takes_text(schema_at(schema or {}, path)):
            return None
        try:
            read = yaml.safe_load(tree)
        except (yaml.YAMLError, ValueError, RecursionError):  # not YAML, a huge int, deep nesting: text
            return None
        return None if isinstance(read, str) else (path, tree)
    for key, value in items:
        if found := text_number(value, (*path, key), schema):
            return found
    return None


def input_problems(config: dict, overrides, source, schema: dict | None = None) -> list[str]:
    """Inputs that cannot work, one line each, checked before the schema: nested numbers given
    with --config (overrides: what --config set), an experiment named like a folder results/
    already uses, and data files that are the experiment's own output or the system's."""
    return (override_problems(overrides, schema) + experiment_problems(config, source)
            + data_source_problems(config, source))
