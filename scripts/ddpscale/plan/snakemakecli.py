"""How a Python interpreter starts the workflow, for the tests and the benchmarks.

The console script beside the interpreter is what README and `make run` use, and it is the
one that must find a user's module at the repository root (`python -m snakemake` puts the
working directory on sys.path and so hides a module the console script would not find).
A GPU node's shared Python, or an image without `make setup`'s venv, has snakemake
importable but no console script beside it: there `python -m snakemake` starts the same
workflow. Pure and torch-free.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path


def snakemake_command() -> list[str] | None:
    """The argv prefix that starts snakemake with this interpreter: the console script beside
    it, else `python -m snakemake` where snakemake is importable, else None."""
    console = Path(sys.executable).parent / "snakemake"
    if console.is_file():
        return [str(console)]
    if importlib.util.find_spec("snakemake") is not None:
        return [sys.executable, "-m", "snakemake"]
    return None


def workflow_python(command: list[str]) -> str:
    """The interpreter the workflow's jobs run with: the console script's shebang (which may
    name python3 where the caller runs python), else the interpreter of `python -m`."""
    if len(command) > 1:
        return command[0]
    first = Path(command[0]).read_text(errors="replace").splitlines()[:1]
    shebang = first[0][2:].strip() if first and first[0].startswith("#!") else ""
    return shebang if shebang and " " not in shebang else sys.executable
