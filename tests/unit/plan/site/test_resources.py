"""Site facts of every profile + topology -> SLURM plugin resources and launch command."""
import dataclasses
import re

import pytest

from ddpscale.plan.site.resources import (
    Site, SiteError, check_stage_entry, cluster_env, launch_prefix, shared_resources, site_from_resources, slurm_resources,
)
from ddpscale.run.topology import parse_topology

from helpers.profiles import load_profile, profile_site
from helpers.workflow import ROOT

PROFILES = sorted(p.parent.name for p in ROOT.glob("profiles/*/config.yaml"))
TOPOLOGIES = ["1x1", "1x4", "2x4", "4x1"]


def test_every_profile_is_covered():
    assert PROFILES == ["gilbreth", "gilbreth-training", "local", "raven", "slurm"]


# topology: (nodes, tasks, gres, cpus_per_task, mem_mb, mpi), as in the shipped profiles
EXPECTED = {
    "gilbreth": {
        "1x1": (1, 1, "gpu:1", 16, 120000, ""),
        "1x4": (1, 4, "gpu:4", 16, 480000, "srun"),
        "2x4": (2, 8, "gpu:4", 16, 480000, "srun"),
        "4x1": (4, 4, "gpu:1", 16, 120000, "srun"),
    },
    # the same per-GPU facts on 4-GPU nodes (partition training)
    "gilbreth-training": {
        "1x1": (1, 1, "gpu:1", 16, 120000, ""),
        "1x4": (1, 4, "gpu:4", 16, 480000, "srun"),
        "2x4": (2, 8, "gpu:4", 16, 480000, "srun"),
        "4x1": (4, 4, "gpu:1", 16, 120000, "srun"),
    },
    "raven": {
        "1x1": (1, 1, "gpu:a100:1", 18, 125000, ""),
        "1x4": (1, 4, "gpu:a100:4", 18, 500000, "srun"),
        "2x4": (2, 8, "gpu:a100:4", 18, 500000, "srun"),
        "4x1": (4, 4, "gpu:a100:1", 18, 125000, "srun"),
    },
    "slurm": {
        "1x1": (1, 1, "gpu:1", 8, 32000, ""),
        "1x4": (1, 4, "gpu:4", 8, 128000, "srun"),
        "2x4": (2, 8, "gpu:4", 8, 128000, "srun"),
        "4x1": (4, 4, "gpu:1", 8, 32000, "srun"),
    },
    "local": {
        "1x1": (1, 1, "gpu:1", 1, 2000, ""),
        "1x4": (1, 4, "gpu:4", 1, 8000, ""),
        "2x4": (2, 8, "gpu:4", 1, 8000, ""),
        "4x1": (4, 4, "gpu:1", 1, 2000, ""),
    },
}


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_exact_resources(profile, topology):
    nodes, tasks, gres, cpus, mem_mb, mpi = EXPECTED[profile][topology]
    # the cluster profiles pin tasks per node and ask for USR1 120 s before the limit
    extra = "" if profile == "local" else f"--ntasks-per-node={tasks // nodes} --signal=USR1@120"
    assert slurm_resources(parse_topology(topology), profile_site(profile)) == {
        "nodes": nodes, "tasks": tasks, "tasks_per_gpu": 0, "gres": gres,
        "cpus_per_task": cpus, "mem_mb": mem_mb, "mpi": mpi, "slurm_extra": extra,
    }


@pytest.mark.parametrize("profile", PROFILES)
def test_profile_site_matches_its_executor(profile):
    """A SLURM profile must not launch like the local one, and vice versa."""
    site = profile_site(profile)
    assert site.is_local == (load_profile(profile).get("executor") is None)
    if not site.is_local:
        assert site.launcher == "srun"
        assert isinstance(site.gpus_per_node, int)  # the per-node limit is checked before submission


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_plugin_constraints(profile, topology):
    site, topo = profile_site(profile), parse_topology(topology)
    res = slurm_resources(topo, site)
    assert res["nodes"] == topo.num_nodes
    assert res["tasks"] == topo.world_size
    assert res["tasks_per_gpu"] == 0
    assert re.fullmatch(rf"gpu:(\w+:)?{topo.devices_per_node}", res["gres"])
    assert res["cpus_per_task"] == site.cpus_per_gpu
    assert res["mem_mb"] == site.mem_mb_per_gpu * topo.devices_per_node
    if res["tasks"] == 1:
        assert not res["mpi"]
    # the key, even empty, makes the jobstep plugin run the shell in the batch step
    assert "mpi" in res
    if not site.is_local:
        # every rank an srun task, the baseline's too: only job steps get --signal's warning
        prefix = launch_prefix(topo, site, "python")
        assert f"srun --nodes={topo.num_nodes} " in prefix
        assert f" --ntasks-per-node={topo.devices_per_node} " in prefix
        assert f" --cpus-per-task={site.cpus_per_gpu} " in prefix
    else:
        assert "srun" not in launch_prefix(topo, site, "python")
    if not site.is_local and topo.world_size > 1:
        assert res["mpi"]
        assert cluster_env(topo, site) == "slurm"
    else:
        assert cluster_env(topo, site) == "local"


PORT = 'MASTER_PORT="$(/v/bin/python scripts/master_port.py)"'


def test_launch_prefix_srun():
    """The batch step picks rank 0's port and drops an inherited MASTER_ADDR (sbatch --export=ALL)."""
    site = profile_site("raven")
    assert launch_prefix(parse_topology("2x4"), site, "/v/bin/python") == (
        f"env -u MASTER_ADDR {PORT} srun --nodes=2 --ntasks-per-node=4 --cpus-per-task=18 "
        "--kill-on-bad-exit=1 /v/bin/python"
    )
    # one rank: an srun task alone (the batch step gets no --signal), no port to pick
    assert launch_prefix(parse_topology("1x1"), site, "/v/bin/python") == (
        "srun --nodes=1 --ntasks-per-node=1 --cpus-per-task=18 --kill-on-bad-exit=1 /v/bin/python")


def test_launch_prefix_exports_site_env():
    site = dataclasses.replace(profile_site("gilbreth"), env="NCCL_SOCKET_IFNAME=ib0 NCCL_IB_HCA=mlx5_0")
    env = "env NCCL_SOCKET_IFNAME=ib0 NCCL_IB_HCA=mlx5_0"
    assert launch_prefix(parse_topology("4x1"), site, "py") == (
        f"env -u MASTER_ADDR {env[4:]} MASTER_PORT=\"$(py scripts/master_port.py)\" srun --nodes=4 "
        "--ntasks-per-node=1 --cpus-per-task=16 --kill-on-bad-exit=1 py"
    )
    assert launch_prefix(parse_topology("1x1"), site, "py") == (
        f"{env} srun --nodes=1 --ntasks-per-node=1 --cpus-per-task=16 --kill-on-bad-exit=1 py")


def test_launch_prefix_local_quotes_python():
    """Without GPU ids a local run is CPU-simulated: its ranks see no GPU."""
    site = profile_site("local")
    python = "/my venv/bin/python"
    assert launch_prefix(parse_topology("2x4"), site, python) == (
        "env CUDA_VISIBLE_DEVICES= '/my venv/bin/python' scripts/launch_local.py --nodes 2 "
        "--procs-per-node 4 -- '/my venv/bin/python'"
    )
    assert launch_prefix(parse_topology("1x1"), site, python) == (
        "env CUDA_VISIBLE_DEVICES= '/my venv/bin/python' scripts/launch_local.py --nodes 1 "
        "--procs-per-node 1 -- '/my venv/bin/python'"
    )


def test_launch_prefix_local_gpus():
    site = profile_site("local")
    ids = ["0", "1", "2", "3"]
    assert launch_prefix(parse_topology("2x1"), site, "py", ids) == (
        "py scripts/launch_local.py --nodes 2 --procs-per-node 1 --gpu-ids 0,1 -- py")
    assert launch_prefix(parse_topology("1x1"), site, "py", ids) == (
        "py scripts/launch_local.py --nodes 1 --procs-per-node 1 --gpu-ids 0 -- py")
    with pytest.raises(ValueError, match="2x4 needs 8 GPUs"):
        launch_prefix(parse_topology("2x4"), site, "py", ids)
    with pytest.raises(ValueError, match="allocation"):
        launch_prefix(parse_topology("2x4"), profile_site("raven"), "py", ids)


def test_site_from_resources_ignores_other_resources_and_keeps_defaults():
    assert site_from_resources({"runtime": 120, "mem_mb": 5}) == Site()
    assert Site().is_local and Site().gpus_per_node is None


def test_unknown_site_key_is_rejected():
    with pytest.raises(SiteError) as err:
        site_from_resources({"site_launcher": "srun", "site_gpu_count": 4})
    assert "unknown site fact 'site_gpu_count'" in str(err.value)
    assert "site_gpus_per_node" in str(err.value)  # lists the known facts


@pytest.mark.parametrize("key, value", [
    ("site_cpus_per_gpu", 0), ("site_cpus_per_gpu", "8"), ("site_mem_mb_per_gpu", -1),
    ("site_mem_mb_per_gpu", 1.5), ("site_gpus_per_node", 0), ("site_gpus_per_node", "4"),
])
def test_bad_site_value_is_rejected_naming_the_key(key, value):
    with pytest.raises(SiteError) as err:
        site_from_resources({key: value}, where="profiles/x")
    assert str(err.value).startswith(f"profiles/x: {key} must be an integer >= 1 (got {value!r})")


@pytest.mark.parametrize("key", ["site_cpus_per_gpu", "site_mem_mb_per_gpu", "site_gpus_per_node"])
def test_boolean_site_value_is_rejected(key):
    with pytest.raises(SiteError, match=key):
        site_from_resources({"site_launcher": "srun", key: True})


@pytest.mark.parametrize("launcher", ["", None, "mpirun", "srun; touch x;", "srun\n", "$(srun)"])
def test_a_launcher_ddpscale_does_not_know_is_rejected(launcher):
    with pytest.raises(SiteError, match="site_launcher must be one of local, srun"):
        site_from_resources({"site_launcher": launcher, "site_gpus_per_node": 4})


# A value the SLURM plugin hands to the shell that runs sbatch: each of these ran `touch x` on the
# login node, or split the sbatch line, before site_slurm_extra had a grammar.
@pytest.mark.parametrize("extra", ["--gpu-bind=none; touch x #", "--gpu-bind=none\ntouch x", "--comment=$(touch x)",
                                   "--comment=`touch x`", "--hint=nomultithread | touch x", "--x && touch x",
                                   "--comment='a b'", "--begin=now > x", "gpu-bind=none"])
def test_a_site_slurm_extra_a_shell_would_read_is_refused(extra):
    with pytest.raises(SiteError, match=r"^profiles/x: site_slurm_extra ['\"]"):
        site_from_resources({"site_launcher": "srun", "site_slurm_extra": extra}, where="profiles/x")


@pytest.mark.parametrize("extra, expected", [
    ("--gpus-bind=none", "'--gpus-bind=none' is not an sbatch option; did you mean '--gpu-bind'?"),
    ("--hint=nomultithread --exclusiv", "'--exclusiv' is not an sbatch option; did you mean '--exclusive'?"),
    ("-Z", "'-Z' is not an sbatch option; `man sbatch`"),
])
def test_a_site_slurm_extra_option_sbatch_does_not_know_is_refused(extra, expected):
    with pytest.raises(SiteError) as refused:
        site_from_resources({"site_launcher": "srun", "site_slurm_extra": extra}, where="profiles/x")
    assert str(refused.value).startswith("profiles/x: site_slurm_extra") and expected in str(refused.value)


@pytest.mark.parametrize("extra", ["--gpu-bind=none", "--gpu-bind none --hint=nomultithread", "-C gpu --requeue",
                                   "--tres-per-task=gres/gpu:1 --segment=2", ""])
def test_a_site_slurm_extra_of_sbatch_options_is_accepted(extra):
    assert site_from_resources({"site_launcher": "srun", "site_slurm_extra": extra}).slurm_extra == extra


@pytest.mark.parametrize("env", ["A=1; touch x", "A=1\nB=2", "1A=2", "A=1 'open", "touch x", "A-B=1"])
def test_a_site_env_that_is_not_name_value_pairs_is_refused(env):
    with pytest.raises(SiteError, match=r"^profiles/x: site_env ['\"]"):
        site_from_resources({"site_launcher": "srun", "site_env": env}, where="profiles/x")


def test_site_env_values_reach_the_ranks_as_text_not_as_shell(tmp_path):
    """A value may hold anything printable: env gets it quoted, so no shell runs it."""
    import subprocess

    site = site_from_resources({"site_launcher": "srun", "site_gpus_per_node": 4,
                                "site_env": "A=$(touch${IFS}x) B='`touch x` y' C=ib0"})
    prefix = launch_prefix(parse_topology("1x1"), site, "python")
    env = prefix[:prefix.index(" srun ")]
    done = subprocess.run(["bash", "-c", f"{env} printenv A B C"], cwd=tmp_path, capture_output=True, text=True)
    assert done.stdout.splitlines() == ["$(touch${IFS}x)", "`touch x` y", "ib0"], done.stderr
    assert list(tmp_path.iterdir()) == [], "the shell ran a value"


# --- slurm_extra: tasks per node, warning signal, exclusive nodes ---

def test_allocation_pins_tasks_per_node():
    """--nodes=2 --ntasks=8 alone lets SLURM place 7 + 1 ranks; the step needs 4 + 4."""
    site = profile_site("gilbreth")
    for name in TOPOLOGIES:
        topo = parse_topology(name)
        extra = slurm_resources(topo, site)["slurm_extra"].split()
        assert f"--ntasks-per-node={topo.devices_per_node}" in extra
        assert extra.count("--signal=USR1@120") == 1


@pytest.mark.parametrize("facts, expected", [
    ({"site_signal_s": 0}, "--ntasks-per-node=4"),
    ({"site_signal_s": 300}, "--ntasks-per-node=4 --signal=USR1@300"),
    ({"site_exclusive": True}, "--ntasks-per-node=4 --signal=USR1@120 --exclusive"),
    ({"site_slurm_extra": " --gpu-bind=none "}, "--ntasks-per-node=4 --signal=USR1@120 --gpu-bind=none"),
])
def test_slurm_extra_from_site_facts(facts, expected):
    site = site_from_resources({"site_launcher": "srun", "site_gpus_per_node": 4, **facts})
    assert slurm_resources(parse_topology("2x4"), site)["slurm_extra"] == expected


def test_exclusive_is_off_in_every_shipped_profile():
    """Exclusive nodes cost queue time: a site opts in (site_exclusive), none does by default."""
    for profile in PROFILES:
        assert "--exclusive" not in slurm_resources(parse_topology("1x1"), profile_site(profile))["slurm_extra"]


def test_a_site_of_whole_nodes_holds_every_gpu_of_each_node():
    whole = site_from_resources({"site_launcher": "srun", "site_gpus_per_node": 4, "site_exclusive": True})
    assert whole.whole_nodes and whole.held_devices(2, 4) == 8 and whole.held_devices(1, 1) == 4
    shared = site_from_resources({"site_launcher": "srun", "site_gpus_per_node": 4})
    assert not shared.whole_nodes and shared.held_devices(2, 4) == 4
    local = site_from_resources({"site_launcher": "local", "site_exclusive": True})
    assert not local.whole_nodes and local.held_devices(1, 2) == 2


def test_local_site_has_no_slurm_extra():
    site = site_from_resources({"site_launcher": "local", "site_exclusive": True})
    assert slurm_resources(parse_topology("2x4"), site)["slurm_extra"] == ""


def submitted(topology: str, site) -> str:
    """The sbatch command plugin 2.8.0 builds for a training job with our resources."""
    from types import SimpleNamespace

    from snakemake_executor_plugin_slurm.submit_string import get_submit_command
    from snakemake_executor_plugin_slurm.validation import validate_slurm_extra

    class Resources(dict):
        __getattr__ = dict.__getitem__

    resources = Resources(slurm_resources(parse_topology(topology), site), runtime=60)
    job = SimpleNamespace(resources=resources, threads=1)
    validate_slurm_extra(job)  # the plugin refuses flags it sets itself
    params = {"run_uuid": "u", "slurm_logfile": "log", "comment_str": "c", "account": "", "partition": "",
              "workdir": ""}
    return get_submit_command(job, params)


def test_plugin_submits_the_pinned_allocation():
    sbatch = submitted("2x4", site_from_resources({"site_launcher": "srun", "site_gpus_per_node": 4,
                                                    "site_exclusive": True}))
    for flag in ("--nodes=2", "--ntasks=8", "--ntasks-per-node=4", "--signal=USR1@120", "--exclusive"):
        assert f" {flag}" in sbatch, sbatch
    assert "--ntasks-per-gpu" not in sbatch


def test_profile_slurm_extra_is_refused_with_the_fix():
    with pytest.raises(SiteError) as err:
        site_from_resources({"site_launcher": "srun", "slurm_extra": "--qos=high"}, where="profiles/x")
    assert str(err.value).startswith("profiles/x: slurm_extra would replace the flags ddpscale sets")
    assert "site_slurm_extra" in str(err.value)


@pytest.mark.parametrize("key, value", [
    ("site_signal_s", -1), ("site_signal_s", "120"), ("site_signal_s", True),
    ("site_exclusive", "yes"), ("site_exclusive", 1), ("site_slurm_extra", 5),
])
def test_bad_signal_exclusive_or_extra_is_rejected_naming_the_key(key, value):
    with pytest.raises(SiteError, match=f"profiles/x: {key} must be"):
        site_from_resources({"site_launcher": "srun", key: value}, where="profiles/x")


def test_exclusive_as_snakemake_passes_it_on():
    """Snakemake hands a profile's `site_exclusive: false` over as the text "False"."""
    assert site_from_resources({"site_launcher": "srun", "site_exclusive": "False"}).exclusive is False
    assert site_from_resources({"site_launcher": "srun", "site_exclusive": "True"}).exclusive is True


def test_train_entry_splits_into_site_facts_and_resources_for_every_stage():
    entry = load_profile("gilbreth")["set-resources"]["train"]
    assert shared_resources(entry) == {"runtime": 120}
    assert site_from_resources(entry).gpus_per_node == 2  # partition a100-80gb
    # Raven's node feature is a plugin resource every training stage gets, not a site fact
    entry = load_profile("raven")["set-resources"]["train"]
    assert shared_resources(entry) == {"runtime": 120, "constraint": "gpu"}
    assert site_from_resources(entry).multi_node_whole_nodes is True


@pytest.mark.parametrize("entry, words", [
    ({"site_gpus_per_node": 8}, "site_gpus_per_node is a site fact"),
    ({"slurm_extra": "--qos=high"}, "slurm_extra would replace the flags ddpscale sets"),
])
def test_a_stage_entry_refuses_site_facts_and_slurm_extra(entry, words):
    with pytest.raises(SiteError, match=words):
        check_stage_entry("train_multi_node", entry)
    check_stage_entry("train_multi_node", {"runtime": 30, "slurm_partition": "big", "qos": "long"})
