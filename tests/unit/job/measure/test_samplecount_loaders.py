"""Every training loader's samples counted (ddpscale.job.measure.samplecount): several loaders combined as
Lightning combines them, and a DistributedSampler inside a batch sampler of the user's own. The
truth is read from what the loaders yield: each dataset holds its own indices, so a batch says
which samples it holds, and DistributedSampler's padding repeats are the positions of a rank's
shard beyond its real samples."""

from __future__ import annotations

import random

import pytest
import torch
from pytorch_lightning.utilities import CombinedLoader
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler, TensorDataset

from ddpscale.job.measure import samplecount
from fixtures.usermods.bucketing import BucketBatchSampler

WORLD = 2


def indices(n: int) -> TensorDataset:
    return TensorDataset(torch.arange(n))


def sharded(n: int, rank: int, batch_size: int = 16) -> DataLoader:
    """A rank's loader as Lightning builds it under DDP: DistributedSampler, padded."""
    return DataLoader(indices(n), batch_size=batch_size, sampler=DistributedSampler(indices(n), WORLD, rank,
                                                                                    shuffle=False))


def truth(loaders: dict[str, DataLoader], mode: str, rank: int) -> tuple[int, int]:
    """(real samples, padding repeats) the combined loader yields in an epoch on this rank: a
    sample is real where its place in the loader's pass is within the rank's real samples."""
    real = padding = 0
    places = dict.fromkeys(loaders, 0)
    for batch, _, _ in iter(CombinedLoader(loaders, mode)):
        for name, part in batch.items():
            if part is None:
                continue
            n = len(loaders[name].dataset)
            keep = samplecount.real_samples(n, rank, WORLD)
            for _ in part[0]:
                real += places[name] < keep
                padding += places[name] >= keep
                places[name] += 1
            if places[name] == len(loaders[name].sampler):  # a cycle ends: the next pass starts again
                places[name] = 0
    return real, padding


@pytest.mark.parametrize("mode", ["max_size_cycle", "min_size", "max_size"])
@pytest.mark.parametrize("rank", [0, 1])
def test_every_loader_of_a_combined_batch_is_counted_and_padding_apart(mode, rank):
    loaders = {"labeled": sharded(301, rank), "unlabeled": sharded(512, rank)}
    combined = CombinedLoader(loaders, mode)
    real, padding = truth(loaders, mode, rank)
    counter = samplecount.BatchCounter()
    counter.start_epoch(combined)
    counted = sum(counter.count(batch) for batch, _, _ in iter(combined))
    assert counter.problem is None
    assert (counted, counter.padding) == (real, padding)
    steps = len(combined)
    each = samplecount.epoch_counts(samplecount.train_loaders(combined), steps, 16)
    assert (sum(r for r, _ in each.values()), sum(p for _, p in each.values())) == (real, padding)


def test_the_shorter_loader_cycles_and_what_it_yields_again_counts():
    """max_size_cycle, one rank: 19 labeled batches are a pass, 32 unlabeled: 13 labeled batches
    are trained twice, and count twice; a dict is what fit combines so."""
    loaders = {"labeled": DataLoader(indices(301), batch_size=16), "unlabeled": DataLoader(indices(512), batch_size=16)}
    each = samplecount.epoch_counts(samplecount.train_loaders(loaders), 32, 16)
    assert each == {"labeled": (301 + 13 * 16, 0), "unlabeled": (512, 0)}
    record = {"train_loaders": [{"name": k, "samples_per_epoch": v[0]} for k, v in each.items()],
              "train_loaders_mode": "max_size_cycle", "padding_per_epoch": 0}
    assert samplecount.describe(record) == (
        "ddpscale: samples: every training loader's samples count (max_size_cycle: labeled 509, unlabeled 512 an "
        "epoch; a shorter loader's samples count again each time it starts again)")


def test_a_list_of_loaders_and_nested_collections_are_split_by_their_structure():
    loaders = [DataLoader(indices(10), batch_size=4), {"a": DataLoader(indices(6), batch_size=3)}]
    found = samplecount.train_loaders(loaders)
    assert found.names == ("0", "1/a") and found.mode == "max_size_cycle"
    batch = samplecount.first_batch(loaders)
    assert samplecount.batch_samples(batch, loaders) == (7, None)
    assert samplecount.train_loaders(DataLoader(indices(3))).names == ("train",)


def test_a_batch_that_is_not_the_loaders_collection_is_uncounted_with_the_reason(capsys):
    loaders = {"labeled": DataLoader(indices(10), batch_size=4), "unlabeled": DataLoader(indices(6), batch_size=4)}
    counter = samplecount.BatchCounter()
    counter.start_epoch(loaders)
    counter.count([torch.zeros(4)])  # a list where the loaders are a dict
    assert counter.problem.startswith("a training batch is a list, not the collection of the train loaders "
                                      "['labeled', 'unlabeled'] that max_size_cycle combines;")
    assert capsys.readouterr().out.count("samples not counted") == 1


def test_a_part_that_disagrees_with_its_loader_names_the_loader():
    loaders = {"labeled": DataLoader(indices(10), batch_size=4), "unlabeled": DataLoader(indices(6), batch_size=4)}
    counter = samplecount.BatchCounter(quiet=True)
    counter.start_epoch(loaders)
    counter.count({"labeled": [torch.zeros(4)], "unlabeled": [torch.zeros(3)]})
    assert counter.problem.startswith("train loader 'unlabeled': the train loader gives batch 0 of this rank 4 "
                                      "samples")


def test_the_modules_own_count_of_a_combined_batch_must_agree_with_its_parts():
    loaders = {"labeled": DataLoader(indices(10), batch_size=4), "unlabeled": DataLoader(indices(6), batch_size=4)}
    batch = samplecount.first_batch(loaders)
    assert samplecount.batch_samples(batch, loaders, stated=8) == (8, None)
    n, why = samplecount.batch_samples(batch, loaders, stated=4)
    assert n is None and why.startswith("the module's samples_in_batch() says 4 but the batches of the train "
                                        "loaders ['labeled', 'unlabeled'] hold 8;")


def bucketed(n: int, rank: int | None, batch_size: int = 16) -> DataLoader:
    """A length-bucketing batch sampler of the user's own around a DistributedSampler, as
    Lightning's re-created loader holds it: the loader's own `sampler` is a SequentialSampler."""
    lengths = [random.Random(i).randint(3, 20) for i in range(n)]
    sampler = DistributedSampler(indices(n), WORLD, rank, shuffle=True) if rank is not None else range(n)
    return DataLoader(indices(n), batch_sampler=BucketBatchSampler(sampler, batch_size, lengths=lengths))


def test_the_distributed_sampler_inside_a_batch_sampler_is_found():
    loader = bucketed(303, 1)
    assert samplecount.distributed_sampler(loader) is loader.batch_sampler.sampler
    assert samplecount.shard_of(loader) == (303, 1, WORLD)
    explicit = DataLoader(indices(7), batch_sampler=BatchSampler(DistributedSampler(indices(7), WORLD, 0), 2, False))
    assert samplecount.shard_of(explicit) == (7, 0, WORLD)
    assert samplecount.loader_plan(explicit) == samplecount.LoaderPlan(2, False, 4)  # the rank's 4, not all 7
    assert samplecount.shard_of(bucketed(303, None)) is None


def test_a_bucketing_batch_sampler_counts_each_sample_once_over_the_ranks():
    """303 samples, two ranks: each draws 152, rank 1's last a repeat of rank 0's first. Its
    batches come in any order, so the epoch caps at the rank's real samples."""
    counted, padding, epochs = 0, 0, []
    for rank in range(WORLD):
        loader = bucketed(303, rank)
        counter = samplecount.BatchCounter()
        counter.start_epoch(loader)
        counted += sum(counter.count(batch) for batch in loader)
        padding += counter.padding
        assert counter.problem is None
        epochs.append(samplecount.epoch_counts(samplecount.train_loaders(loader), len(loader), 16)["train"])
    assert (counted, padding) == (303, 1)
    assert [sum(r for r, _ in epochs), sum(p for _, p in epochs)] == [303, 1]


class Grows(BucketBatchSampler):
    """Yields one more batch each time it is walked: the pass its copy yielded is not the one
    training gets, so the epoch's figure could not be right."""

    walks = 0

    def __iter__(self):
        Grows.walks += 1
        batches = list(super().__iter__())
        return iter(batches + batches[:Grows.walks])


def test_a_batch_sampler_whose_pass_differs_from_its_copy_is_uncounted():
    loader = DataLoader(indices(64), batch_sampler=Grows(range(64), 16, lengths=[1] * 64))
    counter = samplecount.BatchCounter(quiet=True)
    counter.start_epoch(loader)
    for batch in loader:
        counter.count(batch)
    assert counter.problem.startswith("the batch sampler Grows yields 80 samples a pass in 5 batches of at most 16, "
                                      "but its batches held 16 (batch 5), 96 so far;")


def test_walking_a_copy_of_the_batch_sampler_moves_no_random_stream():
    generator = torch.Generator().manual_seed(3)
    sampler = torch.utils.data.RandomSampler(indices(50), generator=generator)
    loader = DataLoader(indices(50), batch_sampler=BucketBatchSampler(sampler, 8, lengths=[1] * 50))
    torch.manual_seed(0)
    random.seed(0)
    before = (generator.get_state(), torch.get_rng_state(), random.getstate())
    samplecount.loader_pass("train", loader)
    assert torch.equal(generator.get_state(), before[0]) and torch.equal(torch.get_rng_state(), before[1])
    assert random.getstate() == before[2]
