"""Every YAML snippet of README.md and docs/*.md is what it says it is: a config overlay passes
the schema and the checks across keys (merged onto config/config.yaml as the workflow merges
it), a profile's set-resources passes the site-fact checks, a LightningCLI config passes its
reader. Each snippet names its file in its first line, so a reader knows where it goes and this
test knows how to check it."""

from __future__ import annotations

import copy
import re

import pytest
import yaml
from snakemake.utils import validate

from helpers.workflow import ROOT
from ddpscale.plan.site.profile import resource_problems
from ddpscale.plan.site.resources import SiteError, check_stage_entry, site_from_resources
from ddpscale.run.topology import TopologyError, check_topologies
from ddpscale.plan.config.check import schema_problems, setting_problems
from ddpscale.plan.config.source import own_init_args
from ddpscale.status.rows import merge_configs
from ddpscale.run import lightningcli

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SCHEMA_PATH = ROOT / "workflow/schemas/config.schema.yaml"
SCHEMA = yaml.safe_load(SCHEMA_PATH.read_text())
BASE = yaml.safe_load((ROOT / "config/config.yaml").read_text())
FENCE = re.compile(r"^```yaml\n(.*?)^```", re.M | re.S)


def snippets() -> list[tuple[str, str]]:
    found = []
    for path in DOCS:
        for n, match in enumerate(FENCE.finditer(path.read_text())):
            found.append((f"{path.relative_to(ROOT)}#{n + 1}", match.group(1)))
    return found


def kind(text: str) -> str | None:
    """What a snippet's first line says it is."""
    first = text.splitlines()[0] if text.strip() else ""
    if not first.startswith("#"):
        return None
    if "profiles/" in first:
        return "profile"
    if "LightningCLI" in first:
        return "lightningcli"
    if "--configfile" in first or "config/" in first:
        return "config"
    return None


def with_defaults(config: dict) -> dict:
    config = copy.deepcopy(config)
    validate(config, str(SCHEMA_PATH))
    return config


def config_problems(overlay: dict) -> list[str]:
    """An overlay as the workflow sees it: merged onto config/config.yaml, then checked."""
    config = merge_configs(copy.deepcopy(BASE), [overlay])
    own_init_args(config, overlay)
    problems = schema_problems(config, SCHEMA, "snippet")
    if problems:
        return problems
    config = with_defaults(config)
    try:
        topologies = check_topologies(config["topologies"], config["baseline"], 8, config["batch"]["scaling"],
                                      config["batch"]["size"])
    except TopologyError as err:
        return [str(err)]
    return setting_problems(config, topologies, "snippet")


def profile_problems(profile: dict) -> list[str]:
    entries = (profile or {}).get("set-resources") or {}
    named = [line for rule, entry in entries.items()
             for line in resource_problems("snippet", f"set-resources {rule}", entry)]
    if named:
        return named
    try:
        for rule, entry in entries.items():
            if rule == "train":
                site_from_resources(entry)
            else:
                check_stage_entry(rule, entry)
    except SiteError as err:
        return [str(err)]
    return []


def lightningcli_problems(cli: dict) -> list[str]:
    return lightningcli.apply(cli, with_defaults(BASE), "cli.yaml", lambda key: True).problems


CHECKS = {"config": config_problems, "profile": profile_problems, "lightningcli": lightningcli_problems}


def test_the_docs_have_snippets_of_every_kind():
    kinds = {kind(text) for _, text in snippets()}
    assert {"config", "profile", "lightningcli"} <= kinds, kinds


@pytest.mark.parametrize("where,text", snippets(), ids=[where for where, _ in snippets()])
def test_every_yaml_snippet_is_valid_as_what_it_says_it_is(where, text):
    what = kind(text)
    assert what, (f"{where}: its first line must say which file it is (# my.yaml ... --configfile, "
                  f"# profiles/<site>/config.yaml, # cli.yaml: a LightningCLI config): {text.splitlines()[0]!r}")
    assert CHECKS[what](yaml.safe_load(text)) == [], where


def test_the_checks_can_fail():
    assert config_problems({"max_epoch": 3}), "a misspelt key"
    assert config_problems({"warmup_epochs": 9, "max_epochs": 3}), "keys that do not fit together"
    assert config_problems({"topologies": ["1x1", "1x16"]}), "a topology beyond the node"
    assert profile_problems({"set-resources": {"train_baseline": {"site_launcher": "srun"}}}), "a site fact per stage"
    assert profile_problems({"set-resources": {"train_multi_node": {"slurm_qos": "long"}}}), "a name the plugin drops"
    assert lightningcli_problems({"trainer": {"max_steps": 10}}), "a setting ddpscale cannot measure under"
    assert kind("slurm_account: x\n") is None, "a snippet that does not say what it is"


LINK = re.compile(r"\]\(([^)\s]+)\)")


def heading_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def broken_links(path) -> list[str]:
    """Relative links of one Markdown file whose file, or heading anchor, does not exist."""
    broken = []
    for target in LINK.findall(path.read_text()):
        if re.match(r"[a-z]+:", target):
            continue  # a web address: not checked offline
        file, _, anchor = target.partition("#")
        linked = (path.parent / file).resolve() if file else path
        if not linked.exists():
            broken.append(target)
        elif anchor and linked.suffix == ".md":
            text = linked.read_text()
            anchors = {heading_anchor(h) for h in re.findall(r"^#+ (.+)$", text, re.M)}
            anchors |= set(re.findall(r'<a id="([^"]+)"', text))  # an anchor placed by hand
            if anchor not in anchors:
                broken.append(target)
    return broken


@pytest.mark.parametrize("path", DOCS, ids=[str(p.relative_to(ROOT)) for p in DOCS])
def test_every_relative_link_leads_somewhere(path):
    assert broken_links(path) == [], f"{path.relative_to(ROOT)}: links to nothing"


def test_the_link_check_can_fail(tmp_path):
    page = tmp_path / "page.md"
    (tmp_path / "other.md").write_text('# Which workload, and GPU or CPU?\n- <a id="probe"></a>**Probe**\n')
    page.write_text("[a](other.md#which-workload-and-gpu-or-cpu) [b](missing.png) [c](other.md#nothing) "
                    "[d](https://example.org/x) [e](other.md#probe)\n")
    assert broken_links(page) == ["missing.png", "other.md#nothing"]
