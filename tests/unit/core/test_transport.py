"""Which network a run's collectives crossed: NCCL's own log parsed, gloo's
interface found, the run's record read by the report, which flags sockets on an InfiniBand site.

The NCCL logs under tests/fixtures/nccl/ say in their first lines where their formats come from.
"""
from __future__ import annotations

import pandas as pd
import pytest

from ddpscale.plan.site.resources import SiteError, site_from_resources
from ddpscale.core.transport import gloo_interface, parse_nccl_log
from ddpscale.report.figures import interconnect
from ddpscale.report.figures.scaling import run_facts
from ddpscale.report.verdict.caveats import OVER_SOCKETS, label
from ddpscale.job.device.transport import nccl_debug_env

from helpers.records import make_run
from helpers.workflow import ROOT

FIXTURES = ROOT / "tests/fixtures/nccl"


@pytest.mark.parametrize("name, expected", [
    ("ib_2x1_rank0.log", {"transport": "IB", "interface": "mlx5_0:1/IB", "network": "IB"}),
    ("socket_2x1_rank1.log", {"transport": "Socket", "interface": "ib0", "network": "Socket"}),
    # NCCL picked IB at init, but no channel left the node
    ("p2p_1x2_rank0.log", {"transport": "P2P/SHM", "interface": None, "network": "IB"}),
    # a plugin built on verbs is InfiniBand; its device index points into the HCA list
    ("ibext_2x4_rank2.log", {"transport": "IB", "interface": "mlx5_2:1/IB", "network": "IBext_v8"}),
])
def test_the_transport_is_read_from_the_channels_nccl_connected(name, expected):
    assert parse_nccl_log((FIXTURES / name).read_text()) == expected


def test_a_log_without_channels_names_no_transport():
    # NCCL_DEBUG=WARN (a user's choice) prints no INFO line at all
    assert parse_nccl_log("gpu-a001:1:1 [0] NCCL WARN something\n")["transport"] is None


def test_nccl_logs_to_a_file_per_rank_unless_the_user_set_its_logging():
    assert nccl_debug_env("results/runs/2x4/r0", {}) == {
        "NCCL_DEBUG": "INFO", "NCCL_DEBUG_FILE": "results/runs/2x4/r0/nccl/%h.%p.log", "NCCL_DEBUG_SUBSYS": "INIT,NET"}
    assert nccl_debug_env("run", {"NCCL_DEBUG": "WARN"}) == {}
    assert nccl_debug_env("run", {"NCCL_DEBUG_FILE": "/tmp/n.%p"}) == {}
    assert "NCCL_DEBUG_SUBSYS" not in nccl_debug_env("run", {"NCCL_DEBUG_SUBSYS": "ALL"})


INTERFACES = {"lo": [("127.0.0.1", "255.0.0.0"), ("::1", None)],
              "eth0": [("192.168.1.20", "255.255.255.0")], "ib0": [("10.1.2.3", "255.255.0.0")]}


@pytest.mark.parametrize("ifname, resolved, expected", [
    ("ib0", ["192.168.1.20"], "ib0"),  # GLOO_SOCKET_IFNAME wins
    (None, ["10.1.2.3"], "ib0"),  # the host name's address is ib0's
    (None, ["172.16.0.9", "192.168.1.20"], "eth0"),  # the first address that is this host's
    (None, ["127.0.1.1"], "lo"),  # Debian's /etc/hosts name: loopback, not an address of lo
    (None, [], "lo"),  # unresolved: gloo falls back to the loopback
])
def test_gloo_binds_where_the_host_name_resolves(ifname, resolved, expected):
    assert gloo_interface(ifname, resolved, INTERFACES) == expected


def record(topology="2x1", nodes=2, site="infiniband", ranks=None):
    return make_run(topology, num_nodes=nodes, devices_per_node=2 // nodes, world_size=2, hosts=["a", "b"],
                    simulated=False, device_kind="cuda", site_interconnect=site, transport=ranks)


def nccl(transport, interface):
    return {"rank": 0, "host": "a", "backend": "nccl", "transport": transport, "interface": interface}


def test_each_run_says_its_network():
    gloo = [{"backend": "gloo", "interface": "eth0", "transport": "TCP"}] * 2
    assert interconnect.run_text(gloo) == "gloo on eth0"
    assert interconnect.run_text([nccl("IB", "mlx5_0:1/IB")] * 2) == "NCCL over InfiniBand (NET/IB on mlx5_0:1/IB)"
    assert interconnect.run_text([nccl("P2P/SHM", None)]) == "NCCL within the node (P2P/SHM)"
    unknown = {**nccl(None, None), "why_unknown": "NCCL_DEBUG or NCCL_DEBUG_FILE set by the user"}
    assert "not recorded (NCCL_DEBUG" in interconnect.run_text([unknown])
    assert interconnect.run_text(None) is None  # one rank: no collectives


def test_a_multi_node_run_over_sockets_on_an_infiniband_site_is_flagged():
    sockets = [nccl("Socket", "ib0"), {**nccl("Socket", "ib0"), "rank": 1}]
    runs = pd.DataFrame([record("2x1", ranks=sockets), record("4x1", ranks=[nccl("IB", "mlx5_0:1/IB")]),
                         record("1x2", nodes=1, ranks=[nccl("P2P/SHM", None)])])
    note = interconnect.fallback_note(runs)
    assert note.startswith("2x1 ran NCCL over sockets (NET/Socket on ib0), not InfiniBand as the site's facts say")
    assert "check NCCL_IB_HCA / NCCL_SOCKET_IFNAME" in note and "4x1" not in note
    facts = run_facts(runs)
    assert facts["nccl_over_sockets"].tolist() == [True, False, False]
    assert facts["transport"][0] == "NCCL over sockets (NET/Socket on ib0)"
    assert OVER_SOCKETS in label({"topology": "2x1", "nccl_over_sockets": True})


@pytest.mark.parametrize("changes", [{"site": "ethernet"}, {"site": "unknown"}, {"nodes": 1}])
def test_sockets_are_not_flagged_where_the_site_does_not_promise_infiniband(changes):
    nodes = changes.get("nodes", 2)
    row = record(nodes=nodes, site=changes.get("site", "infiniband"), ranks=[nccl("Socket", "eth0")])
    assert interconnect.socket_fallback(row) is None


def test_the_site_states_its_interconnect_from_a_known_list():
    site = site_from_resources({"site_launcher": "srun", "site_interconnect": "infiniband"})
    assert site.interconnect == "infiniband"
    assert site_from_resources({}).interconnect == "unknown"
    with pytest.raises(SiteError, match="site_interconnect must be one of infiniband, ethernet, unknown"):
        site_from_resources({"site_interconnect": "IB"})


def test_a_rank_reads_the_log_nccl_named_after_its_host_and_pid(tmp_path):
    import os
    import socket

    from ddpscale.job.device.transport import rank_entry

    # NCCL's %h is the host name up to its first dot, %p the pid (NVIDIA/nccl src/debug.cc)
    logs = tmp_path / "nccl"
    logs.mkdir()
    (logs / f"{socket.gethostname().split('.')[0]}.{os.getpid()}.log").write_text(
        (FIXTURES / "socket_2x1_rank1.log").read_text())
    entry = rank_entry("nccl", str(tmp_path))
    assert (entry["backend"], entry["transport"], entry["interface"]) == ("nccl", "Socket", "ib0")
    (logs / f"{socket.gethostname().split('.')[0]}.{os.getpid()}.log").unlink()
    assert rank_entry("nccl", str(tmp_path))["why_unknown"] == "NCCL_DEBUG or NCCL_DEBUG_FILE set by the user"
