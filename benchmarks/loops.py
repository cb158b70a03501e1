"""One rank of a comparison of training loops on one workload, timed in rotating rounds.

Each --variant is a loop and its options, e.g. `lightning,resident` (the pipeline's own Lightning
path) against `plain,resident` (a plain PyTorch loop with the same model, data, batch,
optimizer and steps), or one fast path's before and after (`lightning` vs `lightning,resident`).
Every variant runs in this same process, once per round, in an order that rotates each round,
so a slow moment of a shared machine falls on all of them alike.

Options: resident (batches sliced from in-memory tensors), compile (torch.compile, mode
default), bf16 (bf16-mixed autocast), log-step (the model logs its loss every step, as
tutorials do; the built-in model does not); for diagnosis only, no-checkpoint and
no-sigterm-broadcast take one part out of the Lightning path to measure what it costs.

Run as one process (1 rank) or under scripts/launch_local.py (N ranks, gloo). Rank 0 writes
each variant's steady-state throughputs (samples/s over all ranks, warm-up epochs excluded)
and its first-epoch times as JSON.
"""

import argparse
import contextlib
import dataclasses
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import pytorch_lightning as pl  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import yaml  # noqa: E402
from pytorch_lightning.callbacks import ModelCheckpoint  # noqa: E402
from torch.utils.data import DataLoader, DistributedSampler  # noqa: E402

from ddpscale.job.device.flops import precision_plan  # noqa: E402
from ddpscale.job.probe.step import _TrainingStep  # noqa: E402
from ddpscale.job.measure.timing import EpochTiming  # noqa: E402
from ddpscale.job import build  # noqa: E402  build: the pipeline's own Trainer
from ddpscale.job.device import compiling  # noqa: E402
from ddpscale.core.steadystate import Rule  # noqa: E402
from ddpscale.run.runspec import RunSpec  # noqa: E402
from ddpscale.job.resume.checkpoint import epoch_checkpoint  # noqa: E402
from ddpscale.job.launch.ranks import close_process_group  # noqa: E402
from ddpscale.workloads.models import SpiralMLP  # noqa: E402
from ddpscale.workloads.resident import from_dataset  # noqa: E402
from ddpscale.workloads.spiral_datamodule import SpiralDataModule  # noqa: E402
from ddpscale.workloads.synthetic_datamodule import SyntheticDataModule  # noqa: E402

# the spec only builds the Trainer; its stopping rule is the shipped config's (config/config.yaml)
SHIPPED_RULE = Rule.of(yaml.safe_load((ROOT / "config/config.yaml").read_text())["throughput"])


class StepLoggingMLP(SpiralMLP):
    """The built-in model as a typical tutorial writes it: its training loss logged every step."""

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        self.log("train_loss", loss, prog_bar=True)
        return loss


# The reference workload of the MPCDF Raven tutorial (few thousand parameters: overhead-bound), and a wide
# MLP on synthetic data whose steps are dominated by matrix multiplies (compute-bound).
WORKLOADS = {
    "spiral": lambda a: ((StepLoggingMLP if a.log_step else SpiralMLP)(hidden=[64, 32, 16], dropout=0.2, lr=1e-3),
                         SpiralDataModule(data_file=a.data_file, batch_size=a.batch, resident=a.resident)),
    "wide": lambda a: ((StepLoggingMLP if a.log_step else SpiralMLP)(hidden=[1024, 1024], dropout=0.0, lr=1e-3, input_dim=256, num_classes=10),
                       SyntheticDataModule(batch_size=a.batch, samples=4096, features=256, classes=10,
                                           resident=a.resident)),
}


LOOPS = ("lightning", "plain")
OPTIONS = ("resident", "compile", "bf16", "log-step", "no-checkpoint", "no-sigterm-broadcast")


@dataclasses.dataclass(frozen=True)
class Variant:
    loop: str
    options: frozenset

    @classmethod
    def parse(cls, text: str) -> "Variant":
        loop, *options = text.split(",")
        if loop not in LOOPS or not set(options) <= set(OPTIONS):
            raise argparse.ArgumentTypeError(f"'{text}': write LOOP[,OPTION...], LOOP one of {LOOPS}, "
                                             f"OPTION of {OPTIONS}")
        if loop == "plain" and {"no-checkpoint", "no-sigterm-broadcast"} & set(options):
            raise argparse.ArgumentTypeError(f"'{text}': the plain loop has no Lightning parts to remove")
        return cls(loop, frozenset(options))

    def settings(self, args) -> argparse.Namespace:
        return argparse.Namespace(**vars(args), resident="resident" in self.options,
                                  compile="default" if "compile" in self.options else "none",
                                  precision="bf16-mixed" if "bf16" in self.options else "32-true",
                                  log_step="log-step" in self.options)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", choices=sorted(WORKLOADS), required=True)
    p.add_argument("--data-file", help="spiral data written by prepare_data")
    p.add_argument("--batch", type=int, default=32, help="per rank")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--warmup-epochs", type=int, default=1)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--variant", dest="variants", action="append", required=True,
                   help="LOOP[,OPTION...], e.g. lightning,resident; give two or more to compare")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    try:
        args.parsed = [Variant.parse(v) for v in args.variants]
    except argparse.ArgumentTypeError as err:
        p.error(str(err))
    return args


def modules(s):
    model, data = WORKLOADS[s.workload](s)
    return compiling.wrap(model, s.compile), data


def lightning_run(s, variant: Variant, world: int, ckpt_dir: str) -> tuple[float, float]:
    model, data = modules(s)
    metrics = EpochTiming(warmup_epochs=s.warmup_epochs, expected_world_size=world)
    callbacks = [metrics] if "no-checkpoint" in variant.options else [metrics, epoch_checkpoint(ckpt_dir)]
    # the module and data are this benchmark's own: the spec only builds the Trainer
    spec = RunSpec(topology=f"1x{world}", num_nodes=1, devices_per_node=world, model_class="-", data_class="-",
                   scaling="weak", batch_size=1, max_epochs=s.epochs, accelerator="cpu", precision=s.precision,
                   throughput=SHIPPED_RULE)
    # with the logger a run has (beside its checkpoints here): the pipeline as users get it
    trainer = build.build_trainer(spec, callbacks, log_dir=os.path.join(ckpt_dir, "logs"))
    if "no-checkpoint" in variant.options:  # else Lightning adds a default ModelCheckpoint of its own
        trainer.callbacks = [c for c in trainer.callbacks if not isinstance(c, ModelCheckpoint)]
    if "no-sigterm-broadcast" in variant.options:
        # Lightning 2.6 broadcasts rank 0's SIGTERM flag and reads it on the host before every
        # training step of a multi-rank run. Its SIGTERM handler pairs a broadcast with that one,
        # so the pipeline cannot skip it (a SIGTERMed run then hangs): a measurement only.
        trainer.fit_loop.epoch_loop._broadcast_sigterm_tensor = lambda: None
    trainer.fit(model, datamodule=data)
    return metrics.steady_figure()[0], metrics.section()["epoch_times_s"][0]


def plain_run(s, world: int) -> tuple[float, float]:
    model, data = modules(s)
    data.setup("fit")
    dataset = data.splits["train"]  # both built-in data modules keep their TensorDatasets here
    if s.resident:
        loader = sampler = from_dataset(dataset, s.batch, shuffle=True)  # as the data modules build it
    else:
        sampler = DistributedSampler(dataset, shuffle=True) if world > 1 else None
        loader = DataLoader(dataset, batch_size=s.batch, shuffle=sampler is None, sampler=sampler)
    optimizer = model.configure_optimizers()  # both workloads' model returns its optimizer alone
    autocast = precision_plan(s.precision, "cpu")["autocast"]
    context = (lambda: torch.autocast("cpu", dtype=autocast)) if autocast else contextlib.nullcontext
    step = _TrainingStep(model, context)
    net = torch.nn.parallel.DistributedDataParallel(step) if world > 1 else step
    model.train()
    samples, seconds, first_epoch_s = 0, 0.0, None
    for epoch in range(s.epochs):
        if sampler is not None:
            sampler.set_epoch(epoch)
        count, start = 0, time.perf_counter()
        for i, batch in enumerate(loader):
            optimizer.zero_grad(set_to_none=True)
            net(batch, i).backward()
            optimizer.step()
            count += len(batch[0])
        elapsed = time.perf_counter() - start
        first_epoch_s = elapsed if first_epoch_s is None else first_epoch_s
        if epoch >= s.warmup_epochs:
            samples, seconds = samples + count * world, seconds + elapsed
    return samples / seconds, first_epoch_s


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)  # one core per simulated device, as the local profile runs it
    world = int(os.environ.get("WORLD_SIZE", 1))
    if world > 1:
        dist.init_process_group("gloo", init_method=f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
                                rank=int(os.environ["RANK"]), world_size=world)
    pl.seed_everything(0, verbose=False)
    names = args.variants
    results = {name: {"throughput": [], "first_epoch_s": []} for name in names}
    with tempfile.TemporaryDirectory() as ckpt_dir:
        for round_ in range(args.rounds):
            shift = round_ % len(names)  # rotate the order: each variant goes first in turn
            pairs = list(zip(names, args.parsed))
            for name, variant in pairs[shift:] + pairs[:shift]:
                s = variant.settings(args)
                run = (lightning_run(s, variant, world, ckpt_dir) if variant.loop == "lightning"
                       else plain_run(s, world))
                results[name]["throughput"].append(run[0])
                results[name]["first_epoch_s"].append(run[1])
    if int(os.environ.get("RANK", 0)) == 0:
        Path(args.out).write_text(json.dumps({"workload": args.workload, "world_size": world,
                                              "batch_per_rank": args.batch, "variants": results}))
    close_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
