"""The transformer's Markov token stream: reproducible from the seed, the same global batch for
any world size, the same steps on every rank, fresh each epoch, and the stated floor."""

from __future__ import annotations

import types

import pytest
import torch
from lightning_fabric.utilities.data import _set_sampler_epoch
from pytorch_lightning.trainer.states import TrainerStatus

from ddpscale.workloads.markov_datamodule import TEST_OFFSET, VAL_OFFSET, MarkovChain, MarkovTokens
from helpers.configs import TINY_PRESET


def tiny_data(**changes) -> MarkovTokens:
    args = {**TINY_PRESET["data"]["init_args"], "batch_size": 8, **changes}
    return MarkovTokens(**args)


def global_batch(data: MarkovTokens, split: str, world: int, epoch: int, step: int) -> torch.Tensor:
    parts = []
    for rank in range(world):
        loader = data.loader(split, rank=rank, world=world)
        loader.set_epoch(epoch)
        parts.append(torch.cat(loader.batch(step), dim=1))
    return torch.cat(parts)


def test_batches_are_sequences_shifted_by_one_from_the_seed():
    data = tiny_data()
    x, y = next(iter(data.train_dataloader()))
    assert x.shape == y.shape == (8, 64) and x.dtype == y.dtype == torch.long and x.device.type == "cpu"
    assert torch.equal(x[:, 1:], y[:, :-1])
    assert 0 <= int(x.min()) and int(x.max()) < 256
    again = next(iter(tiny_data().train_dataloader()))
    assert torch.equal(again[0], x) and torch.equal(again[1], y)
    other = next(iter(tiny_data(seed=1).train_dataloader()))
    assert not torch.equal(other[0], x)


@pytest.mark.parametrize("split", ["train", "val", "test"])
def test_strong_scaling_sees_the_same_global_batch_on_1_and_2_ranks(split):
    one, two = tiny_data(batch_size=8), tiny_data(batch_size=4)  # global batch 8 either way
    for epoch, step in [(0, 0), (0, 3), (2, 1)]:
        assert torch.equal(global_batch(one, split, 1, epoch, step), global_batch(two, split, 2, epoch, step))
    # the ranks' shards are different sequences
    halves = global_batch(two, split, 2, 0, 0).split(4)
    assert not torch.equal(halves[0], halves[1])


def test_every_rank_takes_the_same_number_of_steps():
    data = tiny_data(steps_per_epoch=7, val_batches=3, test_batches=2)
    for split, steps in [("train", 7), ("val", 3), ("test", 2)]:
        lengths = {len(data.loader(split, rank=r, world=3)) for r in range(3)}
        counted = {sum(1 for _ in data.loader(split, rank=r, world=3)) for r in range(3)}
        assert lengths == counted == {steps}


def test_training_stream_moves_on_with_the_epoch_and_a_resumed_loader_sees_it_again():
    data = tiny_data()
    train, val = data.train_dataloader(), data.val_dataloader()
    first_train, first_val = next(iter(train))[0], next(iter(val))[0]
    _set_sampler_epoch(train, 3)  # what Lightning does at each epoch start
    _set_sampler_epoch(val, 3)
    assert train.epoch == 3 and not torch.equal(next(iter(train))[0], first_train)
    assert torch.equal(next(iter(val))[0], first_val), "validation must be the same set every epoch"
    resumed = tiny_data().train_dataloader()
    resumed.set_epoch(3)
    assert torch.equal(next(iter(resumed))[0], next(iter(train))[0])
    assert train.sampler is train and train.batch_sampler is None


def test_validation_and_test_never_repeat_training_sequences():
    data = tiny_data()
    val, test = data.loader("val"), data.loader("test")
    assert val.indices(0)[0] == VAL_OFFSET and test.indices(0)[0] == TEST_OFFSET
    # torch's CPU generator keeps 32 bits of a seed: the spaces must differ below 2**32
    train0 = data.chain.sequences(range(8), 65)
    assert not torch.equal(torch.cat(val.batch(0), 1), train0)
    assert not torch.equal(torch.cat(test.batch(0), 1), train0)
    late = data.loader("train")
    late.set_epoch(2**31 // (8 * 50) + 1)
    with pytest.raises(ValueError, match="train stream has room for"):
        late.batch(0)


def test_stream_entropy_is_the_stated_floor_and_max_q_the_ceiling():
    chain = MarkovChain(256, 4, seed=0)
    assert chain.loss_floor == pytest.approx(1.1847, abs=1e-4)  # as config/transformer_tiny.yaml says
    assert chain.accuracy_ceiling == pytest.approx(0.5267, abs=1e-4)
    tokens = chain.sequences(range(400), 700)
    pairs = torch.bincount((tokens[:, :-1] * 256 + tokens[:, 1:]).reshape(-1), minlength=256 * 256).view(256, 256)
    assert {int(n) for n in (pairs > 0).sum(1)} == {4}, "every token has exactly K successors"
    rows = pairs.double()
    p_row = rows / rows.sum(1, keepdim=True)
    weights = rows.sum(1) / rows.sum()
    entropy = float(-(weights * torch.where(rows > 0, p_row * p_row.log(), 0.0).sum(1)).sum())
    best_guess = float(rows.max(1).values.sum() / rows.sum())
    assert entropy == pytest.approx(chain.loss_floor, abs=0.01)
    assert best_guess == pytest.approx(chain.accuracy_ceiling, abs=0.01)
    # the start state is uniform (the walk's stationary law), so every token is about as frequent
    counts = torch.bincount(tokens.reshape(-1), minlength=256).double()
    assert float(counts.std() / counts.mean()) < 0.1


def test_workers_are_refused_clearly():
    with pytest.raises(ValueError, match="no DataLoader workers; set dataloader.num_workers: 0"):
        tiny_data(num_workers=2)
    with pytest.raises(ValueError, match="both rank and world"):
        tiny_data().loader("train", rank=0)


def test_batches_go_to_the_device_only_while_a_trainer_runs():
    data = tiny_data()
    assert next(iter(data.train_dataloader()))[0].device.type == "cpu"  # no trainer: the probe
    trainer = types.SimpleNamespace(strategy=types.SimpleNamespace(root_device=torch.device("meta")),
                                    state=types.SimpleNamespace(status=TrainerStatus.RUNNING))
    data.trainer = trainer
    assert next(iter(data.train_dataloader()))[0].device.type == "meta"
    # after fit the pipeline counts FLOPs on the CPU copy of the model with a fresh loader
    trainer.state.status = TrainerStatus.FINISHED
    assert next(iter(data.train_dataloader()))[0].device.type == "cpu"
