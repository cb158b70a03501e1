"""The baseline's compute at other per-device batches (ddpscale.job.probe.step) and
Lightning's per-batch sync timed by the probe (step_probe.sigterm_broadcast, step_probe.measure)
(the batches the workflow asks for: tests/workflow/test_batchsizes.py)."""
from __future__ import annotations

import inspect
from collections import namedtuple

import pytest
import pytorch_lightning as pl
import torch
import torch.distributed as dist

from ddpscale.job.probe import step as step_probe

Pair = namedtuple("Pair", "x y")


def drawn(n_batches=3, size=4):
    """Batches as a dataloader gives them: sample i holds the number i."""
    return [(torch.arange(b * size, (b + 1) * size).float().unsqueeze(1), torch.arange(b * size, (b + 1) * size))
            for b in range(n_batches)]


def test_resized_batches_are_the_drawn_samples_in_order_wrapping_around():
    out = step_probe.resize(drawn(), 5, 3)  # 12 samples drawn
    assert [b[1].tolist() for b in out] == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9], [10, 11, 0, 1, 2]]
    assert all(isinstance(b, tuple) and b[0].shape == (5, 1) for b in out)
    assert step_probe.resize(drawn(), 2, 2)[1][0].squeeze(1).tolist() == [2.0, 3.0]


def test_dicts_and_named_tuples_keep_their_structure():
    dicts = [{"x": x, "y": y} for x, y in drawn()]
    out = step_probe.resize(dicts, 8, 1)[0]
    assert set(out) == {"x", "y"} and out["y"].tolist() == list(range(8))
    pairs = [Pair(x, y) for x, y in drawn()]
    out = step_probe.resize(pairs, 6, 1)[0]
    assert isinstance(out, Pair) and out.y.tolist() == list(range(6))


@pytest.mark.parametrize("batch, words", [
    ((torch.zeros(4), ["a", "b", "c", "d"]), "a batch holding str cannot be resized"),
    ((torch.zeros(4), torch.zeros(3)), "first dimensions ['3', '4'] cannot be resized"),
])
def test_a_batch_it_cannot_resize_says_why(batch, words):
    with pytest.raises(ValueError, match=words.replace("[", r"\[").replace("]", r"\]")):
        step_probe.resize([batch], 2, 1)


class Tiny(pl.LightningModule):
    """A linear model that remembers the batch sizes it trained on; fails above `limit`."""

    def __init__(self, limit=None):
        super().__init__()
        self.net = torch.nn.Linear(1, 1)
        self.limit, self.seen = limit, set()

    def training_step(self, batch, batch_idx):
        x, y = batch
        if self.limit is not None and len(x) > self.limit:
            raise RuntimeError("CUDA out of memory (as a GPU says it)")
        self.seen.add(len(x))
        return ((self.net(x).squeeze(1) - y.float()) ** 2).mean()

    def backward(self, loss, *args, **kwargs):
        loss.backward()


def runner(module):
    return step_probe.Runner(module, [torch.optim.SGD(module.parameters(), lr=1e-4)], torch.device("cpu"))


def test_compute_is_timed_at_every_size_and_a_size_that_fails_is_na_with_its_reason():
    module = Tiny(limit=8)
    rows = step_probe.compute_by_batch(runner(module), drawn(), [16, 2, 4, 8, 4], 4, 0.123,
                                       steps=2, rounds=1, warmup=1)
    assert [r["batch_per_device"] for r in rows] == [2, 4, 8, 16]
    by = {r["batch_per_device"]: r for r in rows}
    assert by[4] == {"batch_per_device": 4, "compute_s": 0.123}, "the run's own batch: its own timing"
    assert by[2]["compute_s"] > 0 and by[8]["compute_s"] > 0
    assert by[16] == {"batch_per_device": 16, "compute_s": None,
                      "reason": "RuntimeError: CUDA out of memory (as a GPU says it)"}
    assert module.seen == {2, 8}, "each size's steps ran on batches of that size"


def test_the_probe_does_lightnings_sigterm_broadcast_as_lightning_does():
    """Lightning 2.6 still broadcasts before every batch of a multi-rank run: when an upgrade
    drops it (upstream #21640), the term must go too."""
    from pytorch_lightning.loops.training_epoch_loop import _TrainingEpochLoop

    assert "self._broadcast_sigterm_tensor()" in inspect.getsource(_TrainingEpochLoop.advance)
    lightning = inspect.getsource(_TrainingEpochLoop._broadcast_sigterm_tensor)
    assert "torch.distributed.broadcast(sigterm_tensor, src=0)" in lightning and "sigterm_tensor.item()" in lightning
    ours = inspect.getsource(step_probe.sigterm_broadcast)
    assert "dist.broadcast(flag, src=0)" in ours and "flag.item()" in ours


@pytest.fixture
def one_rank_group(tmp_path):
    """A real (gloo, one rank) process group, so the probe's DDP and collectives run in-process."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("accumulate", [1, 2])
def test_synced_blocks_are_timed_with_and_without_one_broadcast_per_batch(one_rank_group, monkeypatch, accumulate):
    calls = []
    real = step_probe.sigterm_broadcast
    monkeypatch.setattr(step_probe, "sigterm_broadcast", lambda device: (calls.append(device), real(device)))
    step = step_probe.measure(runner(Tiny()), drawn(), [0.001], 2, steps=4, rounds=3, warmup=1, accumulate=accumulate)
    opt_steps = 4 // accumulate
    # one per micro-batch, as Lightning's loop does, in the loop_sync blocks only (warm-up + 3 rounds)
    assert len(calls) == (1 + 3 * opt_steps) * accumulate
    assert step["loop_sync_s"] == pytest.approx(max(0.0, step["loop_sync_diff_s"]))
    assert step["sync_step_with_loop_sync_s"] > 0
    assert "SIGTERM broadcast" in step["method"]


def test_one_rank_has_no_lightning_sync(monkeypatch):
    monkeypatch.setattr(step_probe, "sigterm_broadcast", lambda device: pytest.fail("one rank does not broadcast"))
    step = step_probe.measure(runner(Tiny()), drawn(), [0.001], 1, steps=2, rounds=1, warmup=1)
    assert step["loop_sync_s"] == 0 and step["sync_step_with_loop_sync_s"] == step["compute_s"]


def test_the_probe_batch_sizes_flag_is_parsed_and_not_part_of_the_runs_identity(tmp_path):
    from ddpscale.run import runspec
    from helpers.training import train_args

    spec = runspec.parse([*train_args(tmp_path / "d.npz", tmp_path), "--probe-batch-sizes", "[8, 16, 32]"])
    assert spec.probe_batch_sizes == [8, 16, 32]
    assert "probe_batch_sizes" not in spec.measured(), "timing more sizes must not restart a run"
    with pytest.raises(SystemExit):
        runspec.parse([*train_args(tmp_path / "d.npz", tmp_path), "--probe-batch-sizes", "[0, 8]"])
