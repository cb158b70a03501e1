"""The shipped profiles as tests use them: a profile's config, a copy with its placeholder
account filled in, the site it describes, and the workflow's dry run on it with the training
jobs it plans."""

from __future__ import annotations

import atexit
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import yaml

from helpers.workflow import ROOT, SNAKEMAKE


def load_profile(name: str) -> dict:
    """A profile's config.yaml: a name under profiles/, or a folder relative to the repository."""
    folder = ROOT / name if "/" in name else ROOT / "profiles" / name
    return yaml.safe_load((folder / "config.yaml").read_text())


_PROFILE_COPIES = Path(tempfile.mkdtemp(prefix="ddpscale-profiles-"))
# the copies are read by snakemake subprocesses until the session ends; without this, each
# suite run left a score of folders in /tmp
atexit.register(shutil.rmtree, _PROFILE_COPIES, True)


def with_account(folder: str, account: str) -> str:
    """The profile folder with its placeholder account replaced, as a user edits it before the
    first run: a copy in a temporary folder, or the folder itself when it names no placeholder."""
    from ddpscale.plan.site.profile import PLACEHOLDERS

    profile = yaml.safe_load((ROOT / folder / "config.yaml").read_text())
    defaults = profile.get("default-resources") or {}
    if str(defaults.get("slurm_account")) not in PLACEHOLDERS["slurm_account"]:
        return folder
    defaults["slurm_account"] = account
    copy = Path(tempfile.mkdtemp(dir=_PROFILE_COPIES)) / Path(folder).name
    copy.mkdir()
    (copy / "config.yaml").write_text(yaml.safe_dump(profile, sort_keys=False))
    return str(copy)


def profile_site(name: str):
    from ddpscale.plan.site.resources import site_from_resources

    return site_from_resources(load_profile(name)["set-resources"]["train"])


def dry_run(profile, topologies, *extra, account="test_account", measure="auto"):
    # the console script's interpreter becomes the workflow's PYTHON (WORKFLOW_PYTHON);
    # no visible GPU, so the local profile plans CPU-simulated runs on any machine
    # (tests/unit/run/test_hostdevices.py covers its GPU plans).
    folder = profile if "/" in profile else f"profiles/{profile}"  # a name, or a folder
    if account is not None:  # as a user does before the first run; None: the profile as shipped
        folder = with_account(folder, account)
    cmd = [*SNAKEMAKE, "--profile", folder, "-n", "-p",
           "--forceall", *extra, "--config", f"topologies={json.dumps(topologies)}", "repeats=1", f"measure={measure}"]
    proc = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=120, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    return proc.returncode, proc.stdout


def train_jobs(output, rules=None):
    """{topology: (resources dict, shell command)} of the printed training jobs (any stage);
    `rules`, when given, receives {topology: the rule that trains it}."""
    jobs = {}
    for block in re.split(r"^rule ", output, flags=re.M)[1:]:
        if not block.startswith("train_"):
            continue
        wildcards = dict(kv.split("=", 1) for kv in re.search(r"wildcards: (.*)", block)[1].split(", "))
        resources = dict(kv.split("=", 1) for kv in re.search(r"resources: (.*)", block)[1].split(", "))
        shell = re.search(r"^Shell command: (.*)$", block, flags=re.M)[1]
        assert wildcards["repeat"] == "0"
        jobs[wildcards["topology"]] = (resources, shell)
        if rules is not None:
            rules[wildcards["topology"]] = block.split(":", 1)[0]
    return jobs
