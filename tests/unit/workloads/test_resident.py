"""Resident batches: DistributedSampler's sharding, every sample once per epoch, a shuffle that
depends on the epoch alone (so a resumed run sees the order an uninterrupted one would)."""

from __future__ import annotations

import pytest
import torch
from lightning_fabric.utilities.data import _set_sampler_epoch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from ddpscale.workloads.resident import ResidentBatches, check_no_workers, from_dataset, shard_indices
from ddpscale.workloads.spiral_datamodule import SpiralDataModule
from ddpscale.workloads.synthetic_datamodule import SyntheticDataModule


def batches(n: int = 10, batch_size: int = 4, shuffle: bool = False, **kwargs) -> ResidentBatches:
    x = torch.arange(n, dtype=torch.float32).unsqueeze(1)
    return ResidentBatches((x, torch.arange(n)), batch_size, shuffle, **kwargs)


def seen(loader: ResidentBatches) -> list[int]:
    return [int(i) for _, y in loader for i in y]


@pytest.mark.parametrize("n,world", [(10, 3), (12, 4), (7, 2), (3, 4)])
def test_shards_are_those_of_distributed_sampler(n, world):
    dataset = TensorDataset(torch.arange(n))
    for rank in range(world):
        expected = list(DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=False))
        assert shard_indices(n, rank, world).tolist() == expected


def test_shards_cover_every_sample_with_equal_step_counts():
    order = torch.randperm(10)  # one permutation, drawn alike on every rank
    shards = [shard_indices(10, rank, 3, order).tolist() for rank in range(3)]
    assert {len(s) for s in shards} == {4}  # padded: every rank takes the same number of steps
    assert set(sum(shards, [])) == set(range(10))


def test_a_rank_outside_the_world_is_an_error():
    with pytest.raises(ValueError, match="rank 3 is outside a world of 3"):
        shard_indices(10, 3, 3)


def test_unshuffled_batches_are_the_data_in_order_with_a_short_last_batch():
    loader = batches(10, 4)
    sizes = [len(x) for x, _ in loader]
    assert sizes == [4, 4, 2] and len(loader) == 3
    assert seen(loader) == list(range(10))
    for x, y in loader:  # the tensors stay paired
        assert torch.equal(x.squeeze(1).long(), y)


def test_shuffle_is_a_permutation_set_by_the_epoch_alone():
    loader = batches(50, 8, shuffle=True, seed=3)
    first = seen(loader)
    assert sorted(first) == list(range(50)) and first != list(range(50))
    assert seen(loader) == first, "the same epoch must give the same order"
    loader.set_epoch(1)
    second = seen(loader)
    assert second != first and sorted(second) == list(range(50))
    # a fresh loader (a resumed run) at epoch 1 draws what the uninterrupted one drew
    resumed = batches(50, 8, shuffle=True, seed=3)
    resumed.set_epoch(1)
    assert seen(resumed) == second


def test_lightning_finds_set_epoch_where_it_looks_for_it():
    loader = batches(20, 4, shuffle=True)
    _set_sampler_epoch(loader, 5)
    assert loader.epoch == 5


def test_tensors_of_unequal_length_and_a_zero_batch_are_errors():
    with pytest.raises(ValueError, match="equal length"):
        ResidentBatches((torch.zeros(3), torch.zeros(4)), 2, False)
    with pytest.raises(ValueError, match="batch_size must be at least 1"):
        batches(batch_size=0)


def test_workers_with_resident_batches_name_the_fix():
    check_no_workers(True, 0)
    check_no_workers(False, 4)
    with pytest.raises(ValueError, match="set dataloader.num_workers: 0 or data.init_args.resident: false"):
        check_no_workers(True, 2)
    with pytest.raises(ValueError, match="num_workers: 0"):
        SyntheticDataModule(resident=True, num_workers=1)


def test_from_dataset_outside_a_trainer_keeps_the_tensors_in_place():
    dataset = TensorDataset(torch.arange(6.0), torch.arange(6))
    loader = from_dataset(dataset, 4, shuffle=False)
    assert loader.tensors[0] is dataset.tensors[0]
    assert seen(loader) == list(range(6))


@pytest.mark.parametrize("resident", [False, True])
def test_both_data_paths_of_the_built_in_modules_give_the_same_samples(data_file, resident):
    spiral = SpiralDataModule(data_file=data_file, batch_size=64, resident=resident)
    synthetic = SyntheticDataModule(batch_size=64, samples=200, resident=resident)
    for module, train_size in ((spiral, 840), (synthetic, 160)):
        module.setup("fit")
        loader = module.train_dataloader()
        assert isinstance(loader, ResidentBatches) is resident
        labels = torch.cat([y for _, y in loader])
        assert len(labels) == train_size
        assert sorted(labels.tolist()) == sorted(module.splits["train"].tensors[1].tolist())


def test_the_shuffle_seed_is_lightnings_global_seed_alike_on_every_rank(monkeypatch):
    dataset = TensorDataset(torch.arange(40.0), torch.arange(40))
    monkeypatch.setenv("PL_GLOBAL_SEED", "7")
    torch.manual_seed(1)  # torch's own seed differs between ranks in a user's script; it must not matter
    first = from_dataset(dataset, 8, shuffle=True)
    torch.manual_seed(2)
    assert seen(from_dataset(dataset, 8, shuffle=True)) == seen(first)
    assert first.seed == 7
    monkeypatch.delenv("PL_GLOBAL_SEED")
    assert from_dataset(dataset, 8, shuffle=True).seed == 0  # as Lightning's DistributedSampler


@pytest.mark.parametrize("n, batch, world", [(10, 3, 1), (10, 3, 2), (9, 3, 1), (7, 8, 1)])
def test_drop_last_gives_full_batches_only_as_a_dataloader_does(n, batch, world):
    x = torch.arange(n)
    for rank in range(world):
        loader = ResidentBatches((x,), batch, shuffle=False, drop_last=True)
        loader.rank, loader.world = rank, world
        sizes = [len(b[0]) for b in loader]
        assert all(size == batch for size in sizes) and len(sizes) == len(loader)
        shard = shard_indices(n, rank, world)
        assert len(loader) == len(DataLoader(TensorDataset(shard), batch_size=batch, drop_last=True))
