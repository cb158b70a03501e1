"""What a profile gives the workflow (ddpscale.plan.site.profile): resource names it may set, placeholders
it must not submit, the site facts and each stage's time limit."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from ddpscale.plan.site import profile
from ddpscale.plan.site.profile import PLUGIN, profile_file, resource_problems, slurm_extra_problems
from ddpscale.plan.site.resources import SiteError


def plugin_source() -> str:
    folder = Path(importlib.util.find_spec("snakemake_executor_plugin_slurm").origin).parent
    return "\n".join(path.read_text() for path in folder.glob("*.py"))


def test_every_name_taken_for_the_plugins_is_one_the_installed_plugin_reads():
    source = plugin_source()
    unread = sorted(name for name in PLUGIN
                    if not re.search(rf"resources(\.get\(\s*[\"']{name}[\"']|\.{name}\b)", source))
    assert unread == []


def test_the_qos_resource_is_qos_in_the_installed_plugin():
    """The project's README once said slurm_qos, which the plugin never reads."""
    source = plugin_source()
    assert re.search(r"resources\.get\(\s*\"qos\"", source)
    assert "slurm_qos" not in source


@pytest.mark.parametrize("name,hint", [
    ("slurm_qos", "the SLURM plugin's name for it is qos"),
    ("partition", "the SLURM plugin's name for it is slurm_partition"),
    ("walltime", "the SLURM plugin's name for it is runtime"),
    ("constrait", "did you mean constraint?"),
    ("cpus_per_tsk", "did you mean cpus_per_task?"),
])
def test_a_name_the_plugin_drops_is_named_with_its_fix(name, hint):
    problems = resource_problems("profiles/raven/config.yaml", "set-resources train", {name: "x"})
    assert problems == [f"profiles/raven/config.yaml: set-resources train sets '{name}', which the SLURM plugin "
                        f"does not read and drops without a word; {hint}"]


def test_known_names_and_site_facts_pass():
    resources = {"slurm_account": "lab", "slurm_partition": "a100", "qos": "normal", "constraint": "gpu",
                 "runtime": 60, "mem_mb": 8000, "cpus_per_task": 2, "site_launcher": "srun", "site_nonsense": 1}
    assert resource_problems("p", "default-resources", resources) == []


def test_the_placeholder_account_is_refused_and_a_real_one_is_not():
    assert resource_problems("profiles/gilbreth/config.yaml", "default-resources", {"slurm_account": "my_account"})
    assert resource_problems("profiles/gilbreth/config.yaml", "default-resources", {"slurm_account": "lusu"}) == []


@pytest.mark.parametrize("argv,env,expected", [
    (["snakemake", "--profile", "profiles/raven/", "-n"], {}, "profiles/raven/config.yaml"),
    (["snakemake", "--profile=profiles/gilbreth"], {}, "profiles/gilbreth/config.yaml"),
    (["snakemake"], {"SNAKEMAKE_PROFILE": "/site/profile"}, "/site/profile/config.yaml"),
    (["snakemake", "-n"], {}, "the profile"),
])
def test_the_profile_file_is_named_as_the_user_gave_it(argv, env, expected):
    assert profile_file(argv, env) == expected


def installed_forbidden():
    from snakemake_executor_plugin_slurm.validation import get_forbidden_slurm_options
    return get_forbidden_slurm_options()


@pytest.mark.parametrize("flags, fix", [
    ('--constraint="gpu"', "set it with constraint instead"),  # Raven's node feature
    ("-C gpu", "set it with constraint instead"),
    ("--qos=training", "set it with qos instead"),
    ("--gres=gpu:a100:4", "site_gpu_type"),
])
def test_an_option_the_plugin_refuses_in_slurm_extra_is_named_with_its_resource(flags, fix):
    problems = slurm_extra_problems("profiles/raven/config.yaml", "set-resources train", flags, installed_forbidden())
    assert len(problems) == 1 and fix in problems[0], problems
    assert problems[0].startswith(f"profiles/raven/config.yaml: set-resources train site_slurm_extra {flags!r}")


def test_flags_the_plugin_leaves_alone_pass():
    assert slurm_extra_problems("p", "set-resources train", "--gpu-bind=none --hint=nomultithread",
                                installed_forbidden()) == []


def test_every_option_the_installed_plugin_refuses_has_a_fix():
    from ddpscale.plan.site.profile import RESOURCE_FOR_OPTION
    assert {o for o in installed_forbidden().values()} - set(RESOURCE_FOR_OPTION) <= {
        "job name", "output file", "error file", "parsable output", "environment export", "job comment",
        "working directory", "tasks per GPU", "CPUs per GPU"}


def test_the_site_and_the_stage_limits_are_read_as_snakemake_applies_the_profile():
    from snakemake.resources import Resource

    overwrite = {"train": {"site_launcher": "srun", "site_gpus_per_node": 4, "runtime": Resource("runtime", "2h"),
                           "slurm_partition": "gpu"},
                 "train_multi_node": {"runtime": 30}}
    read = profile.read({"runtime": 10}, overwrite)
    assert (read.site.launcher, read.site.gpus_per_node) == ("srun", 4)
    assert read.shared == {"runtime": 120, "slurm_partition": "gpu"}  # as written: Resource's raw value
    assert read.runtimes == {"train_baseline": 120, "train_single_node": 120, "train_multi_node": 30}
    assert profile.read({"runtime": "1h"}, {}).runtimes["train_baseline"] == 60
    assert profile.runtime_minutes({"runtime": "2 * attempt"}) is None  # evaluated per job: unknown here
    assert read.notes == ()
    assert "`probe` is unused" in profile.read(None, {"probe": {}}).notes[0]


def test_a_site_fact_under_a_stage_entry_is_refused():
    with pytest.raises(SiteError, match="set-resources train_baseline: site_launcher is a site fact"):
        profile.read(None, {"train_baseline": {"site_launcher": "srun"}})


def test_every_entry_of_the_profile_is_checked_in_one_pass():
    found = profile.problems("p/config.yaml", {"slurm_qos": "x"},
                             {"train": {"partition": "gpu", "site_slurm_extra": "--qos=long"}})
    assert len(found) == 3, found
    assert found[0].startswith("p/config.yaml: default-resources sets 'slurm_qos'")
    assert found[1].startswith("p/config.yaml: set-resources train sets 'partition'")
    assert "refuses inside slurm_extra; set it with qos instead" in found[2]


@pytest.mark.parametrize("written,argv,expected", [
    ({}, [], (0, None)),
    ({"retries": 2, "slurm-no-requeue": True}, [], (2, False)),
    ({"restart-times": 3, "slurm-requeue": True}, [], (3, True)),
    ({"retries": 2, "slurm-no-requeue": True}, ["--retries", "0"], (0, False)),  # the command line wins
    ({"retries": 2}, ["--retries=1", "--slurm-no-requeue"], (1, False)),
    ({}, ["-T", "4", "--slurm-requeue"], (4, True)),
    ({"slurm-no-requeue": False}, [], (0, None)),
])
def test_retries_and_requeue_are_read_as_snakemake_applies_them(written, argv, expected):
    assert profile.retry_settings(written, argv) == expected


def test_retries_where_slurm_may_requeue_are_refused_and_no_retries_are_said():
    refused, notes = profile.retry_problems("profiles/x/config.yaml", 2, None)
    assert notes == [] and len(refused) == 1
    assert refused[0].startswith("profiles/x/config.yaml: retries is 2, but the site's JobRequeue")
    assert "two jobs would train into one checkpoint; set slurm-no-requeue: true" in refused[0]
    assert "--slurm-requeue asks" in profile.retry_problems("p", 1, True)[0][0]
    refused, notes = profile.retry_problems("profiles/x/config.yaml", 0, None)
    assert refused == [] and len(notes) == 1
    assert notes[0].startswith("note: profiles/x/config.yaml sets no retries: a training job that hits its time limit")
    assert profile.retry_problems("p", 2, False) == ([], [])


@pytest.mark.parametrize("name", ["gilbreth", "gilbreth-training", "raven", "slurm", "tests/slurm/profile"])
def test_every_cluster_profile_retries_and_never_lets_slurm_requeue(name):
    """The shipped profiles pass the check above, with the spelling the installed plugin reads."""
    from helpers.profiles import load_profile
    from snakemake_executor_plugin_slurm import ExecutorSettings

    written = load_profile(name)
    assert profile.retry_settings(written, []) == (2, False)
    assert profile.retry_problems(name, *profile.retry_settings(written, [])) == ([], [])
    assert "no_requeue" in ExecutorSettings.__dataclass_fields__  # written slurm-no-requeue in a profile


def test_the_profile_file_is_read_as_yaml_and_a_missing_one_is_empty(tmp_path):
    (tmp_path / "config.yaml").write_text("retries: 2\nslurm-no-requeue: true\n")
    assert profile.written(str(tmp_path / "config.yaml")) == {"retries": 2, "slurm-no-requeue": True}
    assert profile.written("the profile") == {}
