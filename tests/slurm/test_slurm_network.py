"""A run where communication dominates, on the test cluster's shaped network.

minicluster.sh links each node to the others at 1 Gbit/s each way (netns.sh). A spiral MLP
with 1024-wide layers has a gradient of ~8.4 MB: its all-reduce between two nodes takes ~70 ms,
several times the step's compute, so 2x1 is bound by the link while 1x2 (two ranks on one node)
is not. The report must show it: 2x1's all-reduce busbw near the link's rate and 1x2's well above
it, a 2x1 step that waits for most of the link's time, the prediction naming communication, and
no "nodes simulated on one host" label.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest

from helpers.slurm import run_slurm, slurm_workspace
from helpers.workflow import tiny_config

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.timeout(900)]

LINK_GBYTES_S = 1e9 / 8 / 1e9     # minicluster.sh's default --rate 1gbit, in GB/s as the report writes
HIDDEN = [1024, 1024, 1024]


def test_a_two_node_run_bound_by_the_link_is_reported_as_such(slurm_cluster, workspace):
    # 4 epochs: two ranks train 264 batches, and the probe's smallest size (43 batches) fits in
    # its 20% of them whatever the host's load (proberecord.sized). With 3, it fitted only under
    # the 10 s floor, and a loaded host skipped 1x2's probe.
    config = tiny_config(topologies=["1x1", "1x2", "2x1"], max_epochs=4)
    config["dataset"]["samples"] = 6000
    config["model"]["init_args"]["hidden"] = HIDDEN
    slurm_workspace(workspace).write_config(config)
    # one job at a time: the fake nodes share this machine's two cores, and runs side by side
    # would measure each other
    code, log = run_slurm(workspace, "--jobs", "1", timeout=800)
    assert code == 0, log[-4000:]

    report = workspace.results / "report"
    scaling = pd.read_csv(report / "scaling.tsv", sep="\t").set_index("topology")
    prediction = pd.read_csv(report / "prediction.tsv", sep="\t").set_index("topology")
    breakdown = pd.read_csv(report / "breakdown.tsv", sep="\t").set_index("topology")
    # every topology's probe measured (a skipped one has no all-reduce to read below; its column says why)
    assert breakdown["comm_s"].notna().all(), breakdown["probe"].to_dict()
    html = (report / "report.html").read_text()
    two_nodes = json.loads(workspace.metrics("2x1").read_text())
    allreduce = max(two_nodes["probe"]["allreduce"], key=lambda row: row["bytes"])
    one_node = json.loads(workspace.metrics("1x2").read_text())
    loopback = max(one_node["probe"]["allreduce"], key=lambda row: row["bytes"])
    print(f"\n2x1 all-reduce of {allreduce['bytes']:,} bytes: busbw {allreduce['busbw_gbps']:.4f} GB/s "
          f"(link {LINK_GBYTES_S:.4f}); efficiency 1x2 {scaling.loc['1x2', 'efficiency']:.3f}, "
          f"2x1 {scaling.loc['2x1', 'efficiency']:.3f}\nexposed communication per step 1x2 "
          f"{breakdown.loc['1x2', 'comm_s'] * 1e3:.1f} ms, 2x1 {breakdown.loc['2x1', 'comm_s'] * 1e3:.1f} ms"
          f"\n1x2 all-reduce of {loopback['bytes']:,} bytes: busbw {loopback['busbw_gbps']:.4f} GB/s"
          f"\n2x1 prediction: {prediction.loc['2x1', 'explanation']}")

    # the gradient's all-reduce crossed the link: never faster than it (unshaped loopback gives
    # GB/s), and not far slower. The host's load decides how much slower: gloo sums the buffers
    # on the same two cores the fake nodes share, and a loaded CI host measured 85% of the link.
    assert allreduce["bytes"] > 8e6
    assert 0.5 * LINK_GBYTES_S <= allreduce["busbw_gbps"] <= 1.05 * LINK_GBYTES_S
    assert f"{allreduce['busbw_gbps']:.3f}" in html, "the report's all-reduce table shows that figure"
    # within one node the same gradient never crossed the link: its loop of 20 all-reduces sums
    # on the same loaded cores (3 CPU hogs beside it measured 5.5x the link) but is not bound by it
    assert loopback["bytes"] == allreduce["bytes"]
    assert loopback["busbw_gbps"] >= 1.5 * LINK_GBYTES_S, "1x2's all-reduce went through the shaped link"
    # a 2x1 step waits for the link: the probe's exposed communication (synchronised minus
    # no_sync steps, timed in alternating blocks) covers most of the gradient's time at the
    # link's rate. It is not compared with 1x2's: it also holds the wait for the slower rank,
    # which the host's load sets (a loaded CI host gave 1x2 60 ms, 2x1 87 ms; quiet, 15 and 82),
    # nor are the efficiencies, which divide throughputs measured minutes apart on shared cores.
    link_s = allreduce["bytes"] / (LINK_GBYTES_S * 1e9)
    assert breakdown.loc["2x1", "comm_s"] >= 0.5 * link_s, "backward cannot hide most of the link's time"
    assert "communication" in prediction.loc["2x1", "explanation"], prediction.loc["2x1", "explanation"]
    # the ranks were on two hosts and went through ib0: nothing says the network was not crossed
    assert len(two_nodes["hosts"]) == 2 and {r["interface"] for r in two_nodes["transport"]} == {"ib0"}
    assert not scaling["simulated_nodes_on_one_host"].fillna(False).astype(bool).any()
    assert "no network crossed" not in html
