"""Facts about the user's classes (scripts/contract.py), from a cache or a process of their own.

Importing user code costs torch's import time (seconds): the facts are kept in
.snakemake/ddpscale/ and reused while every module file they were read from is unchanged; on a
miss the import starts in the background as soon as the config is valid, and the workflow
reads it once its own checks are done. Failed imports are not kept: installing a missing
package fixes them without changing a file.
"""

from __future__ import annotations

import atexit
import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ddpscale.core.io import read_json_dict, write_json_atomic
from ddpscale.plan import contract
from ddpscale.plan.plugins import sha256_of

CACHE_DIR = ".snakemake/ddpscale"
TIMEOUT_S = 300


@dataclass
class Pending:
    """Facts on their way: cached ones, or a running contract.py."""
    facts: dict | None
    process: subprocess.Popen | None
    cache: Path
    what: str


def start(python: str, script: str, model_class: str, data_class: str, root: str, versions: dict) -> Pending:
    key = contract.cache_key(model_class, data_class, str(Path(root).resolve()), python, versions)
    cache = Path(root) / CACHE_DIR / f"contract-{key}.json"
    what = f"{model_class} and {data_class}"
    cached = read_json_dict(cache)
    if cached is not None and contract.still_valid(cached, sha256_of):
        return Pending(cached, None, cache, what)
    process = subprocess.Popen([python, script, "--model-class", model_class, "--data-class", data_class,
                                "--root", root], cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    atexit.register(process.kill)  # a parse stopped by another check does not wait for it
    return Pending(None, process, cache, what)


def finish(pending: Pending) -> dict:
    """The facts; a ValueError with one line when the import process itself failed."""
    if pending.facts is not None:
        return pending.facts
    try:
        out, err = pending.process.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pending.process.kill()
        raise ValueError(f"importing {pending.what} took over {TIMEOUT_S} s (does a module download or wait "
                         "at import?); make importing them quick") from None
    try:
        facts = json.loads(out)
    except ValueError:
        lines = [line for line in err.splitlines() if line.strip()]
        raise ValueError(f"importing {pending.what} ended the process (exit {pending.process.returncode}): "
                         f"{lines[-1] if lines else 'no message'}; fix the module") from None
    if contract.cacheable(facts):
        write_json_atomic(pending.cache, facts)
    return facts
