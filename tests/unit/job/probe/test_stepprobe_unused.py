"""The probe's steps under DDP whatever parameters a step uses: gradients cleared as Lightning
clears them (the module's optimizer_zero_grad), no_sync() blocks followed by synchronised ones
with parameters some steps leave unused (ddp.find_unused_parameters), DDP's static graph, and
the settings the probe cannot time named in its reason (ddpscale.job.probe.step, inrun).

DDP runs here on a gloo group of one rank in this process: its reducer keeps the same state of
used parameters and the same checks on one rank as on several (two real ranks:
tests/workflow/test_probe.py)."""

from __future__ import annotations

import pytest
import pytorch_lightning as pl
import torch
from ddpscale.job.probe import inrun
from ddpscale.job.probe import step as step_probe


class SkipsOnEvenBatches(pl.LightningModule):
    """A block used on odd batch indices only (LayerDrop's effect, on a fixed schedule): the
    block's parameters get no gradient in even steps."""

    def __init__(self):
        super().__init__()
        self.head = torch.nn.Linear(4, 2)
        self.block = torch.nn.Linear(4, 4)
        self.cleared = []  # (batch_idx, set_to_none) of each optimizer_zero_grad call

    def training_step(self, batch, batch_idx):
        x, y = batch
        h = x + self.block(x) if batch_idx % 2 else x
        return torch.nn.functional.cross_entropy(self.head(h), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class KeepsGradients(SkipsOnEvenBatches):
    """Overrides Lightning's optimizer_zero_grad hook, as its docs show."""

    def optimizer_zero_grad(self, epoch, batch_idx, optimizer):
        self.cleared.append((epoch, batch_idx))
        optimizer.zero_grad(set_to_none=False)


def batches(n: int = 4) -> list:
    gen = torch.Generator().manual_seed(0)
    return [(torch.randn(8, 4, generator=gen), torch.randint(0, 2, (8,), generator=gen)) for _ in range(n)]


def runner(module, **ddp) -> step_probe.Runner:
    module.backward = lambda loss, *args, **kwargs: loss.backward()  # no trainer: Lightning's backward needs one
    run = step_probe.Runner(module, [torch.optim.SGD(module.parameters(), lr=0.1)], torch.device("cpu"),
                           ddp_kwargs=ddp)
    run.wrap()
    return run


@pytest.mark.usefixtures("one_rank_group")
def test_a_synchronised_block_after_no_sync_steps_with_unused_parameters_runs():
    """The compute block's step 1 used the block under no_sync(); step 0 of the synchronised block
    leaves it unused, its gradient cleared since: DDP would all-reduce an undefined gradient
    ("Encountered gradient which is undefined") unless the no_sync() stretch is ended first."""
    module = SkipsOnEvenBatches()
    run = runner(module, find_unused_parameters=True)
    data = batches()
    assert step_probe.time_block(run, data, 2, synced=False) > 0
    weight = module.block.weight.detach().clone()
    assert step_probe.time_block(run, data, 1, synced=True) > 0
    # the timed step kept the module's gradients: the block, unused, got none, as in training,
    # and the optimizer left it as it was; the head got its own
    assert module.block.weight.grad is None and torch.equal(module.block.weight, weight)
    assert module.head.weight.grad is not None
    assert step_probe.time_block(run, data, 2, synced=True) > 0
    assert module.block.weight.grad is not None  # step 1 used it


@pytest.mark.usefixtures("one_rank_group")
def test_the_probe_measures_a_module_whose_steps_leave_parameters_unused():
    """measure() rotates compute-only and synchronised blocks: every order works, and under
    no_sync() no gradient is all-reduced."""
    run = runner(SkipsOnEvenBatches(), find_unused_parameters=True)
    step = step_probe.measure(run, batches(), [0.0] * 4, 2, steps=3, rounds=3, warmup=2)
    assert step["compute_s"] > 0 and step["sync_step_s"] > 0
    assert step["allreduce_calls_per_batch_no_sync"] == 0 and step["allreduce_calls_per_batch"] > 0


@pytest.mark.usefixtures("one_rank_group")
def test_the_probe_measures_under_ddp_s_static_graph():
    """ddp.static_graph: DDP records the graph in its first iteration, which torch cannot run
    under no_sync(): the probe's first step under DDP is a synchronised one."""
    class UsesAll(SkipsOnEvenBatches):
        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.cross_entropy(self.head(x + self.block(x)), y)

    step = step_probe.measure(runner(UsesAll(), static_graph=True), batches(), [0.0] * 4, 2, steps=2, rounds=2,
                             warmup=1)
    assert step["compute_s"] > 0 and step["sync_step_s"] > 0


@pytest.mark.usefixtures("one_rank_group")
@pytest.mark.parametrize("accumulate", [1, 2])
def test_gradients_are_cleared_by_the_module_s_own_hook_once_per_optimizer_step(accumulate):
    """Lightning clears gradients through LightningModule.optimizer_zero_grad(epoch, batch_idx,
    optimizer), on the first micro-batch of each optimizer step; a module that overrides it (here
    set_to_none=False) keeps its way in the probe."""
    module = KeepsGradients()
    run = runner(module, find_unused_parameters=True)
    step_probe.time_block(run, batches(), 2, synced=True, accumulate=accumulate)
    assert module.cleared == [(0, 0), (0, accumulate)]
    assert module.block.weight.grad is not None  # zeroed, not set to None, by the module's choice


def test_an_error_of_ddp_that_a_setting_causes_names_the_setting():
    ddp = {"find_unused_parameters": False, "static_graph": True}

    def said(text: str, settings: dict, accumulate: int = 1) -> str:
        return inrun.failure_of(RuntimeError(text), "timing training steps under DDP", 0, settings, accumulate).reason

    unused = ("Expected to have finished reduction in the prior iteration before starting a new one. This error "
              "indicates that your module has parameters that were not used in producing loss.")
    assert "set ddp.find_unused_parameters: true in your config" in said(unused, {})
    changed = ("Your training graph has changed in this iteration, e.g., one parameter is unused in first iteration, "
               "but then got used in the second iteration. this is not compatible with static_graph set to True.")
    assert "set ddp.static_graph: false in your config" in said(changed, ddp)
    hooks = ('expect_autograd_hooks_ INTERNAL ASSERT FAILED at "reducer.cpp":1732, please report a bug to '
             "PyTorch.")
    line = said(hooks, ddp, accumulate=4)
    assert "ddp.static_graph: true" in line and "accumulate_grad_batches 4" in line and "PyTorch" not in line
    # the same assert with no static graph is not the setting's: torch's text stays
    assert "INTERNAL ASSERT" in said(hooks, {}, accumulate=4)
    for reason in (said(unused, {}), said(changed, ddp), line):
        assert "\n" not in reason and reason.endswith("(in timing training steps under DDP)")
