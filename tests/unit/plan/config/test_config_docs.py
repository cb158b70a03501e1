"""The files a Snakemake workflow catalog entry needs stay true to the code.

config/README.md documents the schema in tables whose first cell is a key's full dotted path;
the schema and the document are compared both ways, so adding a key to one without the other
fails here, and each documented default is the schema's (and config.yaml's where that differs).
"""

from __future__ import annotations

import re

import pytest
import yaml

import ddpscale
from helpers.workflow import ROOT

SCHEMA_PATH = ROOT / "workflow/schemas/config.schema.yaml"
DOC_PATH = ROOT / "config/README.md"
CONFIG_PATH = ROOT / "config/config.yaml"
CATALOG_PATH = ROOT / ".snakemake-workflow-catalog.yml"
CHANGELOG_PATH = ROOT / "CHANGELOG.md"

ROW = re.compile(r"^\| `([^`]+)` \|(.*)$", re.M)
BACKTICKED = re.compile(r"`([^`\n]+)`")
# A dotted path of identifiers, e.g. throughput.max_steps; file names such as report.html or
# scaling.tsv share the shape, so a last part that is a file suffix is not a key.
DOTTED = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$")
FILE_SUFFIXES = {"html", "tsv", "csv", "json", "yaml", "yml", "md", "py", "png", "txt", "log", "smk"}
DEFAULT_IN_CONFIG = re.compile(r"config\.yaml: `([^`]*)`")


def schema_paths(node: dict, prefix: str = "") -> dict[str, dict]:
    """Every key path of a schema object (nested objects' keys too) with its schema node."""
    paths = {}
    for name, child in (node.get("properties") or {}).items():
        path = f"{prefix}{name}"
        paths[path] = child
        paths.update(schema_paths(child, f"{path}."))
    return paths


def free_form(paths: dict[str, dict]) -> set[str]:
    """Objects without declared keys (init_args): any key below them is the user's own."""
    return {path for path, node in paths.items()
            if "object" in as_list(node.get("type")) and "properties" not in node}


def as_list(value) -> list:
    return value if isinstance(value, list) else [value]


def is_schema_key(path: str, paths: dict[str, dict]) -> bool:
    if path in paths:
        return True
    return any(path.startswith(f"{parent}.") for parent in free_form(paths))


def rows(text: str) -> dict[str, list[str]]:
    """Key path -> the cells after it, for every table row that starts with a backticked key."""
    found = {}
    for key, rest in ROW.findall(text):
        found[key] = [cell.strip() for cell in rest.rstrip().rstrip("|").split(" | ")]
    return found


def config_value(config: dict, path: str):
    """(True, value) where config.yaml sets the key path, else (False, None)."""
    tree = config
    for part in path.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return False, None
        tree = tree[part]
    return True, tree


def dotted_keys_in(text: str, top_level: set[str]) -> set[str]:
    """Backticked dotted paths that read as config keys: they start with a top-level key."""
    keys = set()
    for token in BACKTICKED.findall(text):
        token = token.split(":")[0].strip()  # `dataset.generator: none` names dataset.generator
        if not DOTTED.match(token):
            continue
        parts = token.split(".")
        if parts[0] in top_level and parts[-1] not in FILE_SUFFIXES:
            keys.add(token)
    return keys


SCHEMA = yaml.safe_load(SCHEMA_PATH.read_text())
PATHS = schema_paths(SCHEMA)
TOP_LEVEL = set(SCHEMA["properties"])
DOC = DOC_PATH.read_text()
CONFIG = yaml.safe_load(CONFIG_PATH.read_text())


def undocumented(paths: dict[str, dict], doc: str) -> list[str]:
    documented = rows(doc)
    return [path for path in paths if path not in documented]


def unknown_documented(paths: dict[str, dict], doc: str) -> list[str]:
    named = set(rows(doc)) | dotted_keys_in(doc, {path.split(".")[0] for path in paths})
    return sorted(key for key in named if not is_schema_key(key, paths))


def default_mismatches(paths: dict[str, dict], doc: str, config: dict) -> list[str]:
    """Documented defaults that are not the schema's, or config.yaml values that are not its own."""
    problems = []
    for key, cells in rows(doc).items():
        if key not in paths or len(cells) < 2:
            continue
        node, default_cell = paths[key], cells[1]
        shown = BACKTICKED.search(default_cell)
        if "default" in node:
            if not shown:
                problems.append(f"{key}: the Default cell shows no backticked value; the schema's is "
                                f"{node['default']!r}")
            elif yaml.safe_load(shown.group(1)) != node["default"]:
                problems.append(f"{key}: documented default `{shown.group(1)}`, but the schema's is "
                                f"{node['default']!r}")
        if "properties" in node:
            continue  # an object with its own keys: each of them is compared on its own row
        sets, value = config_value(config, key)
        said = DEFAULT_IN_CONFIG.search(default_cell)
        if said and (not sets or yaml.safe_load(said.group(1)) != value):
            problems.append(f"{key}: documented config.yaml value `{said.group(1)}`, but config/config.yaml "
                            + (f"sets {value!r}" if sets else "does not set it"))
        if not said and sets and value != node.get("default"):
            problems.append(f"{key}: config/config.yaml sets {value!r}, not the schema's default "
                            f"{node.get('default')!r}; add 'config.yaml: `...`' to its Default cell")
    return problems


def test_every_schema_key_has_a_row_in_config_readme():
    missing = undocumented(PATHS, DOC)
    assert not missing, (f"{DOC_PATH.relative_to(ROOT)} has no table row for these keys of "
                         f"{SCHEMA_PATH.relative_to(ROOT)}: {', '.join(missing)}; add a row "
                         "'| `key.path` | type | default | allowed | what it does |' in its section")


def test_every_key_config_readme_names_is_in_the_schema():
    unknown = unknown_documented(PATHS, DOC)
    assert not unknown, (f"{DOC_PATH.relative_to(ROOT)} names keys that "
                         f"{SCHEMA_PATH.relative_to(ROOT)} does not have: {', '.join(unknown)}")


def test_config_readme_gives_the_schema_defaults_and_config_yaml_values():
    problems = default_mismatches(PATHS, DOC, CONFIG)
    assert not problems, f"{DOC_PATH.relative_to(ROOT)}:\n" + "\n".join(problems)


def test_config_readme_names_every_shipped_config():
    missing = [path.relative_to(ROOT).as_posix() for path in sorted((ROOT / "config").glob("*.yaml"))
               if path.relative_to(ROOT).as_posix() not in DOC]
    assert not missing, f"{DOC_PATH.relative_to(ROOT)} does not mention {', '.join(missing)}"


def test_the_config_doc_checks_can_fail():
    """Each direction catches drift: a key without a row, a row without a key, a wrong default."""
    # Compared with what the document already reports, so this test names only the check itself.
    without_row = re.sub(r"^\| `throughput\.max_steps` \|.*\n", "", DOC, flags=re.M)
    assert set(undocumented(PATHS, without_row)) - set(undocumented(PATHS, DOC)) == {"throughput.max_steps"}
    known = set(unknown_documented(PATHS, DOC))
    extra = DOC + "\nSee `throughput.max_step` and `data.init_args.anything` and `report.html`.\n"
    assert set(unknown_documented(PATHS, extra)) - known == {"throughput.max_step"}
    extra_row = DOC + "\n| `ddp.bucket_size` | number | `1` | any | made up |\n"
    assert set(unknown_documented(PATHS, extra_row)) - known == {"ddp.bucket_size"}
    mismatched = set(default_mismatches(PATHS, DOC, CONFIG))
    wrong = DOC.replace("| `seed` | integer | `42` |", "| `seed` | integer | `43` |")
    assert set(default_mismatches(PATHS, wrong, CONFIG)) - mismatched == {
        "seed: documented default `43`, but the schema's is 42"}
    changed = dict(CONFIG, max_epochs=7)
    assert set(default_mismatches(PATHS, DOC, changed)) - mismatched == {
        "max_epochs: documented config.yaml value `3`, but config/config.yaml sets 7"}


def test_catalog_file_has_what_the_catalog_reads():
    assert CATALOG_PATH.is_file(), f"{CATALOG_PATH.name} is missing from the repository root"
    settings = yaml.safe_load(CATALOG_PATH.read_text())
    assert isinstance(settings, dict) and isinstance(settings.get("usage"), dict), (
        f"{CATALOG_PATH.name}: needs a top-level 'usage' mapping, has {settings!r}")
    usage = settings["usage"]
    missing = [key for key in ("mandatory-flags", "software-stack-deployment") if key not in usage]
    assert not missing, f"{CATALOG_PATH.name}: usage lacks {', '.join(missing)}"
    flags = usage["mandatory-flags"]
    assert isinstance(flags, dict) and flags.get("desc") and flags.get("flags"), (
        f"{CATALOG_PATH.name}: usage.mandatory-flags needs a non-empty desc and flags, has {flags!r}")
    deployment = usage["software-stack-deployment"]
    assert isinstance(deployment, dict) and all(isinstance(v, bool) for v in deployment.values()), (
        f"{CATALOG_PATH.name}: usage.software-stack-deployment must map each method to true or false, "
        f"has {deployment!r}")


def test_license_exists():
    license_path = ROOT / "LICENSE"
    assert license_path.is_file() and license_path.read_text().strip(), "LICENSE is missing or empty"


def newest_release(changelog: str) -> str | None:
    """The first '## [x.y.z]' heading: Keep a Changelog lists the newest release first."""
    match = re.search(r"^## \[(\d+\.\d+\.\d+[^\]]*)\]", changelog, re.M)
    return match.group(1) if match else None


def test_changelog_newest_release_is_the_package_version():
    assert CHANGELOG_PATH.is_file(), "CHANGELOG.md is missing from the repository root"
    newest = newest_release(CHANGELOG_PATH.read_text())
    assert newest == ddpscale.__version__, (
        f"CHANGELOG.md's newest release heading is {newest!r}, but scripts/ddpscale/__init__.py's "
        f"__version__ is {ddpscale.__version__!r}; add a '## [{ddpscale.__version__}] - YYYY-MM-DD' section")


@pytest.mark.parametrize("text,expected", [
    ("## [Unreleased]\n\n## [0.2.0] - 2027-01-01\n## [0.1.0] - 2026-11-27\n", "0.2.0"),
    ("## [Unreleased]\n", None),
])
def test_the_changelog_reader_finds_the_newest_release(text, expected):
    assert newest_release(text) == expected
