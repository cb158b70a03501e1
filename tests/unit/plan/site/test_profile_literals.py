"""Every resource of a profile is a literal of its kind (ddpscale.plan.site.profile.literal_problems):
Snakemake evaluates the rest as Python while it builds the jobs, and the SLURM plugin writes
several resources into sbatch's shell line unquoted. The profiles are read here as Snakemake reads
them: its profile parser turns the YAML into --default-resources and --set-resources arguments, and
its resource parser turns those into the Resource objects the workflow is handed."""

from __future__ import annotations

import pytest
from helpers.workflow import ROOT
from ddpscale.plan.site import profile
from ddpscale.plan.site.resources import SiteError
from snakemake.cli import parse_set_resources
from snakemake.exceptions import WorkflowError
from snakemake.profiles import ProfileConfigFileParser
from snakemake.resources import Resources

WHERE = "site/config.yaml"
SITE = {"site_launcher": "srun", "site_gpus_per_node": 4, "runtime": 120}


def as_snakemake_reads(tmp_path, default: dict, overwrite: dict, bare_default_resources=False):
    """(default, overwrite) as Snakemake hands them to the workflow (workflow.resource_settings)
    for a profile with these entries."""
    import yaml

    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"default-resources": default or None, "set-resources": overwrite}))
    with path.open() as stream:
        arguments = ProfileConfigFileParser().parse(stream)
    assigned = [] if bare_default_resources else arguments.get("default-resources", [])
    return (Resources.parse(assigned, allow_expressions=True, defaults="full"),
            parse_set_resources(arguments.get("set-resources", [])))


def problems_of(tmp_path, default=None, overwrite=None):
    defaults, overwrites = as_snakemake_reads(tmp_path, default or {}, overwrite or {"train": dict(SITE)})
    return profile.problems(WHERE, defaults, overwrites)


HOSTILE = [
    "1000 --comment=$(touch /tmp/x)",  # a second flag and a command substitution
    "1000; touch /tmp/x",
    "1000\ntouch /tmp/x",
    "`touch /tmp/x`",
    "1000 --qos=high",  # a space and a second flag
    "__import__('os').system('touch /tmp/x') or 1000",  # Python Snakemake would run
    "nan",
    "float('nan')",
    "1.5",
    "-1 ",
    "10" * 20,  # huge
    "１０００",  # non-ascii digits
]


@pytest.mark.parametrize("value", HOSTILE)
@pytest.mark.parametrize("name", ["mem_mb_per_cpu", "tasks", "tasks_per_node", "cpus_per_task", "nodes", "gpu"])
def test_a_count_that_is_not_a_whole_number_is_refused_in_one_line(tmp_path, name, value):
    try:
        found = problems_of(tmp_path, overwrite={"train": dict(SITE), "train_multi_node": {name: value}})
    except WorkflowError as err:  # Snakemake's own parser refused it first: as good
        assert "not a positive integer" in str(err), err
        return
    assert len(found) == 1, found
    line = found[0]
    assert line.startswith(f"{WHERE}: set-resources train_multi_node {name} must be a whole number")
    assert "\n" not in line and "got " in line


# (nan, 1.5 and digits are plain text: a partition may be called so)
@pytest.mark.parametrize("value", [v for v in HOSTILE if not v.replace(".", "").isdigit() and v != "nan"] + [
    "gpu a100", "a100)", "(gpu)", "$HOME", "~user", "gpu'", 'gpu"', "ｇｐｕ", "gpu\x1b[2J"])
@pytest.mark.parametrize("name", ["slurm_partition", "slurm_account", "qos", "constraint", "clusters"])
def test_a_name_that_is_not_plain_text_is_refused_in_one_line(tmp_path, name, value):
    found = problems_of(tmp_path, default={name: value})
    assert len(found) == 1, found
    assert found[0].startswith(f"{WHERE}: default-resources {name} ")
    assert "\n" not in found[0] and "write letters, digits" in found[0] or "Python" in found[0]


@pytest.mark.parametrize("name, value", [
    ("slurm_partition", "input"), ("qos", "True"), ("slurm_account", "attempt"), ("constraint", "max"),
    ("slurm_partition", "shutil.rmtree")])
def test_text_snakemake_would_evaluate_to_something_else_is_refused_with_its_quoting(tmp_path, name, value):
    found = problems_of(tmp_path, default={name: value})
    assert found == [(f"{WHERE}: default-resources {name} {value!r} is a Python expression to Snakemake, which "
                      f"would give the SLURM plugin its value instead; quote it as text: {name}: \"'{value}'\"")]
    assert problems_of(tmp_path, default={name: f"'{value}'"}) == []


def test_every_rule_and_default_resources_are_held_not_only_training(tmp_path):
    found = problems_of(tmp_path, default={"mem_mb_per_cpu": "1000;x"},
                        overwrite={"train": dict(SITE), "prepare_data": {"tasks": "2 --x"},
                                   "report_scaling": {"slurm_extra": "--comment=$(id)"}})
    assert [line.split(" must ")[0].split(" '")[0].split(" holds")[0] for line in found] == [
        f"{WHERE}: default-resources mem_mb_per_cpu", f"{WHERE}: set-resources prepare_data tasks",
        f"{WHERE}: set-resources report_scaling slurm_extra"]


@pytest.mark.parametrize("name, value", [("runtime", 0), ("nodes", 0), ("runtime", 2**40)])
def test_a_time_limit_or_node_count_of_zero_or_beyond_slurm_is_refused(tmp_path, name, value):
    found = problems_of(tmp_path, overwrite={"train": {**SITE, name: value}})
    assert len(found) == 1 and f"set-resources train {name} must be a whole number" in found[0], found


def test_literals_of_every_kind_and_snakemake_defaults_pass(tmp_path):
    default = {"slurm_account": "lab_01", "slurm_partition": "a100-80gb", "qos": "'long'", "mem_mb": 8000,
               "runtime": "2h", "cpus_per_task": 2, "constraint": "[rack1|rack2]&gpu*2", "clusters": "a,b",
               "tmpdir": "/scratch/tmp", "gres": "gpu:a100:4", "gpu_model": "a100.80gb", "mem_mb_per_cpu": 4000,
               "slurm_extra": "--gpu-bind=none"}
    assert problems_of(tmp_path, default=default) == []
    # a bare --default-resources: Snakemake's own expressions for mem_mb, disk_mb and tmpdir
    defaults, overwrites = as_snakemake_reads(tmp_path, {}, {"train": dict(SITE)}, bare_default_resources=True)
    assert {"mem_mb", "disk_mb", "tmpdir"} <= set(defaults)
    assert profile.problems(WHERE, defaults, overwrites) == []


def test_snakemakes_expressions_are_accepted_only_as_its_own(tmp_path):
    """mem given as an expression loses its text in Snakemake's renaming to mem_mb: it is read
    from the Resource it wraps, so Python there is refused like anywhere else."""
    found = problems_of(tmp_path, default={"mem": "__import__('os').getpid()"})
    assert len(found) == 1 and "default-resources mem_mb must be a whole number" in found[0], found
    found = problems_of(tmp_path, default={"disk_mb": "max(2*input.size_mb, 2000) if input else 50000"})
    assert len(found) == 1 and "default-resources disk_mb" in found[0], found


@pytest.mark.parametrize("name", ["gilbreth", "gilbreth-training", "raven", "slurm", "local", "tests/slurm/profile"])
def test_every_shipped_profile_is_literal(tmp_path, name):
    import yaml

    folder = ROOT / name if "/" in name else ROOT / "profiles" / name
    written = yaml.safe_load((folder / "config.yaml").read_text())
    defaults, overwrites = as_snakemake_reads(tmp_path, written.get("default-resources") or {},
                                              written.get("set-resources") or {})
    entries = {"default-resources": profile.as_written(defaults)}
    entries.update({f"set-resources {rule}": profile.as_written(v) for rule, v in overwrites.items()})
    assert profile.literal_problems(WHERE, entries) == []


# -- site facts that reach sbatch or a job's time limit

@pytest.mark.parametrize("gpu_type", ["a100:4 --comment=$(id)", "a100;id", "a100-80gb", "", "ａ100"])
def test_a_gpu_type_outside_the_gres_grammar_is_refused_before_any_job(gpu_type):
    with pytest.raises(SiteError, match=r"site_gpu_type .* is not a GRES type: write letters, digits, _ and \."):
        profile.read(None, {"train": {**SITE, "site_gpu_type": gpu_type}})


@pytest.mark.parametrize("signal_s", [65536, 10**9, -1])
def test_a_signal_beyond_sbatch_s_range_is_refused(signal_s):
    with pytest.raises(SiteError, match="site_signal_s must be an integer from 0 to 65535"):
        profile.read(None, {"train": {**SITE, "site_signal_s": signal_s}})


def test_a_signal_at_or_beyond_the_time_limit_is_refused_and_one_below_passes():
    with pytest.raises(SiteError, match=r"site_signal_s 7200 s is not below the job's time limit of 7200 s.*"
                                        r"\(train_baseline's runtime is 120 min\)"):
        profile.read(None, {"train": {**SITE, "site_signal_s": 7200}})
    assert profile.read(None, {"train": {**SITE, "site_signal_s": 7199}}).site.signal_s == 7199
    # a local site is never signalled by SLURM
    assert profile.read(None, {"train": {"runtime": 1, "site_signal_s": 120}}).site.is_local
