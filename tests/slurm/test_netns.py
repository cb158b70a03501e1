"""tests/slurm/netns.sh: a shaped network between the fake nodes of the test cluster.

An all-reduce between two node namespaces must run at the link's rate (not at memory speed,
as on the cluster's shared 127.0.0.1), the root namespace (slurmctld's) and the nodes must
reach each other over TCP, and up/down must be idempotent and leave nothing behind.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import pytest

from helpers.workflow import ROOT

NETNS = ROOT / "tests/slurm/netns.sh"
RATE_GBIT = 1.0             # 2 cores push ~5 Gbit/s in all: stay well below for both links
SIZES = [4 << 20, 8 << 20, 16 << 20, 32 << 20]   # small messages pay latency, not bandwidth
PY = sys.executable
BASH = shutil.which("bash")

pytestmark = pytest.mark.network

# One rank of the probe's own all-reduce benchmark; rank 0 prints its rows as JSON.
RANK = """
import json, os, sys
import torch, torch.distributed as dist
from ddpscale.job.probe.allreduce import allreduce_benchmark
dist.init_process_group("gloo")
try:
    rows = allreduce_benchmark([int(s) for s in sys.argv[1:]], torch.device("cpu"), warmup=2, iters=5)
finally:
    dist.destroy_process_group()  # else gloo may abort at exit (pytorch#190489)
if os.environ["RANK"] == "0":
    print(json.dumps(rows))
"""
# Accept one connection, answer with the address it came from.
LISTEN = """
import socket, sys
s = socket.socket(); s.bind((sys.argv[1], 0)); s.listen(1)
print(s.getsockname()[1], flush=True)
c, peer = s.accept(); c.sendall(peer[0].encode()); c.close()
"""
CONNECT = """
import socket, sys
print(socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10).recv(100).decode())
"""


def netns(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([BASH, str(NETNS), *args], capture_output=True, text=True, timeout=60, **kwargs)


def in_node(node: str, *cmd: str) -> list[str]:
    return [BASH, str(NETNS), "exec", node, "--", *cmd]


def ours() -> list[str]:
    """Our namespaces (listed, or left as files in /run/netns) and our root-namespace link."""
    names = set(subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split())
    if os.path.isdir("/run/netns"):
        names |= set(os.listdir("/run/netns"))
    if " ddpscale0@" in subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout:
        names.add("ddpscale0")
    return sorted(n for n in names if n.startswith("ddpscale"))


def fail_or_skip(reason: str):
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI must run the network tests, but: {reason}")
    pytest.skip(reason)


@pytest.fixture
def network():
    """Two node namespaces at RATE_GBIT, taken down afterwards; skipped where they cannot be
    made (not root, no namespaces or tbf), except under CI=true."""
    if os.geteuid() != 0:
        fail_or_skip("network namespaces need root (tests/slurm/netns.sh creates them)")
    lock = open("/tmp/ddpscale-netns-tests.lock", "w")
    fcntl.flock(lock, fcntl.LOCK_EX)        # one pytest session's namespaces at a time
    try:
        if ours():
            # the test cluster's network (its slurmd inside): the SLURM tests bring it up again
            subprocess.run([BASH, str(ROOT / "tests/slurm/minicluster.sh"), "down"], capture_output=True, timeout=120)
        if ours():
            fail_or_skip(f"{', '.join(ours())} already exist and are not the test cluster's; the test would "
                         "take them down: run 'tests/slurm/netns.sh down' first")
        if subprocess.run(["unshare", "--net", "true"], capture_output=True).returncode != 0:
            fail_or_skip("this machine cannot create network namespaces (a container without CAP_SYS_ADMIN?)")
        up = netns("up", "--nodes", "2", "--rate", f"{RATE_GBIT}gbit")
        if up.returncode != 0:
            netns("down")
            # A machine that lacks a tool or tbf is skipped; anything else is netns.sh's fault.
            if any(m in up.stderr for m in ("not found; install", "has no tbf qdisc", "cannot create a network")):
                fail_or_skip(up.stderr.strip())
            pytest.fail(f"netns.sh up failed: {(up.stdout + up.stderr)[-1500:]}")
        yield
    finally:
        netns("down")
        lock.close()


def run_ranks(prefixes: list[list[str]], env: dict) -> list[dict]:
    """Start rank r as prefixes[r] + python RANK; rank 0's benchmark rows."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "scripts"), "MASTER_PORT": "29500",
           "WORLD_SIZE": str(len(prefixes)), **env}
    procs = [subprocess.Popen([*prefix, PY, "-c", RANK, *map(str, SIZES)], env={**env, "RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r, prefix in enumerate(prefixes)]
    try:
        outs = [p.communicate(timeout=180) for p in procs]
    finally:
        for p in procs:
            p.kill()
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, f"a rank failed ({p.args[:6]}):\n{err[-2000:]}"
    return json.loads(outs[0][0].strip().splitlines()[-1])


def gbit(rows: list[dict]) -> dict[int, float]:
    """busbw per message size in Gbit/s (commbench reports GB/s)."""
    return {r["bytes"] >> 20: round(r["busbw_gbps"] * 8, 3) for r in rows}


def test_allreduce_between_node_namespaces_runs_at_the_link_rate(network):
    between = gbit(run_ranks([in_node("n1"), in_node("n2")],
                             {"MASTER_ADDR": "10.77.0.1", "GLOO_SOCKET_IFNAME": "ib0"}))
    # The control: the same two ranks on n1's own loopback, which no tbf shapes.
    loopback = gbit(run_ranks([in_node("n1"), in_node("n1")],
                              {"MASTER_ADDR": "127.0.0.1", "GLOO_SOCKET_IFNAME": "lo"}))
    print(f"\nbusbw Gbit/s by MB, {RATE_GBIT} Gbit/s links: {between}; unshaped loopback: {loopback}")
    # The link caps busbw from above (never over the rate, so the shaping holds); from below, gloo
    # sums the buffers on the cores the tests share, so a busy host pulls sizes down (CI measured
    # 0.50, 0.83, 0.85 and 0.90 of the rate): each size at least half the rate, and the size the
    # load disturbed least within 15% of it (TCP/IP/Ethernet headers alone take ~4.4% at MTU 1500).
    over = {mb: bw for mb, bw in between.items() if bw > 1.05 * RATE_GBIT}
    assert not over, f"busbw above the {RATE_GBIT} Gbit/s link rate at {over} MB: not shaped (all: {between})"
    low = {mb: bw for mb, bw in between.items() if bw < 0.5 * RATE_GBIT}
    assert not low, f"busbw under half the {RATE_GBIT} Gbit/s link rate at {low} MB (all: {between})"
    best = max(between.values())
    assert best >= 0.85 * RATE_GBIT, f"no size's busbw came within 15% of the link rate: {between}"
    median = sorted(loopback.values())[len(loopback) // 2]
    assert median > 3 * RATE_GBIT, f"loopback {loopback} is not far above the shaped rate: shaping not shown"


def listener(prefix: list[str], address: str) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen([*prefix, PY, "-c", LISTEN, address], stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()           # its port, once it listens
    assert line.strip().isdigit(), f"listener on {address} did not start: {line!r}"
    return proc, int(line)


def test_root_namespace_and_nodes_reach_each_other_over_tcp(network):
    for i in (1, 2):
        # slurmctld -> slurmd: from the root namespace to the node's NodeAddr
        proc, port = listener(in_node(f"n{i}"), f"10.77.0.{i}")
        with socket.create_connection((f"10.77.0.{i}", port), timeout=10) as c:
            assert c.recv(100).decode() == "10.77.0.254"
        assert proc.wait(30) == 0
        # slurmd -> slurmctld: from the node to the root namespace's address on the bridge
        proc, port = listener([], "10.77.0.254")
        seen = subprocess.run(in_node(f"n{i}", PY, "-c", CONNECT, "10.77.0.254", str(port)),
                              capture_output=True, text=True, timeout=30)
        assert seen.stdout.strip() == f"10.77.0.{i}", seen.stderr
        assert proc.wait(30) == 0
    # A node's 127.0.0.1 is its own: a controller on the root's loopback is out of reach.
    proc, port = listener([], "127.0.0.1")
    try:
        refused = subprocess.run(in_node("n1", PY, "-c", CONNECT, "127.0.0.1", str(port)),
                                 capture_output=True, text=True, timeout=30)
        assert refused.returncode != 0 and "ConnectionRefusedError" in refused.stderr
    finally:
        proc.kill()


def state() -> dict:
    """What 'up' could change: namespace identities, links, addresses, qdiscs. Not what the
    kernel changes by itself meanwhile: operstate, IPv6 link-local addresses leaving DAD."""
    result = {name: os.stat(f"/run/netns/{name}").st_ino for name in ours() if name != "ddpscale0"}
    for ns, dev in (("n1", "ib0"), ("n2", "ib0"), ("br", "n1"), ("br", "n2")):
        for what in (["ip", "-o", "-4", "addr", "show", "dev", dev], ["ip", "-o", "link", "show", "dev", dev],
                     ["tc", "qdisc", "show", "dev", dev]):
            out = subprocess.run(in_node(ns, *what), capture_output=True, text=True, check=True).stdout
            result[f"{ns} {' '.join(what)}"] = re.sub(r" state \S+", "", out)
    return result


def test_up_twice_is_a_no_op_and_another_rate_reshapes_in_place(network):
    before = state()
    again = netns("up", "--nodes", "2", "--rate", f"{RATE_GBIT}gbit")
    assert again.returncode == 0 and "already up" in again.stdout, again.stdout + again.stderr
    assert state() == before
    assert "already up with 2 nodes" in netns("up", "--nodes", "3").stderr  # another shape: refused
    reshaped = netns("up", "--nodes", "2", "--rate", "500mbit")
    assert reshaped.returncode == 0, reshaped.stderr
    status = netns("status")
    assert status.returncode == 0 and status.stdout.count(" 500000000 ") == 4, status.stdout + status.stderr
    assert {k: v for k, v in state().items() if " tc " not in k} == {k: v for k, v in before.items() if " tc " not in k}


def test_down_refuses_while_a_process_is_inside_then_leaves_nothing(network):
    assert ours() == ["ddpscale-br", "ddpscale-n1", "ddpscale-n2", "ddpscale0"]
    inside = subprocess.Popen(in_node("n2", "cat"), stdin=subprocess.PIPE)
    try:
        while "(cat)" not in netns("status").stdout:   # nsenter has entered and exec'd cat
            assert inside.poll() is None, "cat in n2 exited"
        # exec leaves the command itself at the pid it started (a pid file names the daemon),
        # in its own network namespace but in ours for mounts, so slurmd keeps the cgroup mounts.
        ns = {kind: os.readlink(f"/proc/{inside.pid}/ns/{kind}") for kind in ("net", "mnt", "cgroup")}
        assert open(f"/proc/{inside.pid}/comm").read() == "cat\n"
        assert ns["net"] != os.readlink("/proc/self/ns/net")
        assert ns["mnt"] == os.readlink("/proc/self/ns/mnt") and ns["cgroup"] == os.readlink("/proc/self/ns/cgroup")
        refused = netns("down")
        assert refused.returncode == 1 and "processes still run in ddpscale-n2" in refused.stderr
        assert ours() == ["ddpscale-br", "ddpscale-n1", "ddpscale-n2", "ddpscale0"]
    finally:
        inside.stdin.close()
        inside.wait(30)
    down = netns("down")
    assert down.returncode == 0, down.stderr
    assert ours() == []
    assert "10.77.0." not in subprocess.run(["ip", "-o", "route"], capture_output=True, text=True).stdout
    assert netns("status").returncode == 1


def test_refusals_name_the_fix(tmp_path):
    root = os.geteuid() == 0
    as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] if root else []
    nobody = subprocess.run([*as_nobody, BASH, str(NETNS), "up"], capture_output=True, text=True, timeout=30)
    assert nobody.returncode == 1 and nobody.stderr == \
        "netns: must run as root (it creates network namespaces); rerun with sudo\n"
    if not root:
        fail_or_skip("the refusals past the root check need root to be reached")
    before = ours()
    for tool in ("ip", "nsenter", "unshare"):     # every tool but tc
        (tmp_path / tool).symlink_to(shutil.which(tool))
    no_tc = netns("up", env={**os.environ, "PATH": str(tmp_path)})
    assert no_tc.returncode == 1 and no_tc.stderr == \
        "netns: tc not found; install them: apt-get install iproute2 util-linux\n"
    assert "--rate must be a rate as tc writes it" in netns("up", "--rate", "fast").stderr
    assert "no namespace ddpscale-n9; run 'netns.sh up' first" in netns("exec", "n9", "--", "true").stderr
    assert ours() == before  # the refusals created nothing
