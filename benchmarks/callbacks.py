"""What ddpscale's own callbacks cost per training step, through Lightning's own dispatch.

A whole step varies by more than these costs between runs on a shared machine, so they are
timed directly: the six callback hooks Lightning calls around every step, dispatched by
Lightning's _call_callback_hooks on a fitted Trainer, with only the callback under test
attached, minus the same dispatch with no callback at all.
"""

import sys
import tempfile
import timeit
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import pytorch_lightning as pl  # noqa: E402
import torch  # noqa: E402
import yaml  # noqa: E402
from pytorch_lightning.callbacks import ModelCheckpoint  # noqa: E402
from pytorch_lightning.trainer import call  # noqa: E402

from ddpscale.job.callbacks import FlopsCount  # noqa: E402
from ddpscale.job.measure.samplecount import BatchCounter  # noqa: E402
from ddpscale.job.measure.timing import EpochTiming  # noqa: E402
from ddpscale.job import build  # noqa: E402
from ddpscale.core.steadystate import Rule  # noqa: E402
from ddpscale.run.runspec import RunSpec  # noqa: E402
from ddpscale.job.resume.checkpoint import epoch_checkpoint  # noqa: E402
from ddpscale.workloads.models import SpiralMLP  # noqa: E402
from ddpscale.workloads.resident import ResidentBatches  # noqa: E402

# the spec only builds the Trainer; its stopping rule is the shipped config's (config/config.yaml)
SHIPPED_RULE = Rule.of(yaml.safe_load((ROOT / "config/config.yaml").read_text())["throughput"])


class _Data(pl.LightningDataModule):
    def train_dataloader(self):
        return ResidentBatches((torch.randn(64, 2), torch.randint(0, 2, (64,))), 32, shuffle=True)


def per_step_us(number: int = 5000, repeat: int = 5) -> dict[str, float]:
    """Microseconds per step that each callback adds to Lightning's hook dispatch (best of repeat)."""
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as ckpt_dir:
        callbacks = {"EpochTiming": EpochTiming(warmup_epochs=1, expected_world_size=1),
                     "EpochCheckpoint": epoch_checkpoint(ckpt_dir),
                     # past its few counted steps (the attempt's first): what it costs every other step
                     "FlopsCount": FlopsCount(BatchCounter(), window_steps=10),
                     # what the pipeline used before EpochCheckpoint, for its before/after
                     "ModelCheckpoint": ModelCheckpoint(dirpath=ckpt_dir, filename="last", save_top_k=1,
                                                        enable_version_counter=False)}
        # the module and data are this benchmark's own: the spec only builds the Trainer
        spec = RunSpec(topology="1x1", num_nodes=1, devices_per_node=1, model_class="-", data_class="-",
                       scaling="weak", batch_size=32, max_epochs=1, accelerator="cpu", throughput=SHIPPED_RULE)
        trainer = build.build_trainer(spec, list(callbacks.values())[:2])
        trainer.fit(SpiralMLP(), datamodule=_Data())
        batch = (torch.randn(32, 2), torch.randint(0, 2, (32,)))
        loss, optimizer = torch.tensor(0.5), trainer.optimizers[0]
        hooks = [("on_train_batch_start", (batch, 0)), ("on_before_backward", (loss,)),
                 ("on_after_backward", ()), ("on_before_optimizer_step", (optimizer,)),
                 ("on_before_zero_grad", (optimizer,)), ("on_train_batch_end", (loss, batch, 0))]

        def step():
            for name, args in hooks:
                call._call_callback_hooks(trainer, name, *args)

        def timed(attached) -> float:
            trainer.callbacks = attached
            return min(timeit.repeat(step, number=number, repeat=repeat)) / number * 1e6

        empty = timed([])
        return {name: timed([cb]) - empty for name, cb in callbacks.items()}


if __name__ == "__main__":
    for name, us in per_step_us().items():
        print(f"{name}: {us:.1f} us per step")
