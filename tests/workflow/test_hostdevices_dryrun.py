"""Real dry runs of the workflow on the local profile with a fake nvidia-smi on PATH: which
topologies get GPUs, each simulated node its own (the decision itself: test_hostdevices.py)."""

from __future__ import annotations

import os

import pytest

from helpers.devices import SMI_ONE, dry_run, train_commands
from helpers.workflow import tiny_config

pytestmark = pytest.mark.timeout(180)


def test_dry_run_one_gpu_too_few_for_1x2_runs_everything_on_cpu(workspace):
    rc, output = dry_run(workspace, tiny_config(topologies=["1x1", "1x2"]), smi=SMI_ONE)
    assert rc == 0, output
    note = ("ddpscale: accelerator auto: this machine has 1 GPU (nvidia-smi -L), too few for 1x2 "
            "(2 GPUs), so every topology runs CPU-simulated; a report never mixes GPU and CPU rows. "
            "Remove the topologies larger than 1 device or use a machine with more GPUs")
    assert output.count(note) == 1, output
    commands = train_commands(output)
    assert sorted(commands) == ["1x1", "1x2"]
    for command in commands.values():
        assert "--accelerator=cpu " in command and "--gpu-ids" not in command
        assert command.startswith("env CUDA_VISIBLE_DEVICES= ")


def test_dry_run_four_gpus_gives_each_topology_its_gpus(workspace):
    rc, output = dry_run(workspace, tiny_config(topologies=["1x1", "1x2", "2x1", "2x2"]),
                         cuda_visible_devices="0,1,2,3", smi=SMI_ONE)
    assert rc == 0, output
    # nothing to explain about the devices (what each run measures and costs is said on every dry run)
    said = [line for line in output.splitlines() if "ddpscale:" in line
            and not line.startswith(("ddpscale: measure ", "ddpscale: cost: ", "ddpscale: this benchmark"))]
    assert said == ["ddpscale: experiment spiralmlp: results in results/spiralmlp/"], said
    commands = train_commands(output)
    assert all("--accelerator=gpu " in c for c in commands.values()), commands
    cores = len(os.sched_getaffinity(0))  # each GPU rank: its GPU's share of this host's cores
    assert all(f" --threads={max(1, cores // 4)} " in c for c in commands.values()), commands
    assert "--nodes 1 --procs-per-node 1 --gpu-ids 0 -- " in commands["1x1"]
    assert "--nodes 1 --procs-per-node 2 --gpu-ids 0,1 -- " in commands["1x2"]
    assert "--nodes 2 --procs-per-node 1 --gpu-ids 0,1 -- " in commands["2x1"]
    assert "--nodes 2 --procs-per-node 2 --gpu-ids 0,1,2,3 -- " in commands["2x2"]
    # the probe runs inside the training job, on the same GPUs
    assert commands["2x2"].count(" --probe ") == 1


def test_dry_run_accelerator_gpu_with_too_few_gpus_stops_before_any_job(workspace):
    rc, output = dry_run(workspace, tiny_config(topologies=["1x1", "1x2"], accelerator="gpu"), smi=SMI_ONE)
    assert rc != 0
    assert ("config/config.yaml: accelerator is gpu but this machine has 1 GPU (nvidia-smi -L), too few "
            "for 1x2 (2 GPUs)") in output
    assert "Remove the topologies larger than 1 device, set accelerator: auto or cpu" in output
    assert "Traceback" not in output and "rule train_" not in output
    assert not (workspace.path / "results").exists()


def test_dry_run_warns_about_topologies_beyond_the_cores(workspace):
    cores = len(os.sched_getaffinity(0))
    big = f"{cores + 1}x1"
    config = tiny_config(topologies=["1x1", big], batch={"scaling": "weak", "size": 16})
    rc, output = dry_run(workspace, config, cuda_visible_devices="")
    assert rc == 0, output
    assert output.count('ddpscale: no GPU found (CUDA_VISIBLE_DEVICES=""): every device is simulated '
                        "by one CPU process") == 1
    warning = [line for line in output.splitlines() if line.startswith("ddpscale: warning: ")]
    assert len(warning) == 1, output
    assert warning[0].startswith(f"ddpscale: warning: {big}: more simulated devices than the {cores} usable core")
    assert f"Remove the topologies larger than {cores} device" in warning[0]
    assert "--accelerator=cpu " in train_commands(output)[big]
