"""One training run's settings: built by the workflow while it parses, read back by train.py.

`RunSpec` names, types and documents every setting of one run (one topology, one repeat).
The workflow builds each run's spec once (ddpscale.plan.runplan.build_spec, from the config,
the site, the topology and the repeat), `argv` turns it into train.py's flags and `parse`
reads them back, its inverse (tests/unit/run/test_runspec.py holds the two to each other); the
workflow hands a job the flags in an args file (ddpscale.run.argsfile), since they may be
longer than a command line can be. `measured` is the part that defines what a run measures:
its checkpoint is resumed and its identity computed for these only (ddpscale.run.identity).

Torch-free: the workflow imports this module while it parses.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import shlex
import sys
import typing
from dataclasses import dataclass, field

from ddpscale.core.steadystate import Rule
from ddpscale.run import argsfile, ddpsettings
from ddpscale.run.topology import Topology, batch_per_device

COMPILE_MODES = ("none", "default", "reduce-overhead", "max-autotune")
DEFAULT_LOADER = {"num_workers": 0, "pin_memory": False, "persistent_workers": False, "prefetch_factor": None}

# Field metadata: `measured` False for a setting that changes how a run goes or fails, or what
# it says about itself, not what it measures (left out of the checkpoint's fingerprint and the
# run's identity, so changing it does not start a finished run over); `rerun` False for one whose
# change must not even make Snakemake rerun the job (it only chooses what the log names).
HOW = {"measured": False}
LOG_ONLY = {"measured": False, "rerun": False}
# Snakemake's attempt of the job: only the rule's shell knows it (resources.attempt), and a
# param holding it would rerun every retried run again at the next invocation.
FROM_RULE = ("attempt",)


def _doc(text: str, **meta) -> dict:
    return {"help": text, **meta}


@dataclass(frozen=True)
class RunSpec:
    # --- what the run is: the topology and the modules ---
    topology: str = field(metadata=_doc("label, e.g. 2x4"))
    num_nodes: int = field(metadata=_doc("nodes (Lightning's num_nodes)"))
    devices_per_node: int = field(metadata=_doc("devices (ranks) per node"))
    model_class: str = field(metadata=_doc("the LightningModule's import path (config model.class_path)"))
    data_class: str = field(metadata=_doc("the LightningDataModule's import path (config data.class_path)"))
    scaling: str = field(metadata=_doc("weak: the batch is per device; strong: global (config batch.scaling)"))
    batch_size: int = field(metadata=_doc("per device (weak) or global (strong) (config batch.size)"))
    max_epochs: int = field(metadata=_doc("epochs trained (config max_epochs)"))
    # what it measures (ddpscale.job.measure.windows): the stopping rule, config throughput: whole
    throughput: Rule = field(metadata=_doc("the stopping rule's settings as JSON, by their names in config "
                                           "throughput: (precision, window_steps, min_windows, max_steps, "
                                           "max_minutes); full mode times the same windows, without caps",
                                           parse="throughput"))
    model_args: dict = field(default_factory=dict, metadata=_doc("init arguments (config model.init_args)"))
    data_args: dict = field(default_factory=dict, metadata=_doc("init arguments (config data.init_args)"))
    data_file: str | None = field(default=None, metadata=_doc("the dataset prepare_data wrote (generated data)"))
    data_files: list = field(default_factory=list,
                             metadata=_doc("the files the data module reads (config data.files), checksummed "
                                           "into the run's identity"))
    repeat: int = field(default=0, metadata=_doc("which repeat of the topology: its seed is seed + repeat"))
    seed: int = field(default=0, metadata=_doc("config seed"))
    # --- how it trains ---
    accelerator: str = field(default="auto", metadata=_doc("auto, cpu or gpu (resolved for this host locally)"))
    cluster_env: str = field(default="local",
                             metadata=_doc("slurm where srun started the ranks, else local (launch_local.py)"))
    batch_dim: int = field(default=0, metadata=_doc("the dimension of the batch's tensors that indexes samples"))
    precision: str = field(default="32-true", metadata=_doc("Lightning precision (config precision)"))
    compile: str = field(default="none", metadata=_doc("torch.compile mode, or none (config compile)"))
    accumulate_grad_batches: int = field(default=1, metadata=_doc("config accumulate_grad_batches"))
    loader: dict = field(default_factory=lambda: dict(DEFAULT_LOADER),
                         metadata=_doc("num_workers, pin_memory, persistent_workers, prefetch_factor"))
    ddp: dict = field(default_factory=lambda: ddpsettings.complete({}),
                      metadata=_doc("DistributedDataParallel's settings on more than one device (config ddp)",
                                    parse="ddp"))
    trainer_args: dict = field(default_factory=dict,
                               metadata=_doc("further pl.Trainer arguments (a LightningCLI config's)"))
    optimizers: dict = field(default_factory=dict,
                             metadata=_doc("a LightningCLI config's optimizer and lr_scheduler"))
    loggers: list | None = field(default=None,
                                 metadata=_doc("a LightningCLI config's loggers as [{kind, init_args}] ([]: none); "
                                               "None: Lightning's default logger"))
    warmup_epochs: int = field(default=1, metadata=_doc("epochs the throughput figure leaves out (config)"))
    # --- what it measures (ddpscale.job.measure.windows) ---
    measure: str = field(default="full",
                         metadata=_doc("throughput: stop once the steady-state throughput is known to "
                                       "throughput.precision (or at a cap); full: train max_epochs"))
    # --- how it runs, where it writes and what it says: not what it measures ---
    metrics: str = field(default="metrics.json", metadata=_doc("metrics.json to write", **HOW))
    ckpt_dir: str = field(default="checkpoints", metadata=_doc("resume checkpoints (not a workflow output)", **HOW))
    threads: int = field(default=0, metadata=_doc("torch CPU threads per rank; 0: cores / local ranks", **HOW))
    collective_timeout_s: float = field(
        default=300.0, metadata=_doc("seconds a collective waits for a dead or stuck rank", **HOW))
    compile_timeout_s: float = field(
        default=1800.0, metadata=_doc("seconds a collective waits while torch.compile compiles", **HOW))
    probe: bool = field(default=False,
                        metadata=_doc("probe the topology (step breakdown, all-reduce) before training", **HOW))
    probe_batch_sizes: list = field(
        default_factory=list,
        metadata=_doc("per-device batches at which a one-device probe also times its compute", **HOW))
    held_from_job: bool = field(default=False,
                                metadata=_doc("count the devices' hold from the SLURM job's start", **HOW))
    held_devices: int | None = field(
        default=None, metadata=_doc("GPUs the job is billed for where it holds whole nodes; None: its ranks", **HOW))
    site_interconnect: str = field(default="unknown",
                                   metadata=_doc("the network between nodes as the profile states it", **HOW))
    accuracy_metric: str | None = field(
        default=None, metadata=_doc("the metric the report compares: the log says whether it is logged", **LOG_ONLY))
    epoch_metric: str | None = field(
        default=None, metadata=_doc("the metric recorded after every epoch's validation, for time to accuracy",
                                    **LOG_ONLY))
    attempt: int = field(default=1, metadata=_doc("Snakemake's attempt of this job (retries count up)", **LOG_ONLY))

    def __post_init__(self):
        # the block as DDP runs it, checked: torch's defaults for what a caller left out
        object.__setattr__(self, "ddp", ddpsettings.checked(self.ddp))
        problem = _problem(self)
        if problem:
            raise ValueError(problem)

    @property
    def topo(self) -> Topology:
        return Topology(self.num_nodes, self.devices_per_node)

    @property
    def batch_per_device(self) -> int:
        return batch_per_device(self.scaling, self.batch_size, self.topo)

    @property
    def run_seed(self) -> int:
        """The config's seed plus the repeat: each repeat trains with a seed of its own (accuracy
        held is a test over seeds: ddpscale.report.figures.accuracy) and repeat r of every topology
        shares one."""
        return self.seed + self.repeat

    def measured(self) -> dict:
        """The settings that define what the run measures (its fingerprint and identity)."""
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)
                if f.metadata.get("measured", True)}

    def replace(self, **changes) -> RunSpec:
        return dataclasses.replace(self, **changes)

    def command(self, rerun: bool | None = None) -> str:
        """train.py's flags, shell-quoted, every setting explicit so the log shows what ran.

        rerun True: the flags whose change reruns the job (a Snakemake param); False: the others
        (FROM_RULE excepted: the rule's shell adds those); None: all of them.
        """
        return shlex.join(self.argv(rerun))

    def argv(self, rerun: bool | None = None) -> list[str]:
        # --flag=value: a value that begins with "-" (a metric named -neg_loss) is then never
        # read as a flag of its own
        return [flag if text is None else f"{flag}={text}" for flag, text in self._flags(rerun)]

    def recorded(self) -> str:
        """What Snakemake records of the settings whose change reruns the job (a param, not in
        the shell): the text earlier versions passed on the command line, `--flag value`, so a
        run they finished is not retrained by an upgrade; any change of a setting changes it."""
        return shlex.join(word for flag, text in self._flags(rerun=True) for word in (flag, text) if word is not None)

    def _flags(self, rerun: bool | None) -> list[tuple[str, str | None]]:
        out = []
        for f in dataclasses.fields(self):
            if rerun is not None and (f.name in FROM_RULE or f.metadata.get("rerun", True) != rerun):
                continue
            value = getattr(self, f.name)
            if value is None or value is False:
                continue
            out.append((_flag(f.name), None if value is True else _text(value)))
        return out


class Unrecorded:
    """A Snakemake param formatted into the shell command but not recorded (Snakemake's
    persistence skips values of types it cannot serialise): its change reruns nothing."""

    def __init__(self, text: str):
        self.text = text

    def __str__(self) -> str:
        return self.text


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _plain(value):
    """A setting as JSON holds it: the stopping rule as its settings."""
    return value.settings() if isinstance(value, Rule) else value


def _text(value) -> str:
    value = _plain(value)
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    return str(value)


def _kind(hint):
    """A field's type without None: int, float, str, bool, dict or list."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return typing.get_origin(args[0]) or args[0] if args else hint


def _json_of(kind):
    def read(text: str):
        try:
            value = json.loads(text)
        except ValueError as err:
            raise argparse.ArgumentTypeError(f"not JSON ({err})") from None
        if not isinstance(value, kind):
            raise argparse.ArgumentTypeError(f"expected a JSON {kind.__name__}, got {text!r}")
        return value
    read.__name__ = kind.__name__
    return read


def _ddp(text: str) -> dict:
    """--ddp checked as the workflow checks config ddp:, in one line naming that key."""
    try:
        return ddpsettings.parse(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _rule(text: str) -> Rule:
    """--throughput checked as the config's throughput: is, in one line naming the key."""
    try:
        return Rule.of(json.loads(text))
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


PARSE = {"ddp": _ddp, "throughput": _rule}


def parser() -> argparse.ArgumentParser:
    """train.py's command line: one flag per field, required where the field has no default."""
    p = argparse.ArgumentParser(description="Train one topology with Lightning DDP and write its metrics.json.")
    hints = typing.get_type_hints(RunSpec)
    for f in dataclasses.fields(RunSpec):
        kind = _kind(hints[f.name])
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if kind is bool:
            p.add_argument(_flag(f.name), action="store_true", help=f.metadata["help"])
            continue
        convert = PARSE.get(f.metadata.get("parse")) or (_json_of(kind) if kind in (dict, list) else kind)
        p.add_argument(_flag(f.name), type=convert, required=required, default=argparse.SUPPRESS,
                       help=f.metadata["help"].replace("%", "%%"))
    # read by parse before this parser sees the flags (ddpscale.run.argsfile): listed for --help
    p.add_argument(argsfile.FILE_FLAG, metavar="PATH", default=argparse.SUPPRESS,
                   help="a JSON file of further flags, as the workflow writes it; read in its place")
    p.add_argument(argsfile.DIGEST_FLAG, metavar="SHA256", default=argparse.SUPPRESS,
                   help="the digest the args file must have")
    return p


def parse(argv: list[str] | None = None) -> RunSpec:
    """The spec from train.py's flags (command's inverse), those in an args file (the workflow's
    way: ddpscale.run.argsfile) read in their place; a bad value exits with argparse's one line."""
    p = parser()
    try:
        argv = argsfile.expand(sys.argv[1:] if argv is None else argv)
    except ValueError as err:
        p.error(str(err))
    given = vars(p.parse_args(argv))
    try:
        return RunSpec(**given)
    except ValueError as err:
        p.error(str(err))


def _problem(spec: RunSpec) -> str | None:
    choices = {"accelerator": ("auto", "cpu", "gpu"), "cluster_env": ("local", "slurm"),
               "scaling": ("weak", "strong"), "measure": ("throughput", "full"), "compile": COMPILE_MODES}
    for name, allowed in choices.items():
        if getattr(spec, name) not in allowed:
            return f"--{name.replace('_', '-')} is {getattr(spec, name)!r}; choose one of {', '.join(allowed)}"
    for name in ("num_nodes", "devices_per_node", "batch_size", "max_epochs", "accumulate_grad_batches", "attempt"):
        if getattr(spec, name) < 1:
            return f"--{name.replace('_', '-')} must be >= 1, got {getattr(spec, name)}"
    for name in ("repeat", "seed", "threads", "batch_dim", "warmup_epochs"):
        if getattr(spec, name) < 0:
            return f"--{name.replace('_', '-')} must be >= 0, got {getattr(spec, name)}"
    for name in ("collective_timeout_s", "compile_timeout_s"):
        value = getattr(spec, name)
        if not (math.isfinite(value) and value > 0):
            return f"--{name.replace('_', '-')} must be a finite number > 0, got {value}"
    if any(not isinstance(s, int) or s < 1 for s in spec.probe_batch_sizes):
        return f"--probe-batch-sizes must be integers >= 1, got {spec.probe_batch_sizes}"
    return None
