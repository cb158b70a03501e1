"""The modules of scripts/ddpscale import each other without a circle: a circle forces an
import inside a function to break it (plots.py and plots_time.py had one) and leaves the
order modules may load in to chance."""

from __future__ import annotations

import ast

from conftest import ROOT

PACKAGE = ROOT / "scripts/ddpscale"


def module_name(path) -> str:
    """ddpscale/report/plots.py -> report.plots (the name below the package)."""
    return ".".join(path.relative_to(PACKAGE).with_suffix("").parts)


def imported_modules(path) -> set[str]:
    """The ddpscale modules a file imports anywhere, function bodies included, named as
    module_name names them; `from ddpscale.report import plots` names report.plots."""
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
    assert "report.figure" in graph["report.plots_time"] and "report.plots" not in graph["report.plots_time"]
    assert circles(graph) == []


def test_modules_live_in_their_stage():
    """A newcomer finds each stage in one hop: only shared helpers sit at the package's top."""
    top = sorted(path.stem for path in PACKAGE.glob("*.py"))
    assert top == ["__init__", "configcheck", "configsource", "io", "layout", "measuremode", "snakemakecli", "stats"]
    stages = sorted(path.parent.name for path in PACKAGE.glob("*/__init__.py"))
    assert stages == ["cluster", "measurement", "report", "training", "workloads"]


def test_measurement_does_not_import_training():
    """measurement/ measures what its caller in training/ hands it (a module copy, batches,
    optimizers): a measurement module that imported training/ would tie the two into a circle
    and let measuring code build what it measures (the probe did, on modules without a trainer)."""
    reaching = {module_name(path): sorted(m for m in imported_modules(path) if m.split(".")[0] == "training")
                for path in (PACKAGE / "measurement").glob("*.py")}
    assert {name: found for name, found in reaching.items() if found} == {}
