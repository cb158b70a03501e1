"""Every sample counted once (ddpscale.job.measure.samplecount, timing, the built-in data modules): training
throughput leaves out DistributedSampler's padding repeats, evaluation sees each sample once,
and the epoch's sample count stays exact above 2^24."""

from __future__ import annotations

import pytest
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from ddpscale.job.measure import samplecount
from ddpscale.job.measure.timing import EpochTiming
from ddpscale.workloads.models import SpiralMLP
from ddpscale.workloads.resident import ResidentBatches, shard_indices


@pytest.mark.parametrize("n,world", [(10, 3), (11, 3), (12, 3), (7, 2), (2, 3), (1201, 4)])
def test_counted_samples_are_the_dataset_once_for_every_padding(n, world):
    """Against torch's own DistributedSampler: what each rank really reads, counted, is n."""
    dataset = TensorDataset(torch.arange(n))
    total, seen = 0, []
    for rank in range(world):
        sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=False)
        shard = samplecount.shard_of(DataLoader(dataset, sampler=sampler))
        indices = list(sampler)
        total += samplecount.counted(len(indices), shard)
        seen += indices[: samplecount.counted(len(indices), shard)]
        # the resident batches shard the same way
        assert shard_indices(n, rank, world).tolist() == indices
    assert total == n and sorted(seen) == list(range(n))


def test_a_shard_cut_short_counts_what_it_read():
    # drop_last of the last partial batch: the repeat sits in the dropped part
    assert samplecount.counted(8, (31, 2, 3)) == 8
    assert samplecount.counted(11, (31, 2, 3)) == 10


def test_nothing_is_padded_on_one_rank_or_with_drop_last_or_unpadded():
    dataset = TensorDataset(torch.arange(10))
    assert samplecount.shard_of(DataLoader(dataset)) is None
    sampler = DistributedSampler(dataset, num_replicas=3, rank=2, drop_last=True)
    assert samplecount.shard_of(DataLoader(dataset, sampler=sampler)) is None
    from pytorch_lightning.overrides.distributed import UnrepeatedDistributedSampler

    unpadded = UnrepeatedDistributedSampler(dataset, num_replicas=3, rank=2)
    assert samplecount.shard_of(DataLoader(dataset, sampler=unpadded)) is None
    assert samplecount.shard_of(ResidentBatches((torch.arange(10),), 4, False)) is None  # one rank


def test_unpadded_resident_evaluation_reads_each_sample_once():
    n, world = 11, 3
    seen = []
    for rank in range(world):
        batches = ResidentBatches((torch.arange(n),), 2, False, pad=False)
        batches.rank, batches.world = rank, world
        got = [int(i) for (b,) in batches for i in b]
        assert len(batches) == -(-len(got) // 2)
        seen += got
    assert sorted(seen) == list(range(n))


def test_an_epoch_count_above_2_24_stays_exact():
    """The per-epoch count goes through the strategy's all-reduce as float64, not float32."""
    trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    metrics = EpochTiming(warmup_epochs=0)
    model = SpiralMLP()
    count = 2**24 + 1  # float32 rounds it to 2^24
    metrics.on_train_epoch_start(trainer, model)
    metrics._count = count
    metrics._close_epoch(trainer, model)
    assert metrics.samples == [count]
    assert float(torch.tensor(float(count))) != count, "float32 would have lost it"


class ShardsByRank(torch.utils.data.Sampler):
    """A hand-written sharding sampler that copies DistributedSampler's interface without
    subclassing it: Lightning wraps it in DistributedSamplerWrapper and shards it again."""

    def __init__(self, n: int, num_replicas: int, rank: int):
        self.n, self.num_replicas, self.rank = n, num_replicas, rank

    def __iter__(self):
        return iter(range(self.rank, self.n, self.num_replicas))

    def __len__(self):
        return len(range(self.rank, self.n, self.num_replicas))


def test_a_sampler_sharded_twice_is_named():
    from lightning_fabric.utilities.distributed import DistributedSamplerWrapper
    from torch.utils.data import WeightedRandomSampler

    dataset = TensorDataset(torch.arange(40))
    wrapped = DistributedSamplerWrapper(ShardsByRank(40, 2, 1), num_replicas=2, rank=1, shuffle=False)
    assert len(list(wrapped)) == 10, "Lightning's wrapper shards the 20 indices of rank 1 again"
    warning = samplecount.sharded_twice(DataLoader(dataset, sampler=wrapped), 2)
    assert warning.startswith("ddpscale: warning: the train dataloader's sampler ShardsByRank shards by rank "
                              "itself (num_replicas=2)") and "about 1/4 of the training set" in warning
    assert samplecount.sharded_twice([DataLoader(dataset), DataLoader(dataset, sampler=wrapped)], 2) == warning
    # a DistributedSampler is kept as it is, and a wrapped sampler that does not shard is fine
    assert samplecount.sharded_twice(DataLoader(dataset, sampler=DistributedSampler(dataset, 2, 1)), 2) is None
    weighted = DistributedSamplerWrapper(WeightedRandomSampler([1.0] * 40, 40), num_replicas=2, rank=1)
    assert samplecount.sharded_twice({"a": DataLoader(dataset, sampler=weighted)}, 2) is None


def test_a_batch_that_is_a_mapping_of_any_kind_counts_its_samples_not_its_keys():
    """Hugging Face's padding collator yields a BatchEncoding, a UserDict: not a dict, so it
    was counted by its number of keys (3 here) instead of its 8 samples."""
    from collections import UserDict

    encoding = UserDict({"input_ids": torch.zeros(8, 16), "attention_mask": torch.ones(8, 16),
                         "labels": torch.zeros(8)})
    assert samplecount.structure_sizes(encoding) == [8]
    assert samplecount.samples_of(encoding, 0, None) == (8, None)
    assert samplecount.structure_sizes([{"x": torch.zeros(8, 2)}, torch.zeros(8)]) == [8]  # nested
    assert samplecount.structure_sizes({"text": ["a", "b", "c"], "y": torch.zeros(3)}) == [3]  # strings


def plan(batch_size=8, drop_last=False, drawn=20):
    return samplecount.LoaderPlan(batch_size, drop_last, drawn)


def test_the_loader_says_how_many_samples_each_batch_of_an_epoch_holds():
    """20 samples in batches of 8: 8, 8, then a short last batch of 4 (or none with drop_last)."""
    assert [plan().expected(i) for i in range(3)] == [(8, True), (8, True), (4, True)]
    assert plan(drop_last=True, drawn=16).expected(1) == (8, True)
    assert plan(drawn=None).expected(0) == (8, False)  # an iterable dataset: at most 8
    loader = DataLoader(TensorDataset(torch.zeros(20, 3)), batch_size=8)
    assert samplecount.loader_plan(loader) == plan()
    assert [samplecount.samples_of(b, i, plan())[0] for i, b in enumerate(loader)] == [8, 8, 4]


def test_a_first_element_that_is_not_batched_is_not_what_is_counted():
    """(a per-batch scalar tensor of shape (2,), inputs, targets): the old count took the first
    leaf and said 2."""
    batch = (torch.tensor([0.5, 0.1]), torch.zeros(8, 5), torch.zeros(8))
    n, why = samplecount.samples_of(batch, 0, plan(drawn=64))
    assert (n, why) == (8, None)


def test_a_sequence_first_batch_disagrees_with_the_loader_until_its_dimension_is_declared():
    """(time 50, batch 8, features) and (time 50, batch 8) targets: dimension 0 says 50."""
    batch = (torch.zeros(50, 8, 3), torch.zeros(50, 8))
    n, why = samplecount.samples_of(batch, 0, plan())
    assert n is None and "8 samples" in why and "50 along dimension 0" in why and "batch.dim" in why
    assert "\n" not in why
    assert samplecount.samples_of(batch, 0, plan(), dim=1) == (8, None)
    # nothing to check it against (a batch sampler of the user's own): still no guess
    assert samplecount.samples_of((torch.zeros(50, 8, 3), torch.zeros(8)), 0, None)[0] is None


def test_the_modules_own_count_is_taken_and_checked():
    """Two augmented views of 8 samples (16 rows): the module says 8; a wrong answer is refused."""
    batch = torch.zeros(16, 3)
    assert samplecount.samples_of(batch, 0, plan())[0] is None
    assert samplecount.samples_of(batch, 0, plan(), stated=8) == (8, None)
    for bad in (True, -1, 8.0, "8", None.__class__):
        n, why = samplecount.samples_of(batch, 0, plan(), stated=bad)
        assert n is None and "samples_in_batch" in why
    assert samplecount.samples_of(batch, 0, plan(), stated=7)[0] is None  # not what the loader drew


def test_an_iterable_dataset_is_counted_by_its_batch_up_to_the_batch_size():
    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(torch.zeros(19, 2))

    loader = DataLoader(Stream(), batch_size=8)
    assert samplecount.loader_plan(loader) == plan(drawn=None)
    assert [samplecount.samples_of(b, i, samplecount.loader_plan(loader))[0] for i, b in enumerate(loader)] == [8, 8, 3]
    n, why = samplecount.samples_of(torch.zeros(9, 2), 0, plan(drawn=None))
    assert n is None and "at most 8" in why


def test_a_batch_sampler_of_the_users_own_is_counted_by_the_batch_alone():
    class Halves(torch.utils.data.Sampler):
        def __iter__(self):
            return iter([[0, 1, 2], [3, 4]])

        def __len__(self):
            return 2

    loader = DataLoader(TensorDataset(torch.zeros(5, 2), torch.zeros(5)), batch_sampler=Halves())
    assert samplecount.loader_plan(loader) is None
    assert [samplecount.samples_of(b, i, None)[0] for i, b in enumerate(loader)] == [3, 2]
    explicit = DataLoader(TensorDataset(torch.zeros(5, 2)),
                          batch_sampler=torch.utils.data.BatchSampler(range(5), 2, drop_last=True))
    assert samplecount.loader_plan(explicit) == plan(2, True, 5)


def test_the_counter_says_once_and_keeps_counting(capsys):
    counter = samplecount.BatchCounter()
    counter.start_epoch(DataLoader(TensorDataset(torch.zeros(20, 3)), batch_size=8))
    assert counter.count((torch.zeros(8, 3),)) == 8 and counter.problem is None
    assert counter.count(torch.zeros(50, 8)) == 8  # the loader's figure, but marked
    assert counter.problem and counter.count(torch.zeros(50, 4)) == 4
    assert capsys.readouterr().out.count("samples not counted") == 1
