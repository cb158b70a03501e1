"""The shipped cluster profiles, with only the account set as a user sets it, submitted to the
test cluster's Gilbreth- and Raven-like partitions (tests/slurm/siteconf.sh, job_submit.lua):
every training job must be accepted and start, with the sbatch options the site expects, and a
profile the site would refuse must fail with the cluster's reason in Snakemake's output.

The runs keep the shipped config's accelerator (auto, so the GPU on a cluster), which the test
cluster's GPUs (device files) could not train on anyway: each job is cancelled as soon as it
runs. What is checked is what the cluster accepted and started, not the training (letting the
33 ranks start only to stop took 4 to 5 minutes of the suite on two cores).
"""

from __future__ import annotations

import re
import shlex
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from helpers.profiles import load_profile, with_account
from helpers.slurm import SUBMITTED, run_slurm, sacct_job, squeue_jobs
from helpers.workflow import ROOT, Workspace, tiny_config

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.timeout(600)]

# What each shipped profile must get from the site, per topology: partition, QOS, node feature,
# GPUs per node as SLURM records them (TresPerNode) and nodes.
SITES = {
    "gilbreth": ("a100-80gb", "normal", "", "gres:gpu:{gpus}", ["1x1", "1x2", "2x2"]),
    "gilbreth-training": ("training", "training", "", "gres:gpu:{gpus}", ["1x1", "1x4", "2x4"]),
    # no partition in the profile: the plugin names sinfo's default, Raven-like "general"
    "raven": ("general", "normal", "gpu", "gres:gpu:a100:{gpus}", ["1x1", "1x4", "2x4"]),
}
# Only the first status check waits less than the profiles' 40 s; it changes no sbatch option.
FAST = ["--slurm-init-seconds-before-status-checks", "5"]


def site_profile(name: str, folder: Path, change=None) -> str:
    """profiles/<name> with the account set as a user sets it (helpers.profiles.with_account), in
    `folder`; `change(profile)` edits it further."""
    # with_account gives a temporary folder, or the folder itself when it has no placeholder
    profile = yaml.safe_load((ROOT / with_account(f"profiles/{name}", "test_account") / "config.yaml").read_text())
    if change is not None:
        change(profile)
    target = folder / name
    target.mkdir(parents=True)
    (target / "config.yaml").write_text(yaml.safe_dump(profile, sort_keys=False))
    return str(target)


def tres_per_node(job_id: str) -> str:
    """GPUs per node as the controller holds them (MinJobAge keeps a finished job there)."""
    out = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True, check=True).stdout
    return re.search(r"TresPerNode=(\S+)", out)[1]


def submitted_jobs(name: str, log: str) -> dict[str, str]:
    """{topology: job id} of one profile's run, each job checked against what its site expects."""
    partition, qos, feature, gres, topologies = SITES[name]
    submitted = SUBMITTED.findall(log)
    assert "SLURM sbatch failed" not in log, log[-3000:]
    assert len(submitted) == len(topologies), log[-3000:]
    seen = {}
    for job_id in submitted:
        job = sacct_job(job_id)
        topology = re.search(r"_wildcards_(\d+x\d+)_0$", job["Comment"])[1]
        nodes, gpus = topology.split("x")
        seen[topology] = job_id
        print(f"{name} {topology}: job {job_id} {job['State']} on {job['NodeList']}, {job['ReqTRES']}\n"
              f"  {job['SubmitLine']}")
        # accepted and started: it got nodes and a start time (cancelled once running, below)
        assert job["State"].split()[0] in ("RUNNING", "CANCELLED", "COMPLETED", "FAILED"), (name, job)
        assert job["Start"] not in ("Unknown", "None", "") and job["NodeList"] != "None assigned", (name, job)
        assert (job["Partition"], job["Account"], job["QOS"]) == (partition, "test_account", qos), (name, job)
        assert job["Constraints"] == feature, (name, job)
        assert job["NNodes"] == nodes, (name, job)
        assert tres_per_node(job_id) == gres.format(gpus=gpus), (name, job)
        # the profile's slurm-no-requeue: SLURM never restarts a job Snakemake resubmits
        assert " --no-requeue " in job["SubmitLine"], (name, job)
        assert f"gres/gpu={int(nodes) * int(gpus)}" in job["ReqTRES"], (name, job)
    assert sorted(seen) == sorted(topologies), name
    return seen


@pytest.mark.parametrize("name", ["gilbreth", "gilbreth-training"])
def test_gilbreth_leaves_hca_and_gpudirect_to_nccl(name):
    # RCAC's Gilbreth guide names no HCA and no NCCL setting, so NCCL's detection chooses: a
    # pinned NCCL_IB_HCA=mlx5_0 would leave a node's other HCAs idle, NCCL_NET_GDR_LEVEL=5 (SYS)
    # would force GPUDirect RDMA across CPU sockets (profiles/gilbreth/config.yaml says where)
    train = load_profile(name)["set-resources"]["train"]
    variables = {item.partition("=")[0] for item in shlex.split(train.get("site_env", ""))}
    assert not variables & {"NCCL_IB_HCA", "NCCL_NET_GDR_LEVEL"}, (name, train["site_env"])
    # what makes that safe: the report still flags a multi-node run that fell back to sockets
    assert train["site_interconnect"] == "infiniband", name


def test_shipped_profiles_are_accepted_by_their_sites(slurm_cluster, tmp_path):
    # The three sites' partitions are disjoint nodes (a100-80gb g*, training t*, general r*), so
    # the three submissions run at once, as three users' would: one at a time took 3 x 88 s.
    def submit(name: str) -> tuple[int, str]:
        workspace = Workspace(tmp_path / name / "ws")
        workspace.write_config(tiny_config(topologies=SITES[name][4]))
        # --retries 0: each job is cancelled by design, and the profiles' retries would submit
        # it twice more (the command line wins over the profile, as a user's would)
        return run_slurm(workspace, "scaling", *FAST, "--retries", "0", profile=site_profile(name, tmp_path / name),
                         during=lambda: cancel_running(workspace.path))

    with ThreadPoolExecutor(len(SITES)) as pool:
        runs = dict(zip(sorted(SITES), pool.map(submit, sorted(SITES))))
    for name, (code, log) in runs.items():
        print(f"\n{name}: snakemake exit {code}")
        submitted_jobs(name, log)


def cancel_running(workdir) -> bool:
    """scancel every job from workdir that SLURM has started; never done (run_slurm's `during`)."""
    running = [job_id for job_id, state, _ in squeue_jobs(workdir) if state == "RUNNING"]
    if running:
        subprocess.run(["scancel", *running], check=True)
    return False


def no_constraint(profile):
    del profile["set-resources"]["train"]["constraint"]


def partial_nodes(profile):
    profile["set-resources"]["train"]["site_multi_node_whole_nodes"] = False


def four_gpus_per_node(profile):
    profile["set-resources"]["train"]["site_gpus_per_node"] = 4


def qos(value):
    def change(profile):
        if value is None:
            del profile["default-resources"]["qos"]
        else:
            profile["default-resources"]["qos"] = value
    return change


# (profile, change, topology, what the cluster answers)
REFUSED = {
    "gilbreth-4-gpus-per-node": ("gilbreth", four_gpus_per_node, "1x4",
                                 "Requested node configuration is not available"),
    "gilbreth-without-qos": ("gilbreth", qos(None), "1x2",
                             "Gilbreth: name a QOS for partition a100-80gb: --qos=normal or --qos=standby"),
    "gilbreth-training-qos-normal": ("gilbreth-training", qos("normal"), "1x4",
                                     "Gilbreth: partition training runs under --qos=training only"),
    "raven-without-constraint": ("raven", no_constraint, "1x4",
                                 'Raven: GPU jobs must request the GPU nodes with --constraint="gpu"'),
    "raven-partial-nodes": ("raven", partial_nodes, "2x2",
                            "Raven: jobs on more than one node use whole nodes: request --gres=gpu:a100:4"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_profile_the_site_would_refuse_fails_with_the_sites_reason(slurm_cluster, workspace, tmp_path, case):
    name, change, topology, reason = REFUSED[case]
    # the refused topology alone, as the baseline too: no other job to wait for
    workspace.write_config(tiny_config(topologies=[topology], baseline=topology))
    code, log = run_slurm(workspace, "scaling", *FAST, timeout=240, profile=site_profile(name, tmp_path, change))
    assert code != 0
    assert not SUBMITTED.findall(log), "the site would not have queued it"
    assert "SLURM sbatch failed" in log and reason in log, log[-3000:]
    call = re.search(r"sbatch call:\s*\n\s*(sbatch .*)", log)
    print(f"\n{case} {topology}: refused with {reason!r}\n  {call[1] if call else '(no sbatch call in the log)'}")
