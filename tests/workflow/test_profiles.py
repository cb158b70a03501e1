"""Real `snakemake --dry-run` per profile: the train jobs get the resources and launch command
of ddpscale.plan.site.resources, and impossible topologies stop the workflow before any job.

A dry run needs no SLURM (no sbatch, sacct or squeue) and takes a few seconds.
"""
import json
import re
import subprocess

import pytest
import yaml

from ddpscale.plan.site.resources import cluster_env, launch_prefix, slurm_resources
from ddpscale.run.topology import parse_topology

from helpers.profiles import dry_run, load_profile, profile_site, train_jobs, with_account
from helpers.workflow import ROOT, SNAKEMAKE, WORKFLOW_PYTHON

TOPOLOGIES = ["1x1", "1x4", "2x4", "4x1"]


@pytest.fixture(scope="module", params=["gilbreth-training", "raven", "slurm", "local"])
def planned(request):
    rc, output = dry_run(request.param, planned_topologies(request.param))
    assert rc == 0, output
    return request.param, train_jobs(output)


def planned_topologies(profile):
    # Raven refuses 4x1: a job of more than one node takes whole nodes there
    return ["1x1", "1x4", "2x4"] if profile == "raven" else TOPOLOGIES


def test_dry_run_plans_one_train_job_per_topology(planned):
    profile, jobs = planned
    assert sorted(jobs) == sorted(planned_topologies(profile))


def test_train_jobs_get_the_mapped_resources_and_launch(planned):
    profile, jobs = planned
    site = profile_site(profile)
    for name, (resources, shell) in jobs.items():
        topo = parse_topology(name)
        for key, value in slurm_resources(topo, site).items():
            assert resources[key] == str(value), (profile, name, key)
        assert shell.startswith(launch_prefix(topo, site, WORKFLOW_PYTHON) + " scripts/train.py "), shell
        flags = f"--num-nodes={topo.num_nodes} --devices-per-node={topo.devices_per_node} "
        assert flags in shell
        assert f"--cluster-env={cluster_env(topo, site)} " in shell


def test_multi_rank_launch_commands(planned):
    profile, jobs = planned
    py = WORKFLOW_PYTHON
    resources, shell = jobs["1x1"]
    # on the local profile the one rank goes through the launcher, which holds the machine's lock
    assert resources["mpi"] == "" and ("launch_local" in shell) == (profile == "local"), shell
    # on a cluster the one rank is an srun task too: --signal warns job steps, not the batch step
    assert ("srun --nodes=1 --ntasks-per-node=1 " in shell) == (profile != "local"), shell
    resources, shell = jobs["2x4"]
    assert (resources["nodes"], resources["tasks"], resources["tasks_per_gpu"]) == ("2", "8", "0")
    if profile == "local":
        assert resources["mpi"] == ""
        # CPU-simulated: the ranks see no GPU
        assert shell.startswith(f"env CUDA_VISIBLE_DEVICES= {py} scripts/launch_local.py --nodes 2 "
                                f"--procs-per-node 4 -- {py} scripts/train.py ")
        assert jobs["4x1"][1].startswith(f"env CUDA_VISIBLE_DEVICES= {py} scripts/launch_local.py "
                                         f"--nodes 4 --procs-per-node 1 -- {py} scripts/train.py ")
        assert "--accelerator=cpu " in shell
    else:
        assert resources["mpi"] == "srun"
        srun = r"\bsrun --nodes=2 --ntasks-per-node=4 --cpus-per-task=\d+ --kill-on-bad-exit=1 "
        assert re.search(srun + re.escape(f"{py} scripts/train.py "), shell)
        # the allocation's GPUs, asked for explicitly: `auto` would train on a node's CPU
        # without a word where torch cannot start CUDA (tests/workflow/test_cudacheck.py)
        assert "--accelerator=gpu " in shell and "CUDA_VISIBLE_DEVICES" not in shell


def test_too_many_devices_per_node_stops_the_dry_run():
    # Gilbreth's a100-80gb nodes have 2 GPUs: sbatch would say "Requested node configuration is
    # not available" for 1x4; the dry run says it first (4 GPUs: profiles/gilbreth-training)
    rc, output = dry_run("gilbreth", ["1x1", "1x4"])
    assert rc != 0
    assert "'1x4' asks for 4 devices per node but the profile's nodes have 2 (site_gpus_per_node)" in output
    assert "e.g. '2x2'" in output
    assert "rule train_" not in output
    rc, output = dry_run("gilbreth", ["1x1", "1x2", "2x2", "2x1"])
    assert rc == 0, output
    jobs = train_jobs(output)
    assert {name: jobs[name][0]["gres"] for name in jobs} == {"1x1": "gpu:1", "1x2": "gpu:2", "2x2": "gpu:2",
                                                              "2x1": "gpu:1"}


def test_a_part_node_multi_node_topology_stops_the_raven_dry_run():
    # Raven gives jobs of more than one node whole 4-GPU nodes
    rc, output = dry_run("raven", ["1x1", "1x2", "2x2"])
    assert rc != 0
    assert "'2x2' spans 2 nodes with 2 of their 4 GPUs each" in output
    assert "rule train_" not in output


def test_zero_nodes_stops_the_dry_run():
    rc, output = dry_run("raven", ["0x2"])
    assert rc != 0
    assert "topologies[0]: '0x2' has 0 nodes; nodes must be an integer >= 1" in output
    assert "rule train_" not in output


@pytest.mark.xfail(strict=True, reason=(
    "known limit: --set-resources on the command line replaces the profile's, dropping the "
    "site_* facts. Snakemake names the executor only once execution starts, so a dry run "
    "cannot tell. A real submission is stopped by check_site_matches_executor (common.smk; "
    "tests/slurm/test_slurm.py) and the local launcher refuses multi-rank runs inside a SLURM job"
))
def test_command_line_set_resources_keeps_the_slurm_site():
    rc, output = dry_run("raven", ["1x1", "2x4"], "--set-resources", "train:runtime=240")
    assert rc != 0 or train_jobs(output)["2x4"][0]["mpi"] == "srun"


@pytest.mark.parametrize("profile", ["gilbreth", "gilbreth-training", "raven", "slurm", "tests/slurm/profile"])
def test_cluster_profiles_query_status_with_sacct(profile):
    """Plugin 2.8.0 reads a job that has left squeue (MinJobAge after its end) as still running
    (__init__.py: no status -> yielded as active), and a literal UNKNOWN as success; sacct keeps
    every job's final state. The throwaway cluster has slurmdbd too, so its profile does the same."""
    assert load_profile(profile)["slurm-status-command"] == "sacct"


@pytest.mark.parametrize("rule", ["train", "train_multi_node"])
def test_profile_slurm_extra_stops_the_dry_run(tmp_path, rule):
    """A profile's own slurm_extra would replace the per-topology one (--ntasks-per-node, --signal)."""
    profile = load_profile("raven")
    profile["set-resources"].setdefault(rule, {})["slurm_extra"] = "--qos=high"
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(profile))
    rc, output = dry_run(str(tmp_path), ["1x1", "2x4"])
    assert rc != 0
    assert f"profile set-resources {rule}: slurm_extra would replace the flags ddpscale sets" in output
    assert "site_slurm_extra" in output and "rule train_" not in output


def test_retries_where_slurm_may_requeue_stop_the_dry_run_and_no_retries_are_said(tmp_path):
    """A copy of a site profile without slurm-no-requeue is refused before any job (two jobs could
    train into one checkpoint); --retries 0 makes it safe again, and the dry run says in one line
    that nothing will be resubmitted."""
    profile = load_profile("raven")
    del profile["slurm-no-requeue"]
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(profile))
    rc, output = dry_run(str(tmp_path), ["1x1"])
    assert rc != 0
    assert f"{tmp_path}/config.yaml: retries is 2, but the site's JobRequeue (SLURM's default: 1)" in output
    assert "rule train_" not in output
    rc, output = dry_run(str(tmp_path), ["1x1"], "--retries", "0")
    assert rc == 0, output
    said = [line for line in output.splitlines() if "sets no retries" in line]
    assert said == [f"ddpscale: note: {tmp_path}/config.yaml sets no retries: a training job that hits its time "
                    "limit or loses its node is not resubmitted, and resumes only when you run snakemake again; "
                    "set retries: 2 and slurm-no-requeue: true (docs/clusters.md, An unattended night)"]


# The stage of each test topology with baseline 1x1, and the rule that trains it.
RULE_OF_TOPOLOGY = {"1x1": "train_baseline", "1x4": "train_single_node", "2x4": "train_multi_node",
               "4x1": "train_multi_node"}


@pytest.mark.parametrize("profile", ["gilbreth-training", "raven", "slurm", "local"])
def test_each_stage_gets_its_own_set_resources_over_the_shared_ones(profile):
    """Issue 12: set-resources by stage rule name, on top of what `train` sets for every stage
    (measure: full, which keeps the profile's time limits: throughput mode sizes its own)."""
    rules = {}
    rc, output = dry_run(profile, planned_topologies(profile), measure="full")
    assert rc == 0, output
    jobs = train_jobs(output, rules)
    assert rules == {name: RULE_OF_TOPOLOGY[name] for name in planned_topologies(profile)}
    entries = load_profile(profile)["set-resources"]
    for topology, rule in rules.items():
        resources, _ = jobs[topology]
        wanted = {**entries["train"], **entries.get(rule, {})}
        if "runtime" in wanted:
            assert resources["runtime"] == str(wanted["runtime"]), (profile, topology, rule)
    if profile != "local":
        # the baseline trains on one GPU: its own, longer limit
        assert int(jobs["1x1"][0]["runtime"]) > int(jobs["1x4"][0]["runtime"])


def test_a_stage_entry_overrides_shared_resources_and_partition(tmp_path):
    """A QOS and partition for multi-node jobs only; the other stages keep the shared ones."""
    profile = load_profile("gilbreth-training")
    profile["set-resources"]["train_multi_node"] = {"slurm_partition": "big", "runtime": 30}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(profile))
    rules = {}
    rc, output = dry_run(str(tmp_path), TOPOLOGIES, measure="full")
    assert rc == 0, output
    jobs = train_jobs(output, rules)
    for topology in ("2x4", "4x1"):
        assert (jobs[topology][0]["slurm_partition"], jobs[topology][0]["runtime"]) == ("big", "30")
    assert jobs["1x4"][0]["runtime"] == str(profile["set-resources"]["train"]["runtime"])
    assert jobs["1x4"][0].get("slurm_partition") != "big"


def test_site_facts_under_a_stage_entry_stop_the_dry_run(tmp_path):
    profile = load_profile("gilbreth")
    profile["set-resources"]["train_single_node"] = {"site_gpus_per_node": 8}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(profile))
    rc, output = dry_run(str(tmp_path), ["1x1", "1x4"])
    assert rc != 0
    assert ("profile set-resources train_single_node: site_gpus_per_node is a site fact; site facts hold "
            "for every stage, so set them once, under set-resources train") in output
    assert "rule train_" not in output


def test_a_stage_runs_alone_by_its_name():
    """`snakemake ... multi_node` plans the M x N topologies and nothing else."""
    rules = {}
    rc, output = dry_run("slurm", TOPOLOGIES, "multi_node")
    assert rc == 0, output
    train_jobs(output, rules)
    assert rules == {"2x4": "train_multi_node", "4x1": "train_multi_node"}
    assert "rule report_scaling" not in output


def test_the_rerun_the_report_names_reruns_every_training_run():
    """The fix the report names for runs that differ (records.RERUN_ALL) plans every run again."""
    from ddpscale.report.load.records import RERUN_ALL

    rule_names = RERUN_ALL.split("--forcerun ")[1].split()
    cmd = [*SNAKEMAKE, "--profile", with_account("profiles/slurm", "test_account"), "-n", "--config", f"topologies={json.dumps(TOPOLOGIES)}",
           "repeats=1", "--forcerun", *rule_names]
    proc = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout
    rules = {}
    train_jobs(proc.stdout, rules)
    assert sorted(rules) == sorted(TOPOLOGIES)
    # forced, whether or not their metrics exist here
    forced = re.findall(r"^rule (train_\w+):\n(?:    .*\n)*?    reason: Forced execution", proc.stdout, re.M)
    assert len(forced) == len(TOPOLOGIES), proc.stdout


@pytest.mark.parametrize("profile", ["gilbreth", "gilbreth-training", "slurm"])
def test_a_profile_as_shipped_is_refused_until_its_account_is_set(profile):
    rc, output = dry_run(profile, ["1x1"], account=None)
    assert rc != 0
    assert (f"profiles/{profile}/config.yaml: default-resources slurm_account is still the placeholder "
            f"'my_account'; set your own") in output
    assert "rule train_" not in output


def dry_run_edited_raven(tmp_path, edit):
    """A dry run of 1x1 and 2x4 through a copy of the Raven profile changed by `edit`."""
    profile = load_profile("raven")
    edit(profile["set-resources"])
    folder = tmp_path / "raven"
    folder.mkdir()
    (folder / "config.yaml").write_text(yaml.safe_dump(profile))
    rc, output = dry_run(str(folder), ["1x1", "2x4"])
    return folder, rc, output


def test_a_resource_the_plugin_does_not_read_is_refused_before_any_job(tmp_path):
    folder, rc, output = dry_run_edited_raven(
        tmp_path, lambda entries: entries.update(train_multi_node={"slurm_qos": "long"}))
    assert rc != 0
    assert (f"{folder}/config.yaml: set-resources train_multi_node sets 'slurm_qos', which the SLURM plugin "
            f"does not read and drops without a word; the SLURM plugin's name for it is qos") in output
    assert "rule train_" not in output


def test_a_constraint_in_site_slurm_extra_is_refused_before_any_job(tmp_path):
    """Raven's --constraint="gpu" belongs in the plugin's constraint resource: the plugin refuses
    it inside slurm_extra, but only when it submits that job."""
    def edit(entries):
        del entries["train"]["constraint"]
        entries["train"]["site_slurm_extra"] = '--constraint="gpu"'

    folder, rc, output = dry_run_edited_raven(tmp_path, edit)
    assert rc != 0
    assert (f"{folder}/config.yaml: set-resources train site_slurm_extra '--constraint=\"gpu\"' sets the node "
            f"constraints, which the SLURM plugin refuses inside slurm_extra; set it with constraint instead") in output
    assert "rule train_" not in output


@pytest.mark.parametrize("key, value", [
    ("site_slurm_extra", "--gpu-bind=none; touch x #"), ("site_slurm_extra", "--gpu-bind=none\ntouch x"),
    ("site_env", "A=1; touch x"), ("site_launcher", "srun; touch x;")])
def test_profile_values_a_shell_would_run_stop_the_dry_run(tmp_path, key, value):
    """Each of these passed the dry run and ran `touch x` on the login node at submission (the
    plugin runs sbatch through a shell) or in every job's shell line."""
    _, rc, output = dry_run_edited_raven(tmp_path, lambda entries: entries["train"].update({key: value}))
    assert rc != 0
    assert f"profile set-resources train: {key} " in output, output[-2000:]
    assert "rule train_" not in output


def test_raven_training_jobs_ask_for_the_gpu_node_feature():
    rc, output = dry_run("raven", ["1x1", "1x4", "2x4"])
    assert rc == 0, output
    assert {name: res["constraint"] for name, (res, _) in train_jobs(output).items()} == {
        "1x1": "gpu", "1x4": "gpu", "2x4": "gpu"}


# -- flags of the train command by profile (their code: tests/unit/job/measure/test_timing.py, test_transport.py)

def test_cluster_jobs_count_their_devices_from_the_job_start_local_ones_do_not():
    # the 1-device job on a cluster runs without SLURM's process group (cluster_env local), and
    # so counted its hold from train.py's start; a local run inside an allocation must not take
    # the allocation's start, which is other runs' time
    for profile, expected in (("slurm", True), ("local", False)):
        rc, output = dry_run(profile, ["1x1", "2x2"])
        assert rc == 0, output
        jobs = train_jobs(output)
        assert set(jobs) == {"1x1", "2x2"}
        for _, shell in jobs.values():
            assert (" --held-from-job " in shell + " ") is expected, shell


def test_the_train_command_carries_the_site_interconnect_only_where_the_profile_states_it(tmp_path):
    profile = load_profile("slurm")
    profile["set-resources"]["train"]["site_interconnect"] = "infiniband"
    (tmp_path / "ib").mkdir()
    (tmp_path / "ib/config.yaml").write_text(yaml.safe_dump(profile))
    for folder, expected in ((str(tmp_path / "ib"), True), ("local", False)):
        rc, output = dry_run(folder, ["1x1", "2x2"])
        assert rc == 0, output
        for _, shell in train_jobs(output).values():
            assert (" --site-interconnect=infiniband " in shell + " ") is expected, shell


def test_throughput_mode_jobs_ask_for_the_sized_limit_over_the_stage_entry():
    """The profile's stage entries set runtime (train_baseline: 240), which Snakemake applies over
    the rule's own resources; a throughput-mode job still gets the sized limit (10 min of
    measuring + 15 of set-up), full mode the stage's."""
    for measure, expected in (("throughput", {"1x1": "25", "1x4": "25"}), ("full", {"1x1": "240", "1x4": "120"})):
        rc, output = dry_run("gilbreth-training", ["1x1", "1x4"], measure=measure)
        assert rc == 0, output
        assert {name: resources["runtime"] for name, (resources, _) in train_jobs(output).items()} == expected


def test_a_signal_that_fits_the_profiles_limit_but_not_throughput_modes_is_refused(tmp_path):
    """Throughput mode sizes each job's limit from its caps (25 minutes here), shorter than the
    profile's 60 and 120: a site_signal_s of 26 minutes would signal every job as it starts."""
    profile = load_profile("slurm")
    profile["set-resources"]["train"]["site_signal_s"] = 1600
    folder = tmp_path / "slurm"
    folder.mkdir()
    (folder / "config.yaml").write_text(yaml.safe_dump(profile))
    rc, output = dry_run(str(folder), ["1x1", "2x4"], measure="full")
    assert rc == 0, output
    rc, output = dry_run(str(folder), ["1x1", "2x4"], measure="throughput")
    assert rc != 0
    # the message names the profile as the run was given it (with_account's copy of it here)
    refusals = [line for line in output.splitlines() if "/slurm/config.yaml: train_" in line]
    assert len(refusals) == 2 and all("site_signal_s 1600 s is not below the job's time limit of 1500 s" in line
                            for line in refusals), output
    assert "rule train_" not in output
