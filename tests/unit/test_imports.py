"""Which code may import what, in scripts/ddpscale.

Packages by when their code runs, with one direction between them (ALLOWED): a newcomer finds
a module by asking when it runs, and nothing low can reach up. The modules import each other
without a circle: a circle forces an import inside a function to break it and leaves the
order modules load in to chance. What the workflow imports while parsing stays free of torch:
a dry run that imported it would cost seconds on every snakemake call (minutes on a busy login
node); the report and the status command read files and need neither torch nor Lightning.
Those checks run in a fresh interpreter, so what an earlier test imported cannot hide an import.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys

import pytest

from helpers.workflow import ROOT

PACKAGE = ROOT / "scripts/ddpscale"
HEAVY = ("torch", "pytorch_lightning", "lightning", "lightning_fabric", "torchmetrics")

# package -> the packages it may import. core: torch-free definitions every stage shares; run:
# the run's shared vocabulary (its settings, identity, topology, DDP settings, the user's modules),
# which the workflow builds and the job reads back; plan: what the workflow imports while it
# parses; job: what runs inside a training job; workloads: the built-in models and data modules,
# made with the job's helpers; report and status read the records the jobs wrote.
ALLOWED = {
    "core": set(),
    "run": {"core"},
    "plan": {"core", "run"},
    "job": {"core", "run"},
    "workloads": {"core", "run", "job"},
    "report": {"core", "run"},
    "status": {"core", "run", "plan"},
}
TORCH_FREE = ("core", "run", "plan", "report", "status")


def module_name(path) -> str:
    """ddpscale/report/render/plots.py -> report.render.plots (the name below the package)."""
    return ".".join(path.relative_to(PACKAGE).with_suffix("").parts)


def imported_modules(path) -> set[str]:
    """The ddpscale modules a file imports anywhere, function bodies included, named as
    module_name names them; `from ddpscale.report.render import plots` names report.render.plots."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("ddpscale"):
            below = node.module.split(".")[1:]
            found.add(".".join(below))
            found.update(".".join([*below, alias.name]) for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".", 1)[1] for a in node.names if a.name.startswith("ddpscale."))
    return found


def import_graph() -> dict[str, set[str]]:
    modules = {module_name(path): path for path in PACKAGE.rglob("*.py") if path.stem != "__init__"}
    return {name: imported_modules(path) & set(modules) - {name} for name, path in modules.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import circle, each as the path that closes it (depth-first search)."""
    found, state = [], {}

    def visit(node, path):
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                found.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return found


def test_circles_are_found():
    assert circles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b", "a"]]
    assert circles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_ddpscale_modules_import_each_other_without_a_circle():
    graph = import_graph()
    assert "report.figures.scaling" in graph["report.render.plots"]
    assert "report.render.plots" not in graph["report.figures.scaling"]
    assert circles(graph) == []


def wrong_arrows(graph: dict[str, set[str]]) -> set[str]:
    """Imports between packages that ALLOWED does not allow, as "module -> module"."""
    return {f"{a} -> {b}" for a, imported in graph.items() for b in imported
            if b.split(".")[0] != a.split(".")[0] and b.split(".")[0] not in ALLOWED.get(a.split(".")[0], set())}


def test_a_wrong_arrow_is_found():
    assert wrong_arrows({"plan.x": {"core.y"}, "core.y": set()}) == set()
    assert wrong_arrows({"plan.x": {"job.y"}, "job.y": {"plan.x"}}) == {"plan.x -> job.y", "job.y -> plan.x"}
    assert wrong_arrows({"run.x": {"plan.y"}, "plan.y": {"run.x"}}) == {"run.x -> plan.y"}
    assert wrong_arrows({"report.x": {"job.y"}}) == {"report.x -> job.y"}


def test_every_module_lives_in_a_package_and_imports_only_downwards():
    assert sorted(path.name for path in PACKAGE.glob("*.py")) == ["__init__.py"], "no module at the top"
    assert sorted(path.parent.name for path in PACKAGE.glob("*/__init__.py")) == sorted(ALLOWED)
    assert wrong_arrows(import_graph()) == set(), (
        "a module imports a package its own may not import (ALLOWED): move the code it needs down "
        "into core or run, or the module up")


# `from ddpscale.x import a, b` and `import ddpscale.x`, parenthesised lists (with comments) included
_FROM = re.compile(r"^\s*from (ddpscale[\w.]*) import (\([^)]*\)|[^\n]*)", re.M)
_COMMENT = re.compile(r"#[^\n]*")
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
            listed = [name.split(" as ")[0].strip() for name in _COMMENT.sub("", imported).strip("() ").split(",")]
            names.update(f"{module}.{name}" for name in listed
                         if name and (PACKAGE.parent / module.replace(".", "/") / f"{name}.py").exists())
    return sorted(names)


def package_modules(package: str) -> list[str]:
    return [f"ddpscale.{package}"] + [f"ddpscale.{module_name(path)}"
                                      for path in sorted((PACKAGE / package).rglob("*.py")) if path.stem != "__init__"]


def heavy_imports(modules: list[str]) -> list[str]:
    """In a fresh interpreter: import the modules, return which heavy packages got imported."""
    code = ("import importlib, json, sys\n"
            f"for name in {modules!r}:\n"
            "    importlib.import_module(name)\n"
            f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=PACKAGE.parent,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_the_workflow_imports_only_torch_free_packages():
    """What the rule files import is read from the files themselves, so a new import is covered."""
    modules = workflow_imports()
    assert {"ddpscale.plan.workflowplan", "ddpscale.core.io"} <= set(modules), modules
    assert {m.split(".")[1] for m in modules if m.count(".") >= 1} <= {"core", "run", "plan"}, modules


@pytest.mark.parametrize("package", TORCH_FREE)
def test_torch_free_packages_import_no_torch(package):
    assert heavy_imports(package_modules(package)) == [], (
        f"a module of ddpscale.{package} imports torch or Lightning: move that code into the job, "
        "or import it inside the function that needs it")


def test_the_check_sees_an_import_of_torch():
    """The check itself can fail: a module that imports torch is caught."""
    assert heavy_imports(["ddpscale.job.measure.timing"]) != []
