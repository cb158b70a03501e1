"""After the probe, training runs as in a repeat that never probed: the
probe's copy, optimizers, DDP wrapper, gradients and batches are collected, CUDA's peak memory
is counted from training on, and torch.compile compiles training's own graphs."""

from __future__ import annotations

import weakref

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from ddpscale.job import build
from ddpscale.job.device import compiling
from ddpscale.job.probe import inrun
from ddpscale.job.probe import step as step_probe
from ddpscale.job.callbacks import ProbeBeforeTraining

from helpers.probe import SMALL, run_args


class Tiny(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(16, 4)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters())

    def train_dataloader(self):
        return DataLoader(TensorDataset(torch.randn(64, 16), torch.arange(64) % 4), batch_size=16)


def test_the_probe_s_ddp_wrapper_optimizers_view_grads_and_hook_state_are_collected(one_rank_group):
    """Everything a probe under DDP holds, gone after free() (no gc.collect() here)."""
    trainer = build.build_trainer(run_args(), [])
    run = inrun._Probe(trainer, Tiny(), run_args(), dict(SMALL))
    copied, run.view = inrun.attach(trainer, run.module)
    optimizers = inrun.build_optimizers(run.view)
    run.runner = step_probe.Runner(copied, optimizers, run.device)
    run.view.strategy.runner = run.runner
    run.batches, run.waits = [(torch.randn(4, 16), torch.arange(4))] * 2, [0.0, 0.0]
    run.runner.wrap()
    run.runner.step(run.batches, 0, synced=True)
    assert run.runner.counter.calls >= 1  # the synced step went through DDP's comm hook
    held = {"copy": copied, "optimizer": optimizers[0], "ddp": run.runner.ddp, "view": run.view,
            "hook state": run.runner.counter, "grad": copied.net.weight.grad, "batch": run.batches[0][0]}
    refs = {name: weakref.ref(obj) for name, obj in held.items()}
    del held, copied, optimizers
    run.free()
    alive = [name for name, ref in refs.items() if ref() is not None]
    assert not alive, f"outlived the probe: {alive}"


def test_training_after_a_probe_compiles_its_own_graphs(monkeypatch, tmp_path):
    """The copy's compiled code shares the run's code objects: without a reset, training reused
    it and compiled nothing, so repeat 0's warm-up had no compile time."""
    from torch._dynamo.utils import counters

    class Graphs(pl.Callback):
        def on_train_epoch_start(self, trainer, pl_module):
            self.before = counters["stats"]["unique_graphs"]

        def on_train_epoch_end(self, trainer, pl_module):
            self.during = counters["stats"]["unique_graphs"] - self.before

    monkeypatch.chdir(tmp_path)  # Lightning's default checkpoint folder
    spec = run_args(16, compile="default")
    probed, graphs = ProbeBeforeTraining(spec, SMALL), Graphs()
    trainer = build.build_trainer(spec, [probed, graphs], max_epochs=1)
    trainer.fit(compiling.wrap(Tiny(), "default"))
    assert probed.record["status"] == "ok", probed.record
    assert graphs.during >= 1, "training ran the probe's compiled graphs"
    # compile_graphs in metrics.json counts training's graphs only
    assert compiling.stats()["compile_graphs"] == graphs.during


def test_release_counts_peak_memory_from_training_on(monkeypatch):
    """On CUDA the peak-memory statistics restart after the probe (peak_memory_mb reads
    max_memory_allocated, which held the probe's second model and optimizer)."""
    calls = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty_cache"))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: calls.append(("reset", device)))
    inrun.release(torch.device("cuda", 1))
    assert calls == ["empty_cache", ("reset", torch.device("cuda", 1))]
    calls.clear()
    inrun.release(torch.device("cpu"))
    assert calls == []
