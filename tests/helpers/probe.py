"""The probe in this process on one CPU rank: its small sizes, a run's spec for the test's own
module and data, and a fit under train.py's Trainer with the probe before training."""

from __future__ import annotations

from helpers.configs import rule
from ddpscale.job import build
from ddpscale.job.callbacks import ProbeBeforeTraining
from ddpscale.run.runspec import RunSpec


SMALL = {"steps": 4, "rounds": 2, "warmup": 1, "iters": 2}


def run_args(batch_size: int = 16, **extra) -> RunSpec:
    """A run's spec for one CPU rank (the module and data are the test's own)."""
    return RunSpec(topology="1x1", num_nodes=1, devices_per_node=1, throughput=rule(),
                   model_class="m.M", data_class="d.D", scaling="weak",
                   batch_size=batch_size, max_epochs=1, accelerator="cpu", collective_timeout_s=30, **extra)


def fit_with_probe(model, data, *callbacks, alone: bool = True, max_epochs: int = 1):
    """A fit under train.py's Trainer with the probe before training (alone: stop after it)."""
    probed = ProbeBeforeTraining(run_args(data.batch_size), SMALL, alone=alone)
    trainer = build.build_trainer(run_args(data.batch_size), [*callbacks, probed], max_epochs=max_epochs)
    trainer.fit(model, datamodule=data)
    return probed, trainer
