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
import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ddpscale.core.io import read_json_dict, write_json_atomic
from ddpscale.run import usermodule
from ddpscale.run.usermodule import sha256_of

CACHE_DIR = ".snakemake/ddpscale"
TIMEOUT_S = 300


@dataclass
class Pending:
    """Facts on their way: cached ones, or a running contract.py."""
    facts: dict | None
    process: subprocess.Popen | None
    cache: Path
    what: str
    out: Path | None = None  # where the running contract.py writes the facts


def start(python: str, script: str, model_class: str, data_class: str, root: str, versions: dict,
          cli_classes: dict | None = None) -> Pending:
    """cli_classes: a LightningCLI config's optimizer and lr_scheduler (lightningcli.contract_classes)."""
    paths = {key: given["class_path"] for key, given in (cli_classes or {}).items()}
    key = usermodule.cache_key(model_class, data_class, str(Path(root).resolve()), python, versions, paths)
    cache = Path(root) / CACHE_DIR / f"contract-{key}.json"
    what = ", ".join([model_class, *paths.values()]) + f" and {data_class}"
    cached = read_json_dict(cache)
    if cached is not None and usermodule.still_valid(cached, sha256_of):
        return Pending(cached, None, cache, what)
    # The facts come back in a file of their own: whatever the user's modules print while they
    # import cannot corrupt them.
    cache.parent.mkdir(parents=True, exist_ok=True)
    handle, out = tempfile.mkstemp(prefix="contract-", suffix=".out", dir=cache.parent)
    os.close(handle)
    options = [f"--{name.replace('_', '-')}={path}" for name, path in paths.items()]
    process = subprocess.Popen([python, script, "--model-class", model_class, "--data-class", data_class,
                                *options, "--root", root, "--out", out], cwd=root, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
    atexit.register(process.kill)  # a parse stopped by another check does not wait for it
    atexit.register(Path(out).unlink, missing_ok=True)
    return Pending(None, process, cache, what, Path(out))


def finish(pending: Pending) -> dict:
    """The facts; a ValueError with one line when the import process itself failed."""
    if pending.facts is not None:
        return pending.facts
    try:
        _, err = pending.process.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pending.process.kill()
        raise ValueError(f"importing {pending.what} took over {TIMEOUT_S} s (does a module download or wait "
                         "at import?); make importing them quick") from None
    facts = None
    try:
        if pending.process.returncode == 0:
            facts = json.loads(pending.out.read_text())
    except (OSError, ValueError):
        pass  # a module that ended the process at import (os._exit(0)) left no facts
    finally:
        pending.out.unlink(missing_ok=True)
    read = isinstance(facts, dict)
    if not read:  # the callers catch ValueError: one line for the workflow's message
        lines = [line for line in err.splitlines() if line.strip()]
        raise ValueError(f"importing {pending.what} ended the process (exit {pending.process.returncode}): "
                         f"{lines[-1] if lines else 'no message'}; fix the module")
    if usermodule.cacheable(facts):
        write_json_atomic(pending.cache, facts)
    return facts
