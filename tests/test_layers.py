"""Which code may import what: the workflow parses without torch, the report reads files only.

A dry run imports every module the Snakefile and its rule files name; importing torch there
costs seconds on every snakemake call (and on a login node, minutes), so those modules must
stay free of it, and of everything that imports it. The report and the status command read
records: they need neither torch nor Lightning either. Each check runs in a fresh interpreter,
so what an earlier test imported cannot hide an import.
"""

from __future__ import annotations

import json
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"
HEAVY = ("torch", "pytorch_lightning", "lightning", "lightning_fabric", "torchmetrics")

# `from ddpscale.x import a, b` and `import ddpscale.x`, parenthesised lists included
_FROM = re.compile(r"^\s*from (ddpscale[\w.]*) import \(?([\w, \n]+?)\)?\s*(?:#.*)?$", re.M)
_IMPORT = re.compile(r"^\s*import (ddpscale[\w.]*)", re.M)


def workflow_imports() -> list[str]:
    """The ddpscale modules the Snakefile and the rule files import, names imported from a
    package included where they are modules."""
    names = set()
    for path in [ROOT / "workflow/Snakefile", *sorted((ROOT / "workflow/rules").glob("*.smk"))]:
        text = path.read_text()
        names.update(_IMPORT.findall(text))
        for module, imported in _FROM.findall(text):
            names.add(module)
            names.update(f"{module}.{name.strip()}" for name in imported.replace("\n", " ").split(",")
                         if (SCRIPTS / module.replace(".", "/") / f"{name.strip()}.py").exists())
    return sorted(names)


def package_modules(package: str) -> list[str]:
    path = SCRIPTS / package.replace(".", "/")
    return [package] + [f"{package}.{m.name}" for m in pkgutil.iter_modules([str(path)])]


def heavy_imports(modules: list[str]) -> dict:
    """In a fresh interpreter: import the modules, return which heavy packages got imported."""
    code = ("import importlib, json, sys\n"
            f"for name in {modules!r}:\n"
            "    importlib.import_module(name)\n"
            f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=SCRIPTS, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_the_workflow_names_the_modules_it_imports():
    """The parse below must see what the rule files import, or the next check proves nothing."""
    modules = workflow_imports()
    assert {"ddpscale.configcheck", "ddpscale.layout", "ddpscale.cluster.topology", "ddpscale.measuremode"} <= set(
        modules), modules


def test_what_the_workflow_imports_while_parsing_imports_no_torch():
    modules = workflow_imports()
    assert heavy_imports(modules) == [], (
        "a module the workflow imports while parsing imports torch or Lightning: move that code "
        "into a module the job imports, or import it inside the function that needs it")


@pytest.mark.parametrize("package", ["ddpscale.report"])
def test_the_report_and_the_status_command_import_no_torch(package):
    assert heavy_imports(package_modules(package)) == []


def test_the_check_sees_an_import_of_torch():
    """The check itself can fail: a module that imports torch is caught."""
    assert heavy_imports(["ddpscale.measurement.timing"]) != []
