"""The modules of scripts/ddpscale import each other without a circle: a circle forces an
import inside a function to break it (plots.py and plots_time.py had one) and leaves the
order modules may load in to chance."""

from __future__ import annotations

import ast

from conftest import ROOT

PACKAGE = ROOT / "scripts/ddpscale"


def imported_modules(path) -> set[str]:
    """The ddpscale modules a file imports anywhere, function bodies included."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("ddpscale"):
            parts = node.module.split(".")
            if len(parts) > 1:
                found.add(parts[1])
            else:  # from ddpscale import a, b
                found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[1] for a in node.names if a.name.startswith("ddpscale."))
    return found


def import_graph() -> dict[str, set[str]]:
    modules = {path.stem: path for path in PACKAGE.glob("*.py") if path.stem != "__init__"}
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
    assert "figure" in graph["plots_time"] and "plots" not in graph["plots_time"]
    assert circles(graph) == []
