"""What the workflow does while it parses (ddpscale.plan.workflowplan), step by step and whole,
without Snakemake: the config's layers, the schema in one line, a LightningCLI config, the profile
and its retries, the plan, the checks that need it, the time limits, the executor and a dry run's
decisions. Each refusal is a ParseError, one line per problem, as the workflow prints it."""

from __future__ import annotations

import types
from pathlib import Path

import pytest
import yaml
from snakemake.utils import validate

from helpers.workflow import ROOT, tiny_config
from ddpscale.plan import contractfacts, workflowplan
from ddpscale.plan.cost import reservation
from ddpscale.run.hostdevices import VisibleGpus
from ddpscale.plan.site.resources import Site
from ddpscale.plan.workflowplan import Given, ParseError

SCHEMA = str(ROOT / "workflow/schemas/config.schema.yaml")
LOCAL = {"train": {"site_launcher": "local", "site_gpus_per_node": 8}}
SRUN = {"train": {"site_launcher": "srun", "site_gpus_per_node": 4, "site_cpus_per_gpu": 8,
                  "site_mem_mb_per_gpu": 1000}}


def fill_defaults(config: dict) -> None:
    validate(config, SCHEMA)  # what common.smk hands over: Snakemake's validate fills the defaults


@pytest.fixture
def workspace(tmp_path, monkeypatch):
    """A working directory with config/config.yaml (the shipped config, shrunk), as snakemake runs in."""
    (tmp_path / "config").mkdir()
    (tmp_path / "config/config.yaml").write_text(yaml.safe_dump(tiny_config()))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(workflowplan, "visible_gpus", lambda: VisibleGpus(0, (), "nvidia-smi -L"))
    return tmp_path


def given(workspace, overlays=(), overrides=None, overwrite=None, **changes) -> Given:
    """What Snakemake would hand over for `snakemake --configfile <overlays> --config <overrides>`."""
    overlays = [str(workspace / name) for name in overlays]
    changes = {"argv": ["snakemake"], "environ": {}, **changes}
    return Given(configfiles=[str(workspace / "config/config.yaml"), *overlays], overlays=overlays,
                 overrides=dict(overrides or {}), overwrite_config=dict(overrides or {}),
                 overwrite_resources=LOCAL if overwrite is None else overwrite, cwd=str(workspace), **changes)


def loaded(workspace, overlays=(), overrides=None) -> dict:
    """The config as Snakemake merges it before the Snakefile runs."""
    config = yaml.safe_load((workspace / "config/config.yaml").read_text())
    for name in overlays:
        merge(config, yaml.safe_load((workspace / name).read_text()))
    merge(config, overrides or {})
    return config


def merge(into: dict, layer: dict) -> None:
    for key, value in layer.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            merge(into[key], value)
        else:
            into[key] = value


def no_contract(monkeypatch) -> None:
    """The user's classes are not imported (a process with torch): the contract's facts say nothing."""
    monkeypatch.setattr(contractfacts, "start", lambda *args: contractfacts.Pending({}, None, Path("unused"), ""))
    monkeypatch.setattr(workflowplan, "contract_problems", lambda *args: [])


# --- the config ---


def test_the_layers_come_in_snakemakes_order_each_named_as_the_user_names_it(workspace):
    (workspace / "big.yaml").write_text("max_epochs: 9\n")
    layers = workflowplan.config_layers(given(workspace, ["big.yaml"], {"repeats": 2}))
    assert [name for name, _ in layers] == ["config/config.yaml", "big.yaml", "--config"]
    assert layers[1][1] == {"max_epochs": 9} and layers[2][1] == {"repeats": 2}


def test_an_overlay_the_reader_refuses_stops_in_one_line_naming_it(workspace):
    (workspace / "broken.yaml").write_text("a: 1\na: 2\n")
    with pytest.raises(ParseError) as caught:
        workflowplan.config_layers(given(workspace, ["broken.yaml"]))
    assert str(caught.value).startswith("broken.yaml line 2: key 'a' is given on lines 1 and 2")
    assert "\n" not in str(caught.value)


def test_a_bad_key_is_named_with_the_file_that_set_it_before_any_default_is_filled(workspace):
    (workspace / "broken.yaml").write_text("max_epochs: -3\n")
    filled = []
    with pytest.raises(ParseError) as caught:
        workflowplan.read_config(loaded(workspace, ["broken.yaml"]), given(workspace, ["broken.yaml"]), filled.append)
    assert str(caught.value).startswith("broken.yaml: max_epochs") and filled == []


def test_the_config_is_completed_in_place_and_named_by_its_files(workspace):
    (workspace / "big.yaml").write_text("max_epochs: 9\n")
    config = loaded(workspace, ["big.yaml"])
    read = workflowplan.read_config(config, given(workspace, ["big.yaml"]), fill_defaults)
    assert read.config_source == "config/config.yaml + big.yaml"
    assert read.source(("max_epochs",)) == "big.yaml" and read.source(("seed",)) == "config/config.yaml"
    assert config["max_epochs"] == 9 and read.lightning is None and read.cli_classes == {}


def test_a_lightning_config_that_is_not_a_file_is_refused_with_its_source(workspace):
    overrides = {"lightning_config": "missing.yaml"}
    with pytest.raises(ParseError) as caught:
        workflowplan.read_config(loaded(workspace, overrides=overrides), given(workspace, overrides=overrides),
                                 fill_defaults)
    assert str(caught.value) == ("--config: lightning_config is 'missing.yaml', which is not a file (paths are "
                                 "relative to the directory snakemake runs in); fix the path or set it to null")


# --- the profile ---


def test_a_profile_problem_stops_where_the_user_started_only(workspace):
    typo = {"train": {**LOCAL["train"], "partition": "a100"}}
    with pytest.raises(ParseError, match="sets 'partition', which the SLURM plugin does not read"):
        workflowplan.read_profile(given(workspace, overwrite=typo))
    # a job's own snakemake gets the resources again, already checked
    assert workflowplan.read_profile(given(workspace, overwrite=typo, main=False)).site.is_local


def test_a_site_fact_the_site_cannot_run_is_one_line_not_a_traceback(workspace):
    with pytest.raises(ParseError, match="site_launcher"):
        workflowplan.read_profile(given(workspace, overwrite={"train": {"site_launcher": "mpirun"}}))


def test_retries_where_slurm_may_requeue_are_refused_on_a_cluster_and_no_retries_are_said(workspace):
    (workspace / "profile").mkdir()
    (workspace / "profile/config.yaml").write_text("retries: 2\n")
    cluster = workflowplan.read_profile(given(workspace, overwrite=SRUN))
    argv = ["snakemake", "--profile", str(workspace / "profile")]
    with pytest.raises(ParseError, match="retries is 2, but the site's JobRequeue"):
        workflowplan.check_retries(cluster, given(workspace, argv=argv))
    said = []
    workflowplan.check_retries(cluster, given(workspace, argv=[*argv, "--retries", "0"]), said.append)
    assert len(said) == 1 and said[0].startswith(f"ddpscale: note: {workspace}/profile/config.yaml sets no retries")
    # the local profile has no retries to check
    workflowplan.check_retries(workflowplan.read_profile(given(workspace)), given(workspace, argv=argv), said.append)
    assert len(said) == 1


# --- the whole program ---


def test_the_whole_program_plans_the_runs_and_says_its_lines_in_order(workspace, monkeypatch):
    no_contract(monkeypatch)
    said = []
    parsed = workflowplan.build(loaded(workspace), given(workspace), fill_defaults, said.append)
    assert parsed.plan.runs() == [("1x1", 0), ("1x2", 0)] and parsed.profile.site.is_local
    assert said[0] == "ddpscale: experiment spiralmlp: results in results/spiralmlp/"
    assert said[1].startswith("ddpscale: measure full") and all(line.startswith("ddpscale: ") for line in said)
    assert parsed.read.config_source == "config/config.yaml"


def test_a_setting_the_runs_devices_cannot_run_stops_before_the_contract_is_judged(workspace, monkeypatch):
    no_contract(monkeypatch)
    monkeypatch.setattr(workflowplan, "check_contract", lambda *args: pytest.fail("judged after a refusal"))
    overrides = {"dataset": {"samples": 10}}
    with pytest.raises(ParseError, match="dataset.samples"):
        workflowplan.build(loaded(workspace, overrides=overrides), given(workspace, overrides=overrides),
                           fill_defaults, [].append)


def test_a_topology_the_site_cannot_place_is_one_line(workspace, monkeypatch):
    no_contract(monkeypatch)
    overrides = {"topologies": ["1x1", "1x16"]}
    with pytest.raises(ParseError) as caught:
        workflowplan.build(loaded(workspace, overrides=overrides), given(workspace, overrides=overrides),
                           fill_defaults, [].append)
    assert "1x16" in str(caught.value) and "\n" not in str(caught.value)


def test_a_contract_process_that_failed_is_named_with_the_models_source(workspace):
    pending = contractfacts.Pending(None, None, Path("unused"), "")
    read = workflowplan.ConfigRead([("config/config.yaml", {"model": {"class_path": "x"}})], "config/config.yaml")

    def failed(_):
        raise ValueError("importing x ended the process (exit 1): boom; fix the module")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(contractfacts, "finish", failed)
        with pytest.raises(ParseError) as caught:
            workflowplan.check_contract(tiny_config(), read, pending)
    assert str(caught.value) == "config/config.yaml: importing x ended the process (exit 1): boom; fix the module"


# --- after the rules ---


def test_a_cluster_executor_with_no_site_facts_is_refused(workspace, monkeypatch):
    no_contract(monkeypatch)
    parsed = workflowplan.build(loaded(workspace), given(workspace), fill_defaults, [].append)
    assert workflowplan.executor_problem(parsed.plan, non_local_exec=False) is None
    assert workflowplan.executor_problem(parsed.plan, non_local_exec=True) == workflowplan.NO_SITE_FACTS
    assert workflowplan.time_limits(parsed, given(workspace)) == parsed.plan.job_runtimes(parsed.profile.runtimes)


def test_a_time_limit_that_leaves_no_time_for_the_signal_is_refused_naming_the_profile(workspace):
    site = Site(launcher="srun", gpus_per_node=4, signal_s=600)
    parsed = types.SimpleNamespace(plan=types.SimpleNamespace(job_runtimes=lambda runtimes: {"train_baseline": 5}),
                                   profile=types.SimpleNamespace(site=site, runtimes={}))
    with pytest.raises(ParseError) as caught:
        workflowplan.time_limits(parsed, given(workspace, argv=["snakemake", "--profile", "profiles/x"]))
    assert str(caught.value) == ("profiles/x/config.yaml: train_baseline: site_signal_s 600 s is not below the "
                                 "job's time limit of 300 s, so SLURM would signal every run as it starts; lower "
                                 "site_signal_s or raise the runtime")


def fake_dag(jobs: dict):
    """A DAG as dag_decisions reads it: {(rule, topology, repeat): (runs, reason names)}."""
    made = [types.SimpleNamespace(rule=types.SimpleNamespace(name=rule),
                                  wildcards=types.SimpleNamespace(topology=topology, repeat=str(repeat)), decided=d)
            for (rule, topology, repeat), d in jobs.items()]
    reason = types.SimpleNamespace
    return types.SimpleNamespace(jobs=made, needrun=lambda job: job.decided[0],
                                 reason=lambda job: reason(get_names=lambda: job.decided[1], updated_input=[]))


def test_a_dry_runs_decisions_are_read_for_training_jobs_only(workspace, monkeypatch):
    no_contract(monkeypatch)
    parsed = workflowplan.build(loaded(workspace), given(workspace), fill_defaults, [].append)
    dag = fake_dag({("train_baseline", "1x1", 0): (True, []), ("train_single_node", "1x2", 0): (False, []),
                    ("report_scaling", "all", 0): (True, [])})
    decided = workflowplan.dag_decisions(parsed.plan, dag)
    assert decided == {("1x1", 0): reservation.Decision(False, True, ""),
                       ("1x2", 0): reservation.Decision(False, False, reservation.NOT_SCHEDULED)}
    lines = workflowplan.reservation_lines(parsed, types.SimpleNamespace(jobs=None))
    assert lines[0].startswith("ddpscale: note: Snakemake's decision per job could not be read (TypeError")
