"""Whether throughput mode can win for the configured training, judged before any run.

Throughput mode trains each topology until its throughput's 95% interval meets
throughput.precision (ddpscale.core.steadystate). The rule first looks once min_windows windows
of window_steps training batches are timed, so no run stops on its precision before
min_windows x window_steps batches per rank; a warm-up it must cut takes more (it keeps
min_windows windows after the cut, so a cut waits for a later look), and throughput.max_steps
caps the batches measured. Where the configured training (max_epochs x batches per epoch) is
shorter, every run ends with its epochs and an interval wider than asked, and costs what training in full costs,
with 3 repeats (repeats: auto) where full mode trains 1. Where it is long enough but still not
longer than its repeats of the rule's least, even a run that stops at its first look costs more
than full training. Either way, measure: auto on a cluster resolves to full (run.measuremode),
and an explicit measure: throughput runs with the line saying what it costs against full.

Batches per epoch are known before a run for the built-in data modules: the spiral's from its
dataset settings, the Markov tokens' steps_per_epoch, the synthetic classes' samples. A user's
module's loader exists only once its code has run (setup may read or download data), so its
length is unknown here and not guessed; trainer.limit_train_batches as a whole number still
bounds it. Windows count batches, not optimizer steps: accumulate_grad_batches changes neither
side, and a LightningCLI max_steps is refused (lightningcli.REFUSED). The comparison is in
training batches per rank, which cost the same device time in either mode; validation, saves
and the probe are left aside (throughput mode validates and saves twice after its stop, full
mode every epoch, and both probe on the first repeat). Pure and torch-free.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ddpscale.run import measuremode
from ddpscale.run.topology import Topology, batch_per_device
from ddpscale.core.spiral import split_sizes

SPIRAL = "ddpscale.workloads.spiral_datamodule.SpiralDataModule"
MARKOV = "ddpscale.workloads.markov_datamodule.MarkovTokens"
SYNTHETIC = "ddpscale.workloads.synthetic_datamodule.SyntheticDataModule"
# The built-in modules' own defaults and split, read where the config leaves them out
# (tests/unit/plan/cost/test_throughputfit.py holds them to the classes)
MARKOV_STEPS = 100
SYNTHETIC_SAMPLES = 8192
SYNTHETIC_TRAIN = 0.8


@dataclass(frozen=True)
class Epoch:
    """One topology's training batches per rank in an epoch, as far as known before a run."""
    batches: int | None  # None: unknown before a run
    exact: bool = True  # False: at most this many (trainer.limit_train_batches)


def sharded_batches(samples: int, world: int, batch: int, drop_last: bool, sharded: bool = True) -> int:
    """Batches per rank of `samples` split over `world` ranks as DistributedSampler and the
    resident batches both split them (padded to a multiple of the world), in batches of `batch`;
    sharded False: every rank reads them all (a DataLoader without Lightning's sampler)."""
    per_rank = math.ceil(samples / world) if sharded else samples
    return per_rank // batch if drop_last else math.ceil(per_rank / batch)


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _built_in(config: dict, topo: Topology, trainer_args: dict) -> int | None:
    """Batches per rank of an epoch of a built-in data module, None for any other."""
    data = config["data"]
    args = data["init_args"]
    if data["class_path"] == MARKOV:
        steps = args.get("steps_per_epoch", MARKOV_STEPS)  # every rank takes them, whatever the world
        return steps if _count(steps) else None
    if data["class_path"] == SPIRAL and config["dataset"]["generator"] == "spiral":
        dataset = config["dataset"]
        samples = split_sizes(dataset["samples"], dataset["split"])["train"]
    elif data["class_path"] == SYNTHETIC and _count(args.get("samples", SYNTHETIC_SAMPLES)):
        samples = int(args.get("samples", SYNTHETIC_SAMPLES) * SYNTHETIC_TRAIN)
    else:
        return None  # a user's module, or a built-in one given what its job would refuse
    # under torch.compile the pipeline sets drop_last where the config does not (job.compiling)
    drop_last = bool(args.get("drop_last", config["compile"] != "none"))
    # the resident batches shard themselves; a DataLoader is sharded by Lightning's sampler
    sharded = bool(args.get("resident")) or trainer_args.get("use_distributed_sampler", True) is not False
    per_device = batch_per_device(config["batch"]["scaling"], config["batch"]["size"], topo)
    if per_device < 1:
        return None  # refused by the topology check before any run
    return sharded_batches(samples, topo.world_size, per_device, drop_last, sharded or topo.world_size == 1)


def epoch_batches(config: dict, topo: Topology, trainer_args: dict) -> Epoch:
    """Training batches per rank in one epoch of this topology, with Lightning's
    limit_train_batches applied (a whole number caps them, a fraction keeps that share)."""
    batches = _built_in(config, topo, trainer_args)
    limit = trainer_args.get("limit_train_batches")
    if isinstance(limit, bool) or not isinstance(limit, (int, float)):
        return Epoch(batches)
    if isinstance(limit, int):
        return Epoch(min(batches, limit)) if batches is not None else Epoch(limit, exact=False)
    return Epoch(int(batches * limit) if batches is not None else None)


@dataclass(frozen=True)
class Training:
    """One topology's configured training: max_epochs of its epoch."""
    name: str
    epochs: int
    epoch: Epoch

    @property
    def batches(self) -> int | None:
        return None if self.epoch.batches is None else self.epochs * self.epoch.batches


@dataclass(frozen=True)
class Verdict:
    cannot_win: str | None  # why throughput mode cannot win here (measure: auto then trains in full)
    finding: str | None  # what the measure line's next line says, before its advice; None: nothing

    def line(self, setting: str) -> str | None:
        """The line every run prints under its measure line, with what to do for the setting."""
        if self.finding is None:
            return None
        if self.cannot_win is None:
            return self.finding
        if setting == "auto":
            return f"{self.finding}. measure: auto trains in full; set measure: throughput to measure throughput anyway"
        return f"{self.finding}. measure: throughput runs as set; measure: full or auto trains in full"


def _names(runs: list[Training]) -> str:
    names = [t.name for t in runs]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def _grouped(runs: list[Training]) -> list[list[Training]]:
    """The topologies in groups of alike trainings (epochs and batches per epoch), in order."""
    groups: dict[tuple, list[Training]] = {}
    for run in runs:
        groups.setdefault((run.epochs, run.epoch), []).append(run)
    return list(groups.values())


def _length(group: list[Training]) -> str:
    """'330 batches per rank (3 epochs x 110)' of a group's training; 'at most' for a bound."""
    first = group[0]
    bound = "" if first.epoch.exact else "at most "
    return f"{bound}{first.batches} batches per rank ({first.epochs} epochs x {bound}{first.epoch.batches})"


def _runs(count: int) -> str:
    return f"{count} run{'' if count == 1 else 's'}"


def judge(config: dict, topologies: list[Topology], trainer_args: dict) -> Verdict:
    """Whether throughput mode can win for this config's training of these topologies;
    trainer_args: a LightningCLI config's trainer arguments."""
    rule = config["throughput"]
    windows, steps, cap = rule["min_windows"], rule["window_steps"], rule["max_steps"]
    least = windows * steps
    wide = f"an interval wider than {rule['precision']:.0%}"
    first_look = f"throughput.min_windows {windows} x window_steps {steps}"
    measured, full = (measuremode.repeats(config["repeats"], mode) for mode in (measuremode.THROUGHPUT,
                                                                              measuremode.FULL))
    auto = " (repeats: auto)" if config["repeats"] == "auto" else ""
    runs = [Training(t.name, config["max_epochs"], epoch_batches(config, t, trainer_args)) for t in topologies]
    if cap is not None and cap < least:
        return Verdict("throughput mode cannot reach its precision under its step cap",
                       f"throughput mode cannot win here: throughput.max_steps {cap} stops every run short of the "
                       f"{least} batches its stopping rule needs before its first look ({first_look}), so each "
                       f"ends with {wide}; throughput.max_steps: {least} or more would let it reach its precision")
    short = [t for t in runs if t.batches is not None and t.batches < least]
    if short:
        trainings = "; ".join(f"{_names(group)} train{'s' if len(group) == 1 else ''} {_length(group)}"
                              for group in _grouped(short))
        cost = (f", at {_runs(measured)} per topology{auto} where full training takes {full}" if measured > full
                else ", at the cost of full training without its accuracy comparison")
        return Verdict("throughput mode cannot reach its precision inside the configured training",
                       f"throughput mode cannot win here: {trainings}, short of the {least} its stopping rule needs "
                       f"before its first look ({first_look}, plus any warm-up it cuts), so every run would end "
                       f"with its epochs and {wide}{cost}{_longer(short, least, windows)}")
    known = [t for t in runs if t.batches is not None and t.epoch.exact]
    dearer = [t for t in known if measured * least >= full * t.batches]
    if dearer:
        trainings = "; ".join(f"of {_names(group)} is {_runs(full)} of {_length(group)}" for group in _grouped(dearer))
        finding = (f"it runs each topology {measured} times{auto} for at least {least} batches per rank (its "
                   f"stopping rule's first look: {first_look}), {measured * least} or more, where full training "
                   f"{trainings}")
        if len(dearer) == len(runs):
            return Verdict("throughput mode costs more than full training on every topology",
                           f"throughput mode cannot win here: {finding}")
        return Verdict(None, f"throughput mode costs more than full training on {_names(dearer)}: {finding}; "
                             "it saves on the other topologies")
    if any(t.batches is None for t in runs):
        return Verdict(None, f"throughput mode: steps per epoch unknown before a run ({config['data']['class_path']} "
                             f"builds its loader only in a run), so whether a run reaches its precision inside "
                             f"max_epochs is not checked: it needs at least {least} batches per rank ({first_look})")
    return Verdict(None, None)


def _longer(short: list[Training], least: int, windows: int) -> str:
    """What would let the shortest trainings reach the first look: more epochs, or shorter windows."""
    per_epoch, shortest = min(t.epoch.batches for t in short), min(t.batches for t in short)
    epochs = f"max_epochs: {math.ceil(least / per_epoch)} or more" if per_epoch else None
    window = f"throughput.window_steps: {shortest // windows} or fewer" if shortest >= windows else None
    if epochs and window:
        return f"; {epochs} (or {window}) would let it reach its precision"
    return f"; {epochs or window} would let it reach its precision" if epochs or window else ""
