"""Whether throughput mode can win for the configured training (ddpscale.plan.cost.throughputfit):
batches per epoch of the built-in data modules, held to their loaders, and the verdict on plain
configs. The line in a real dry run: tests/workflow/test_reservation_dryrun.py."""
from __future__ import annotations

import inspect

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from ddpscale.run.topology import parse_topology
from ddpscale.plan.cost import throughputfit
from ddpscale.plan.cost.throughputfit import Epoch, epoch_batches, judge, sharded_batches
from ddpscale.workloads.markov_datamodule import MarkovTokens
from ddpscale.workloads.resident import ResidentBatches
from ddpscale.workloads.synthetic_datamodule import SyntheticDataModule
from helpers.configs import default_config

SHIPPED = ["1x1", "1x2", "2x1"]


def topologies(*names):
    return [parse_topology(name) for name in names]


def windows_of(steps: int, **changes) -> dict:
    """The shipped config with windows of `steps` training steps."""
    shipped = default_config()["throughput"]
    return default_config(throughput={**shipped, "window_steps": steps}, **changes)


def markov(**changes) -> dict:
    """config/transformer.yaml's shape: 300 steps per epoch on every rank, 5 epochs, weak scaling."""
    config = windows_of(20, max_epochs=5, batch={"scaling": "weak", "size": 16, "dim": 0}, **changes)
    config["dataset"]["generator"] = "none"
    config["data"] = {"class_path": throughputfit.MARKOV, "init_args": {"steps_per_epoch": 300}, "files": []}
    return config


def user_module(**changes) -> dict:
    config = default_config(**changes)
    config["dataset"]["generator"] = "none"
    config["data"] = {"class_path": "mine.data.Loader", "init_args": {}, "files": []}
    return config


@pytest.mark.parametrize("samples,world,batch", [(7000, 1, 64), (7000, 2, 32), (840, 4, 16), (10, 3, 4), (5, 2, 8)])
@pytest.mark.parametrize("drop_last", [False, True])
def test_batches_per_rank_are_those_of_the_resident_batches_and_of_distributed_sampler(samples, world, batch,
                                                                                        drop_last):
    expected = sharded_batches(samples, world, batch, drop_last)
    dataset = TensorDataset(torch.arange(samples))
    for rank in range(world):
        resident = ResidentBatches(dataset.tensors, batch, shuffle=True, drop_last=drop_last)
        resident.rank, resident.world = rank, world  # as torch.distributed would set them
        sampler = DistributedSampler(dataset, num_replicas=world, rank=rank)
        assert len(resident) == len(DataLoader(dataset, batch, sampler=sampler, drop_last=drop_last)) == expected
    assert sharded_batches(samples, world, batch, drop_last, sharded=False) == len(
        DataLoader(dataset, batch, drop_last=drop_last))


def test_the_built_in_modules_defaults_are_read_as_their_classes_have_them():
    assert inspect.signature(MarkovTokens).parameters["steps_per_epoch"].default == throughputfit.MARKOV_STEPS
    assert inspect.signature(SyntheticDataModule).parameters["samples"].default == throughputfit.SYNTHETIC_SAMPLES
    module = SyntheticDataModule(samples=130, features=2)
    module.setup()
    assert len(module.splits["train"]) == int(130 * throughputfit.SYNTHETIC_TRAIN)


def test_each_topology_s_epoch_of_the_built_in_modules():
    # the shipped spiral: 7000 training samples, a global batch of 64 (strong scaling)
    shipped = default_config()
    assert [epoch_batches(shipped, t, {}) for t in topologies(*SHIPPED)] == [Epoch(110)] * 3
    # weak scaling: 64 per device, each rank a half or a quarter of the samples
    weak = default_config(batch={"scaling": "weak", "size": 64, "dim": 0})
    assert [epoch_batches(weak, t, {}).batches for t in topologies("1x1", "1x2", "2x2")] == [110, 55, 28]
    # torch.compile drops the last partial batch (the pipeline sets drop_last)
    assert epoch_batches(default_config(compile="default"), parse_topology("1x1"), {}).batches == 109
    # a DataLoader without Lightning's sampler reads every sample on every rank
    plain = default_config(data={**shipped["data"], "init_args": {"resident": False}})
    assert epoch_batches(plain, parse_topology("1x2"), {"use_distributed_sampler": False}).batches == 219
    assert epoch_batches(markov(), parse_topology("2x4"), {}).batches == 300
    synthetic = user_module()
    synthetic["data"] = {"class_path": throughputfit.SYNTHETIC, "init_args": {"samples": 65536}, "files": []}
    assert epoch_batches(synthetic, parse_topology("1x2"), {}).batches == 820  # 52428 / 2 / 32


def test_a_users_module_is_unknown_unless_limit_train_batches_bounds_it():
    one = parse_topology("1x1")
    assert epoch_batches(user_module(), one, {}) == Epoch(None)
    assert epoch_batches(user_module(), one, {"limit_train_batches": 40}) == Epoch(40, exact=False)
    assert epoch_batches(user_module(), one, {"limit_train_batches": 0.5}) == Epoch(None)
    # Lightning's own rule on a known epoch: a whole number caps it, a fraction keeps its share
    assert epoch_batches(default_config(), one, {"limit_train_batches": 40}) == Epoch(40)
    assert epoch_batches(default_config(), one, {"limit_train_batches": 0.5}) == Epoch(55)
    assert epoch_batches(default_config(), one, {"limit_train_batches": 1.0}) == Epoch(110)


def test_the_spiral_in_windows_of_20_cannot_reach_its_precision():
    """Seen with windows of 20 steps: every run ended at its configured epochs with intervals of
    46-88%, at three times the cost of training in full."""
    verdict = judge(windows_of(20), topologies(*SHIPPED), {})
    assert verdict.cannot_win == "throughput mode cannot reach its precision inside the configured training"
    line = verdict.line("auto")
    assert line.startswith("throughput mode cannot win here: 1x1, 1x2 and 2x1 train 330 batches per rank "
                           "(3 epochs x 110), short of the 600 its stopping rule needs before its first look "
                           "(throughput.min_windows 30 x window_steps 20, plus any warm-up it cuts)")
    assert "at 3 runs per topology (repeats: auto) where full training takes 1" in line
    assert "max_epochs: 6 or more (or throughput.window_steps: 11 or fewer) would let it reach its precision" in line
    # with repeats of its own, full mode repeats as often
    assert "at the cost of full training" in judge(windows_of(20, repeats=2), topologies(*SHIPPED), {}).finding
    # the fix named holds: at 6 epochs every run can reach its precision (and costs more: next test)
    assert "cannot reach" not in (judge(windows_of(20, max_epochs=6), topologies(*SHIPPED), {}).cannot_win or "")
    # as shipped (windows of 10, so that full runs have the steady windows an interval needs) the
    # first look fits in the training, and three repeats of it cost more than one full training
    shipped = judge(default_config(), topologies(*SHIPPED), {})
    assert shipped.cannot_win == "throughput mode costs more than full training on every topology"


def test_three_repeats_of_the_rule_s_least_can_cost_more_than_one_full_training():
    """The transformer's 5 x 300 batches reach the first look, but 3 repeats of 600 or more cost
    more than one full training of 1500: auto trains in full. With repeats set, full mode repeats
    as often, and throughput mode's 600 of 1500 wins."""
    verdict = judge(markov(), topologies("1x1", "1x4", "2x4"), {})
    assert verdict.cannot_win == "throughput mode costs more than full training on every topology"
    assert ("it runs each topology 3 times (repeats: auto) for at least 600 batches per rank (its stopping rule's "
            "first look: throughput.min_windows 30 x window_steps 20), 1800 or more, where full training of 1x1, 1x4 "
            "and 2x4 is 1 run of 1500 batches per rank (5 epochs x 300)") in verdict.finding
    assert judge(markov(repeats=3), topologies("1x1", "1x4"), {}) == throughputfit.Verdict(None, None)
    # weak scaling of the spiral: 2x2 trains a quarter of 1x1's batches; throughput mode still wins on 1x1
    weak = windows_of(20, max_epochs=30, batch={"scaling": "weak", "size": 64, "dim": 0})
    partial = judge(weak, topologies("1x1", "2x2"), {})
    assert partial.cannot_win is None
    assert partial.line("auto").startswith("throughput mode costs more than full training on 2x2:")
    assert partial.line("auto").endswith("it saves on the other topologies")


def test_a_long_enough_training_is_left_to_throughput_mode():
    assert judge(default_config(max_epochs=50), topologies(*SHIPPED), {}) == throughputfit.Verdict(None, None)


def test_a_step_cap_below_the_first_look_cannot_reach_the_precision_whatever_the_data():
    verdict = judge(user_module(throughput={"max_steps": 500}), topologies("1x1"), {})
    assert verdict.cannot_win and "throughput.max_steps 500 stops every run short of the 600" in verdict.finding
    assert "throughput.max_steps: 600 or more" in verdict.finding


def test_a_users_module_is_said_unknown_not_guessed():
    verdict = judge(user_module(), topologies("1x1", "1x2"), {})
    assert verdict.cannot_win is None
    assert verdict.line("auto").startswith("throughput mode: steps per epoch unknown before a run "
                                           "(mine.data.Loader builds its loader only in a run)")
    # a whole-number limit_train_batches bounds it: at most 3 x 40 can never reach 600
    bounded = judge(user_module(), topologies("1x1"), {"limit_train_batches": 40})
    assert bounded.cannot_win and "1x1 trains at most 120 batches per rank (3 epochs x at most 40)" in bounded.finding


@pytest.mark.parametrize("args", [{"steps_per_epoch": "many"}, {"steps_per_epoch": True}])
def test_a_built_in_module_given_what_its_job_would_refuse_is_unknown(args):
    config = markov()
    config["data"]["init_args"] = args
    assert epoch_batches(config, parse_topology("1x1"), {}) == Epoch(None)


def test_an_epoch_of_no_batches_is_judged_without_a_fix_it_cannot_name():
    verdict = judge(user_module(), topologies("1x1"), {"limit_train_batches": 0})
    assert verdict.cannot_win and "1x1 trains at most 0 batches per rank" in verdict.finding
    assert "would let it reach" not in verdict.finding
