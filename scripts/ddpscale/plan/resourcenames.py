"""The resource names a profile may set, and the values it must not submit as they are.

Snakemake passes any resource name on without a word and the SLURM plugin reads only the names
it knows, so a name it does not know is dropped silently: `slurm_qos: long` submits under the
default QOS, and the job is refused or runs where the user did not mean it. A placeholder the
user was to replace (`slurm_account: my_account`) is submitted as is. Both are refused while
the workflow is parsed, before any sbatch, naming the profile's file, the entry and the fix.
Pure: unit-tested without snakemake.
"""

from __future__ import annotations

import difflib
import re

from ddpscale.plan.resources import SITE_PREFIX

# Snakemake's own resources (snakemake.resources), used by any executor.
SNAKEMAKE = {"mem", "mem_mb", "mem_mib", "disk", "disk_mb", "disk_mib", "runtime", "tmpdir", "threads",
             "_cores", "_nodes"}
# The names snakemake-executor-plugin-slurm 2.8.0 reads from a job's resources (its
# submit_string.py, partitions.py and __init__.py).
PLUGIN = {"slurm_account", "slurm_partition", "slurm_cluster", "cluster", "clusters", "constraint", "qos",
          "mem_mb_per_cpu", "nodes", "tasks", "tasks_per_node", "tasks_per_gpu", "cpus_per_task",
          "cpus_per_gpu", "gpu", "gpu_model", "gres", "mpi", "slurm_extra"}
KNOWN = SNAKEMAKE | PLUGIN
# Names users bring from sbatch, from older Snakemake SLURM profiles or from this project's
# own earlier README (slurm_qos), with the plugin's name for each.
SAID_OTHERWISE = {"slurm_qos": "qos", "slurm_constraint": "constraint", "partition": "slurm_partition",
                  "account": "slurm_account", "time": "runtime", "time_min": "runtime", "walltime": "runtime",
                  "mem_per_cpu": "mem_mb_per_cpu", "ntasks": "tasks", "ntasks_per_node": "tasks_per_node",
                  "gpus": "gpu", "qos_name": "qos"}
# Values shipped in the profiles for the user to replace.
PLACEHOLDERS = {"slurm_account": {"my_account"}}


def suggestion(name: str) -> str:
    if name in SAID_OTHERWISE:
        return f"the SLURM plugin's name for it is {SAID_OTHERWISE[name]}"
    close = difflib.get_close_matches(name, sorted(KNOWN), n=1)
    return f"did you mean {close[0]}?" if close else "known: " + ", ".join(sorted(PLUGIN))


def resource_problems(where: str, entry: str, resources: dict) -> list[str]:
    """One line per name the plugin would drop and per placeholder value, for one profile entry
    (`default-resources`, or `set-resources <rule>`) of the profile file `where`. Site facts
    (site_*) are checked with the site (ddpscale.plan.resources)."""
    problems = []
    for name, value in resources.items():
        if name.startswith(SITE_PREFIX):
            continue
        if name not in KNOWN:
            problems.append(f"{where}: {entry} sets '{name}', which the SLURM plugin does not read and "
                            f"drops without a word; {suggestion(name)}")
        elif str(value).strip() in PLACEHOLDERS.get(name, ()):
            problems.append(f"{where}: {entry} {name} is still the placeholder {value!r}; set your own "
                            f"(the accounts you may charge: sacctmgr show associations user=$USER format=account)")
    return problems


# The plugin's resource (or ddpscale's site fact) for each sbatch option its validation.py refuses
# inside slurm_extra, keyed by the name it gives the option there.
RESOURCE_FOR_OPTION = {"node constraints": "constraint", "quality of service": "qos", "account": "slurm_account",
                       "partition": "slurm_partition", "runtime/time limit": "runtime", "memory": "mem_mb",
                       "memory per CPU": "mem_mb_per_cpu", "cluster specification": "clusters",
                       "generic resources (GRES)": "site_gpu_type (ddpscale computes --gres per topology)",
                       "GPU allocation": "site_gpus_per_node (ddpscale computes --gres per topology)",
                       "CPUs per task": "site_cpus_per_gpu", "number of tasks": "the topology",
                       "number of nodes": "the topology"}


def slurm_extra_problems(where: str, entry: str, flags: str, forbidden: dict[str, str]) -> list[str]:
    """One line per sbatch option in a profile's site_slurm_extra that the plugin refuses there
    (`forbidden`: its validation.get_forbidden_slurm_options(), pattern -> option name). The
    plugin says so only when it submits the job, after the jobs before it ran."""
    problems = []
    for pattern, option in forbidden.items():
        if re.search(pattern, flags):
            fix = RESOURCE_FOR_OPTION.get(option, "the plugin's resource for it")
            problems.append(f"{where}: {entry} {SITE_PREFIX}slurm_extra {flags!r} sets the {option}, which the "
                            f"SLURM plugin refuses inside slurm_extra; set it with {fix} instead")
    return problems


def profile_file(argv: list[str], env: dict) -> str:
    """The profile's file as the user named the profile (--profile, else SNAKEMAKE_PROFILE), for
    messages; Snakemake keeps no record of it."""
    for i, arg in enumerate(argv):
        if arg == "--profile" and i + 1 < len(argv):
            return f"{argv[i + 1].rstrip('/')}/config.yaml"
        if arg.startswith("--profile="):
            return f"{arg.split('=', 1)[1].rstrip('/')}/config.yaml"
    if env.get("SNAKEMAKE_PROFILE"):
        return f"{env['SNAKEMAKE_PROFILE'].rstrip('/')}/config.yaml"
    return "the profile"
