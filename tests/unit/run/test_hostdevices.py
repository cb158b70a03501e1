"""GPU or CPU on the local profile: visible GPUs, the decision, each simulated node's own GPUs.

Pure functions first (fake environments, a fake nvidia-smi runner), then the launcher for real
on this GPU-less machine. Real dry runs of the workflow: test_hostdevices_dryrun.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddpscale.run.hostdevices import (
    AcceleratorError, choose_accelerator, host_oversubscribed, oversubscription_warning,
    parse_cuda_visible_devices, run_nvidia_smi, usable_cores, visible_gpus,
)
from ddpscale.job.launch.spawner import LaunchError, parse_gpu_ids, rank_env
from ddpscale.plan.site.resources import launch_prefix, site_from_resources
from ddpscale.run.topology import parse_topology

from helpers.devices import SMI_ONE, fake_nvidia_smi
from helpers.workflow import ROOT

pytestmark = pytest.mark.timeout(180)

SMI_TWO_WITH_MIG = (
    "GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-aaaa)\n"
    "  MIG 3g.40gb     Device  0: (UUID: MIG-bbbb)\n"
    "GPU 1: NVIDIA A100-SXM4-80GB (UUID: GPU-cccc)\n"
)


def topologies(*names):
    return [parse_topology(n) for n in names]


def no_smi():
    raise AssertionError("nvidia-smi must not run when CUDA_VISIBLE_DEVICES is set")


# --- visible_gpus -----------------------------------------------------------------------

@pytest.mark.parametrize("value, ids", [
    ("0,1", ("0", "1")),
    ("3", ("3",)),
    (" 1, 3", ("1", "3")),
    ("", ()),
    ("-1", ()),
    ("NoDevFiles", ()),
    ("0,2,-1,1", ("0", "2")),  # CUDA stops at the first invalid entry
    ("1,x,2", ("1",)),
    ("0,0", ()),  # a repeated entry exposes nothing
    ("GPU-8932f937,GPU-1234abcd", ("GPU-8932f937", "GPU-1234abcd")),
    ("GPU-8932f937,0", ("GPU-8932f937",)),
    ("MIG-aaaa", ("MIG-aaaa",)),
])
def test_cuda_visible_devices_decides_when_set(value, ids):
    gpus = visible_gpus({"CUDA_VISIBLE_DEVICES": value}, run_smi=no_smi)
    assert gpus.ids == ids == parse_cuda_visible_devices(value)
    assert gpus.count == len(ids)
    assert "CUDA_VISIBLE_DEVICES" in gpus.source


@pytest.mark.parametrize("listing, count", [
    (SMI_ONE, 1),
    (SMI_TWO_WITH_MIG, 2),  # MIG lines are not GPUs of their own here
    ("No devices were found\n", 0),
    (None, 0),  # nvidia-smi missing or failed
])
def test_nvidia_smi_counts_gpu_lines_when_unset(listing, count):
    gpus = visible_gpus({}, run_smi=lambda: listing)
    assert gpus.count == count and gpus.ids == tuple(str(i) for i in range(count))


def test_run_nvidia_smi_missing_failing_and_present(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert run_nvidia_smi() is None
    monkeypatch.setenv("PATH", str(fake_nvidia_smi(tmp_path / "failing", SMI_ONE, code=1)))
    assert run_nvidia_smi() is None
    monkeypatch.setenv("PATH", str(fake_nvidia_smi(tmp_path / "one", SMI_ONE)))
    assert visible_gpus({}).count == 1


def test_usable_cores_is_the_affinity_mask():
    assert usable_cores() == len(os.sched_getaffinity(0)) >= 1


# --- choose_accelerator -------------------------------------------------------------------

def test_auto_uses_gpus_when_every_topology_fits():
    decision = choose_accelerator("auto", topologies("1x1", "1x2", "2x2"), gpus=4, cores=2)
    assert decision.accelerator == "gpu" and decision.note is None and decision.oversubscribed == []


@pytest.mark.parametrize("requested, gpus, cores, threads", [
    ("auto", 4, 16, 4), ("gpu", 1, 16, 16), ("gpu", 8, 4, 1), ("auto", 0, 16, 1), ("cpu", 4, 16, 1)])
def test_a_gpu_rank_gets_its_gpus_share_of_the_cores_and_a_simulated_device_one(requested, gpus, cores, threads):
    # gpu-check's first H100 run: 1 thread per GPU rank against a plain loop on all 16 cores
    assert choose_accelerator(requested, topologies("1x1"), gpus=gpus, cores=cores).threads == threads


def test_auto_falls_back_to_cpu_for_every_topology_when_one_does_not_fit():
    decision = choose_accelerator("auto", topologies("1x1", "1x2"), gpus=1, cores=2)
    assert decision.accelerator == "cpu" and decision.oversubscribed == []
    assert decision.note.startswith("accelerator auto: this machine has 1 GPU (")
    assert "too few for 1x2 (2 GPUs), so every topology runs CPU-simulated" in decision.note
    assert "never mixes GPU and CPU rows" in decision.note
    assert "Remove the topologies larger than 1 device or use a machine with more GPUs" in decision.note


def test_simulated_nodes_need_their_own_gpus():
    """2x1 on one host is two ranks on two GPUs, not one GPU per 'node' shared."""
    assert choose_accelerator("auto", topologies("1x1", "2x1"), gpus=1, cores=8).accelerator == "cpu"
    assert choose_accelerator("auto", topologies("1x1", "2x1"), gpus=2, cores=8).accelerator == "gpu"


def test_auto_without_gpu_says_so_plainly():
    decision = choose_accelerator("auto", topologies("1x1", "1x2"), gpus=0, cores=2)
    assert decision.accelerator == "cpu"
    assert decision.note == ("no GPU found (CUDA_VISIBLE_DEVICES / nvidia-smi -L): every device is "
                             "simulated by one CPU process")


def test_gpu_with_too_few_gpus_names_the_topology_the_count_and_the_fix():
    with pytest.raises(AcceleratorError) as err:
        choose_accelerator("gpu", topologies("1x1", "1x2", "2x2"), gpus=1, cores=2)
    message = str(err.value)
    assert message.startswith("config/config.yaml: accelerator is gpu but this machine has 1 GPU")
    assert "too few for 1x2 (2 GPUs), 2x2 (4 GPUs)" in message
    assert "Remove the topologies larger than 1 device" in message
    assert "set accelerator: auto or cpu" in message


def test_gpu_without_any_gpu_is_refused():
    with pytest.raises(AcceleratorError, match="no GPU was found .*too few for 1x1 \\(1 GPU\\)"):
        choose_accelerator("gpu", topologies("1x1"), gpus=0, cores=2)
    assert choose_accelerator("gpu", topologies("1x1", "1x2"), gpus=2, cores=1).accelerator == "gpu"


def test_cpu_is_always_cpu_and_flags_oversubscription():
    decision = choose_accelerator("cpu", topologies("1x1", "1x2", "2x1", "2x2", "1x4"), gpus=8, cores=2)
    assert decision.accelerator == "cpu" and decision.note is None
    assert decision.oversubscribed == ["2x2", "1x4"]
    # GPU ranks do not compete for cores that way
    assert choose_accelerator("auto", topologies("1x1", "2x2"), gpus=4, cores=1).oversubscribed == []


def test_unknown_accelerator_is_refused():
    with pytest.raises(AcceleratorError, match="use auto, gpu or cpu"):
        choose_accelerator("tpu", topologies("1x1"), gpus=0, cores=1)


def test_oversubscription_warning_names_topologies_cores_and_fix():
    line = oversubscription_warning(["2x2", "1x4"], 2)
    assert line.startswith("2x2, 1x4: more simulated devices than the 2 usable cores")
    assert "os.sched_getaffinity" in line and "oversubscribed: true" in line
    assert "Remove the topologies larger than 2 devices" in line


def test_host_oversubscribed_only_for_cpu_ranks_sharing_one_host():
    assert host_oversubscribed(True, ["a"], 4, 2)
    assert not host_oversubscribed(True, ["a"], 2, 2)
    assert not host_oversubscribed(False, ["a"], 4, 2)  # GPU run
    assert not host_oversubscribed(True, ["a", "b"], 4, 2)  # real nodes
    assert not host_oversubscribed(True, ["a"], 4, 1, one_launcher=False)  # srun binds each task


# --- the launcher: each simulated node its own GPUs ----------------------------------------

def test_rank_env_gives_each_simulated_node_its_own_gpus():
    base = {"CUDA_VISIBLE_DEVICES": "0,1,2,3", "HOME": "/h"}
    ids = ["0", "1", "2", "3"]
    envs = {(n, k): rank_env(base, 2, 2, n, k, 1234, ids) for n in range(2) for k in range(2)}
    assert {key: env["CUDA_VISIBLE_DEVICES"] for key, env in envs.items()} == {
        (0, 0): "0,1", (0, 1): "0,1", (1, 0): "2,3", (1, 1): "2,3"}
    assert envs[(1, 1)]["RANK"] == "3" and envs[(1, 1)]["LOCAL_RANK"] == "1"
    assert envs[(1, 0)]["NODE_RANK"] == "1" and envs[(1, 0)]["HOME"] == "/h"
    assert base == {"CUDA_VISIBLE_DEVICES": "0,1,2,3", "HOME": "/h"}  # pure
    # 2x1: each node's local rank 0 is cuda:0 of a different GPU
    assert [rank_env({}, 2, 1, n, 0, 1, ["GPU-a", "GPU-b"])["CUDA_VISIBLE_DEVICES"] for n in range(2)] == [
        "GPU-a", "GPU-b"]


def test_rank_env_without_ids_inherits_cuda_visible_devices():
    assert rank_env({"CUDA_VISIBLE_DEVICES": ""}, 2, 1, 1, 0, 1)["CUDA_VISIBLE_DEVICES"] == ""
    assert "CUDA_VISIBLE_DEVICES" not in rank_env({}, 2, 1, 1, 0, 1)


def test_rank_env_refuses_too_few_ids():
    with pytest.raises(LaunchError, match="need 4, one each"):
        rank_env({}, 2, 2, 1, 0, 1, ["0", "1", "2"])


def test_parse_gpu_ids():
    assert parse_gpu_ids("0, 1") == ["0", "1"]
    for bad in ("0,,1", "0,0", ""):
        with pytest.raises(LaunchError):
            parse_gpu_ids(bad)


def test_launch_prefix_with_gpu_ids():
    site = site_from_resources({"site_launcher": "local", "site_gpus_per_node": 8})
    ids = ["0", "1", "2", "3"]
    assert launch_prefix(parse_topology("2x2"), site, "py", ids) == (
        "py scripts/launch_local.py --nodes 2 --procs-per-node 2 --gpu-ids 0,1,2,3 -- py")
    assert launch_prefix(parse_topology("1x2"), site, "py", ids) == (
        "py scripts/launch_local.py --nodes 1 --procs-per-node 2 --gpu-ids 0,1 -- py")
    assert launch_prefix(parse_topology("1x1"), site, "py", ["GPU-x", "GPU-y"]) == (
        "py scripts/launch_local.py --nodes 1 --procs-per-node 1 --gpu-ids GPU-x -- py")
    assert launch_prefix(parse_topology("2x1"), site, "py") == (
        "env CUDA_VISIBLE_DEVICES= py scripts/launch_local.py --nodes 2 --procs-per-node 1 -- py")


def launch(args: list[str], command: list[str], env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "scripts/launch_local.py"), *args, "--", *command],
                          capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)


def dump_command(out: Path) -> list[str]:
    code = ("import json, os, sys; e = os.environ; "
            "json.dump({k: e.get(k) for k in ('CUDA_VISIBLE_DEVICES', 'LOCAL_RANK', 'NODE_RANK', 'RANK')}, "
            f"open(os.path.join({str(out)!r}, 'rank' + e['RANK'] + '.json'), 'w'))")
    return [sys.executable, "-c", code]


def rank_dumps(out: Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))}


@pytest.fixture
def launch_env():
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    return {**env, "PYTHONPATH": str(ROOT / "scripts")}


def test_launcher_gives_each_simulated_node_its_own_gpu(tmp_path, launch_env):
    result = launch(["--nodes", "2", "--procs-per-node", "1", "--gpu-ids", "0,1"], dump_command(tmp_path),
                    {**launch_env, "CUDA_VISIBLE_DEVICES": "0,1"})
    assert result.returncode == 0, result.stderr
    assert rank_dumps(tmp_path) == {
        "rank0": {"CUDA_VISIBLE_DEVICES": "0", "LOCAL_RANK": "0", "NODE_RANK": "0", "RANK": "0"},
        "rank1": {"CUDA_VISIBLE_DEVICES": "1", "LOCAL_RANK": "0", "NODE_RANK": "1", "RANK": "1"},
    }


def test_forked_ranks_get_their_node_gpus(tmp_path, launch_env):
    """The path train.py takes: the launcher imports torch once and forks each rank."""
    script = tmp_path / "dump.py"
    script.write_text(dump_command(tmp_path)[2].replace("; ", "\n"))
    result = launch(["--nodes", "2", "--procs-per-node", "2", "--gpu-ids", "4,5,6,7"],
                    [sys.executable, str(script)], launch_env)
    assert result.returncode == 0, result.stderr
    assert {rank: env["CUDA_VISIBLE_DEVICES"] for rank, env in rank_dumps(tmp_path).items()} == {
        "rank0": "4,5", "rank1": "4,5", "rank2": "6,7", "rank3": "6,7"}


def test_cpu_run_ranks_see_no_gpu_and_too_few_ids_are_refused(tmp_path, launch_env):
    # as the workflow starts a CPU-simulated run: CUDA_VISIBLE_DEVICES empty, no --gpu-ids
    result = launch(["--nodes", "2", "--procs-per-node", "1"], dump_command(tmp_path),
                    {**launch_env, "CUDA_VISIBLE_DEVICES": ""})
    assert result.returncode == 0, result.stderr
    assert [env["CUDA_VISIBLE_DEVICES"] for env in rank_dumps(tmp_path).values()] == ["", ""]

    refused = launch(["--nodes", "2", "--procs-per-node", "1", "--gpu-ids", "0"], dump_command(tmp_path / "x"),
                     launch_env)
    assert refused.returncode == 2
    assert "--gpu-ids gives 1 GPU(s) but 2 node(s) x 1 rank(s) need 2, one each" in refused.stderr
