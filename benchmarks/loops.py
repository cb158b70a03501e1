"""One rank of the comparison: the pipeline's Lightning training path against a plain PyTorch
loop with the same model, data, batch, optimizer and steps, timed in alternating rounds.

Run as one process (1 rank) or under scripts/launch_local.py (N ranks, gloo). Rank 0 writes
the steady-state throughputs (samples/s over all ranks, warm-up epochs excluded) as JSON.
"""

import argparse
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
from pytorch_lightning.callbacks import ModelCheckpoint  # noqa: E402
from torch.utils.data import DataLoader, DistributedSampler  # noqa: E402

import train  # noqa: E402  the pipeline's own Trainer construction
from ddpscale import compiling  # noqa: E402
from ddpscale.models import SpiralMLP  # noqa: E402
from ddpscale.resident import ResidentBatches  # noqa: E402
from ddpscale.spiral_datamodule import SpiralDataModule  # noqa: E402
from ddpscale.stepprobe import _TrainingStep, first_optimizer, precision_plan  # noqa: E402
from ddpscale.synthetic_datamodule import SyntheticDataModule  # noqa: E402
from ddpscale.timing import ScalingMetrics  # noqa: E402

# The reference workload of seed 004 (few thousand parameters: overhead-bound), and a wide
# MLP on synthetic data whose steps are dominated by matrix multiplies (compute-bound).
WORKLOADS = {
    "spiral": lambda a: (SpiralMLP(hidden=[64, 32, 16], dropout=0.2, lr=1e-3),
                         SpiralDataModule(data_file=a.data_file, batch_size=a.batch, resident=a.resident)),
    "wide": lambda a: (SpiralMLP(hidden=[1024, 1024], dropout=0.0, lr=1e-3, input_dim=256, num_classes=10),
                       SyntheticDataModule(batch_size=a.batch, samples=4096, features=256, classes=10,
                                           resident=a.resident)),
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", choices=sorted(WORKLOADS), required=True)
    p.add_argument("--data-file", help="spiral data written by prepare_data")
    p.add_argument("--batch", type=int, default=32, help="per rank")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--warmup-epochs", type=int, default=1)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--resident", action="store_true", help="both loops slice batches from resident tensors")
    p.add_argument("--compile", default="none", choices=compiling.MODES, help="torch.compile mode in both loops")
    p.add_argument("--precision", default="32-true", choices=["32-true", "bf16-mixed"])
    p.add_argument("--lightning-only", action="store_true", help="skip the plain loop (a fast path's before/after)")
    p.add_argument("--out", required=True)
    return p.parse_args(argv)


def modules(args):
    model, data = WORKLOADS[args.workload](args)
    return compiling.wrap(model, args.compile), data


def lightning_throughput(args, world: int, ckpt_dir: str) -> float:
    model, data = modules(args)
    metrics = ScalingMetrics(warmup_epochs=args.warmup_epochs, expected_world_size=world)
    checkpoint = ModelCheckpoint(dirpath=ckpt_dir, filename="last", save_top_k=1, enable_version_counter=False)
    flags = argparse.Namespace(nodes=1, devices=world, cluster_env="local", accelerator="cpu",
                               precision=args.precision, max_epochs=args.epochs, accumulate_grad_batches=1)
    train.build_trainer(flags, [metrics, checkpoint]).fit(model, datamodule=data)
    summary = metrics.summary()
    return summary["throughput_samples_s"], summary["epoch_times_s"][0]


def plain_throughput(args, world: int) -> float:
    model, data = modules(args)
    data.setup("fit")
    dataset = data.splits["train"]  # both built-in data modules keep their TensorDatasets here
    if args.resident:
        loader = sampler = ResidentBatches(dataset.tensors, args.batch, shuffle=True, seed=torch.initial_seed())
    else:
        sampler = DistributedSampler(dataset, shuffle=True) if world > 1 else None
        loader = DataLoader(dataset, batch_size=args.batch, shuffle=sampler is None, sampler=sampler)
    optimizer = first_optimizer(model.configure_optimizers(), type(model).__name__)
    step = _TrainingStep(model, precision_plan(args.precision, "cpu")["autocast"], "cpu")
    net = torch.nn.parallel.DistributedDataParallel(step) if world > 1 else step
    model.train()
    samples, seconds = 0, 0.0
    for epoch in range(args.epochs):
        if sampler is not None:
            sampler.set_epoch(epoch)
        count, start = 0, time.perf_counter()
        for i, batch in enumerate(loader):
            optimizer.zero_grad(set_to_none=True)
            net(batch, i).backward()
            optimizer.step()
            count += len(batch[0])
        elapsed = time.perf_counter() - start
        if epoch >= args.warmup_epochs:
            samples, seconds = samples + count * world, seconds + elapsed
    return samples / seconds


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)  # one core per simulated device, as the local profile runs it
    world = int(os.environ.get("WORLD_SIZE", 1))
    if world > 1:
        dist.init_process_group("gloo", init_method=f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
                                rank=int(os.environ["RANK"]), world_size=world)
    pl.seed_everything(0, verbose=False)
    results = {"lightning": [], "plain": [], "lightning_first_epoch_s": []}
    kinds = ("lightning",) if args.lightning_only else ("lightning", "plain")
    with tempfile.TemporaryDirectory() as ckpt_dir:
        for round_ in range(args.rounds):
            # alternate which runs first, so a slow moment of the machine hits both alike
            order = kinds if round_ % 2 == 0 else kinds[::-1]
            for kind in order:
                if kind == "lightning":
                    throughput, first_epoch_s = lightning_throughput(args, world, ckpt_dir)
                    results["lightning_first_epoch_s"].append(first_epoch_s)
                else:
                    throughput = plain_throughput(args, world)
                results[kind].append(throughput)
    if int(os.environ.get("RANK", 0)) == 0:
        Path(args.out).write_text(json.dumps({"workload": args.workload, "world_size": world, "resident": args.resident,
                                              "compile": args.compile, "precision": args.precision,
                                              "batch_per_rank": args.batch, **results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
