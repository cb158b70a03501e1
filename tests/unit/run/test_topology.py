"""Topology parsing and the checks made before any job runs (ddpscale.run.topology)."""
import re

import pytest

from ddpscale.run.topology import (
    Topology, TopologyError, batch_per_device, check_topologies, name_pattern, parse_topology, stage_topologies,
)


def check(entries, baseline="1x1", max_per_node=4, scaling="weak", batch=64):
    return check_topologies(entries, baseline, max_per_node, scaling, batch)


@pytest.mark.parametrize("text, nodes, devices", [("1x4", 1, 4), (" 2 x 4 ", 2, 4), ("4x1", 4, 1)])
def test_parse_topology(text, nodes, devices):
    topo = parse_topology(text)
    assert (topo.num_nodes, topo.devices_per_node) == (nodes, devices)
    assert topo.world_size == nodes * devices
    assert topo.name == str(topo) == f"{nodes}x{devices}"


@pytest.mark.parametrize("text, fix", [
    ("0x2", "nodes must be an integer >= 1"),
    ("2x0", "devices must be an integer >= 1"),
    ("abc", "write NODESxDEVICES, e.g. '1x4'"),
    ("2by4", "write NODESxDEVICES"),
])
def test_parse_topology_errors_name_entry_and_fix(text, fix):
    with pytest.raises(TopologyError) as err:
        parse_topology(text, where="cfg, topologies[3]")
    message = str(err.value)
    assert message.startswith("cfg, topologies[3]: ")
    assert f"'{text}'" in message
    assert fix in message


def test_check_sorts_by_world_size_then_nodes():
    topos = check(["2x4", "4x1", "1x1", "2x2", "1x4"])
    assert [t.name for t in topos] == ["1x1", "1x4", "2x2", "4x1", "2x4"]
    assert topos[0] == Topology(1, 1)


def test_check_rejects_duplicate_even_when_spelt_differently():
    with pytest.raises(TopologyError, match=r"topologies\[2\]: ' 1 x 4 ' is listed twice"):
        check(["1x1", "1x4", " 1 x 4 "])


def test_check_rejects_missing_baseline():
    with pytest.raises(TopologyError) as err:
        check(["1x2", "2x2"], baseline="1x1")
    assert "baseline '1x1' is not among the topologies ['1x2', '2x2']" in str(err.value)
    assert "add it" in str(err.value)


def test_check_rejects_bad_baseline_text():
    with pytest.raises(TopologyError, match=r"baseline: 'one' is not a topology"):
        check(["1x1"], baseline="one")


@pytest.mark.parametrize("entry, suggestion", [("1x8", "'2x4'"), ("3x6", "'5x4'")])
def test_check_rejects_more_devices_than_a_node_has(entry, suggestion):
    with pytest.raises(TopologyError) as err:
        check(["1x1", entry], max_per_node=4)
    message = str(err.value)
    assert f"topologies[1]: '{entry}'" in message
    assert "the profile's nodes have 4 (site_gpus_per_node)" in message
    assert f"use at most 4 per node, e.g. {suggestion}" in message


def test_check_without_site_limit_allows_any_devices_per_node():
    assert [t.name for t in check(["1x1", "1x16"], max_per_node=None)] == ["1x1", "1x16"]


def test_strong_scaling_needs_batch_divisible_by_world_size():
    with pytest.raises(TopologyError) as err:
        check(["1x1", "1x2", "1x3"], scaling="strong", batch=64)
    message = str(err.value)
    assert "topologies[2]" in message
    assert "global batch 64 over 3 devices" in message
    assert "batch.size divisible by every world size" in message
    # weak scaling keeps the batch per device, so any world size is fine
    assert len(check(["1x1", "1x2", "1x3"], scaling="weak", batch=64)) == 3


@pytest.mark.parametrize("scaling, topo, expected", [
    ("weak", "1x1", 32), ("weak", "2x4", 32), ("strong", "1x1", 32), ("strong", "2x4", 4),
    ("strong", "4x1", 8),
])
def test_batch_per_device(scaling, topo, expected):
    assert batch_per_device(scaling, 32, parse_topology(topo)) == expected


def test_stages_split_the_topologies_around_the_configured_baseline():
    topologies = check(["1x1", "1x2", "1x4", "2x4", "4x1"], baseline="1x1")
    assert stage_topologies(topologies, "1x1") == {
        "baseline": ["1x1"], "single_node": ["1x2", "1x4"], "multi_node": ["4x1", "2x4"]}  # by world size
    # the baseline is whatever the config names, even several devices or nodes
    assert stage_topologies(topologies, "1x2")["baseline"] == ["1x2"]
    assert stage_topologies(topologies, " 2 x 4 ") == {
        "baseline": ["2x4"], "single_node": ["1x1", "1x2", "1x4"], "multi_node": ["4x1"]}


def test_a_stage_pattern_matches_its_topologies_only():
    pattern = re.compile(rf"(?:{name_pattern(['1x2', '1x4'])})$")
    assert pattern.match("1x2") and pattern.match("1x4")
    assert not pattern.match("1x24") and not pattern.match("11x2") and not pattern.match("1x1")
    assert not re.match(rf"(?:{name_pattern([])})$", "1x1"), "an empty stage matches nothing"


def test_a_site_that_gives_multi_node_jobs_whole_nodes_refuses_part_nodes():
    # Raven: a job of more than one node takes whole 4-GPU nodes; 2x2 would be refused by sbatch
    with pytest.raises(TopologyError) as err:
        check_topologies(["1x1", "1x2", "2x2"], "1x1", 4, "weak", 64, multi_node_whole_nodes=True)
    assert "'2x2' spans 2 nodes with 2 of their 4 GPUs each" in str(err.value)
    assert "use '2x4' or one node" in str(err.value)
    # one node may take part of it; several nodes all of each
    ok = check_topologies(["1x1", "1x2", "2x4"], "1x1", 4, "weak", 64, multi_node_whole_nodes=True)
    assert [t.name for t in ok] == ["1x1", "1x2", "2x4"]
    # other sites share nodes between multi-node jobs
    assert len(check_topologies(["1x1", "2x2"], "1x1", 4, "weak", 64)) == 2
