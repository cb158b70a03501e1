"""Topologies ("MxN": M nodes x N devices per node) and the checks made before any job runs."""

from __future__ import annotations

import re
from dataclasses import dataclass

_TOPOLOGY_RE = re.compile(r"^\s*(\d+)\s*x\s*(\d+)\s*$")


class TopologyError(ValueError):
    """A topology that cannot run; the message names the entry and the fix."""


@dataclass(frozen=True, order=True)
class Topology:
    num_nodes: int
    devices_per_node: int

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.devices_per_node

    @property
    def name(self) -> str:
        return f"{self.num_nodes}x{self.devices_per_node}"

    def __str__(self) -> str:
        return self.name


def parse_topology(text: str, where: str = "topologies") -> Topology:
    match = _TOPOLOGY_RE.match(str(text))
    if not match:
        raise TopologyError(
            f"{where}: '{text}' is not a topology; write NODESxDEVICES, e.g. '1x4' "
            "for one node with 4 devices or '2x4' for two such nodes"
        )
    nodes, devices = int(match.group(1)), int(match.group(2))
    if nodes < 1:
        raise TopologyError(f"{where}: '{text}' has {nodes} nodes; nodes must be an integer >= 1")
    if devices < 1:
        raise TopologyError(
            f"{where}: '{text}' has {devices} devices per node; devices must be an integer >= 1"
        )
    return Topology(nodes, devices)


def check_topologies(
    entries: list,
    baseline: str,
    max_devices_per_node: int | None,
    scaling: str,
    batch_size: int,
    config_path: str = "config/config.yaml",
    multi_node_whole_nodes: bool = False,
    baseline_path: str | None = None,
) -> list[Topology]:
    """Parse and check every topology of the config against the site; return them sorted.

    config_path names the file that set `topologies`, baseline_path the one that set
    `baseline` (an overlay may set either), so a message sends the user to the right file.

    Raises TopologyError with the first problem found, so nothing is submitted.
    """
    topologies = []
    for i, entry in enumerate(entries):
        topo = parse_topology(entry, where=f"{config_path}, topologies[{i}]")
        if topo in topologies:
            raise TopologyError(f"{config_path}, topologies[{i}]: '{entry}' is listed twice")
        if max_devices_per_node is not None and topo.devices_per_node > max_devices_per_node:
            raise TopologyError(
                f"{config_path}, topologies[{i}]: '{entry}' asks for {topo.devices_per_node} "
                f"devices per node but the profile's nodes have {max_devices_per_node} "
                f"(site_gpus_per_node); use at most {max_devices_per_node} per node, "
                f"e.g. '{-(-topo.world_size // max_devices_per_node)}x{max_devices_per_node}'"
            )
        if (multi_node_whole_nodes and topo.num_nodes > 1 and max_devices_per_node is not None
                and topo.devices_per_node != max_devices_per_node):
            raise TopologyError(
                f"{config_path}, topologies[{i}]: '{entry}' spans {topo.num_nodes} nodes with "
                f"{topo.devices_per_node} of their {max_devices_per_node} GPUs each, but the site gives "
                f"a job of more than one node whole nodes (site_multi_node_whole_nodes) and would refuse "
                f"it; use '{topo.num_nodes}x{max_devices_per_node}' or one node"
            )
        if scaling == "strong" and batch_size % topo.world_size:
            raise TopologyError(
                f"{config_path}, topologies[{i}]: strong scaling splits the global batch "
                f"{batch_size} over {topo.world_size} devices, which does not divide evenly; "
                "choose a batch.size divisible by every world size"
            )
        topologies.append(topo)
    baseline_path = baseline_path or config_path
    base = parse_topology(baseline, where=f"{baseline_path}, baseline")
    if base not in topologies:
        raise TopologyError(
            f"{baseline_path}: baseline '{baseline}' is not among the topologies "
            f"{[t.name for t in topologies]}; add it, since speedup is measured against it"
        )
    return sorted(topologies, key=lambda t: (t.world_size, t.num_nodes))


def batch_per_device(scaling: str, batch_size: int, topo: Topology) -> int:
    """Weak scaling keeps the batch per device; strong scaling keeps the global batch."""
    if scaling == "weak":
        return batch_size
    return batch_size // topo.world_size


# The training stages, in the order the workflow runs them, and the rule that trains each
# (workflow/rules/train.smk; a profile's set-resources names these).
STAGES = ("baseline", "single_node", "multi_node")
STAGE_RULES = {stage: f"train_{stage}" for stage in STAGES}


def stage_of(topo: Topology, baseline: str) -> str:
    """The configured baseline, whatever its size; else one node or several."""
    if topo.name == parse_topology(baseline, "baseline").name:
        return "baseline"
    return "single_node" if topo.num_nodes == 1 else "multi_node"


def stage_topologies(topologies: list[Topology], baseline: str) -> dict[str, list[str]]:
    """{stage: names of its topologies}; a stage may have none."""
    return {stage: [t.name for t in topologies if stage_of(t, baseline) == stage] for stage in STAGES}


def name_pattern(names: list[str]) -> str:
    """A wildcard constraint matching exactly these topology names ("(?!)" matches none)."""
    return "|".join(re.escape(n) for n in names) if names else "(?!)"
