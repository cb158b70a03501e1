"""DDP's own settings (config `ddp:`): what each multi-device run's DistributedDataParallel gets.

One owner from the config to the wrapper: the schema checks the types and ranges, `problems`
what it cannot express (NaN), the workflow passes the block as one JSON flag (`--ddp`), `parse`
checks it again where train.py reads it (a hand-run train.py gets the same refusal), and
`strategy_kwargs` is what DDPStrategy gets. A communication hook is named from a fixed list,
never imported from a path the config gives: a config must not run code of its choosing.

Torch-free: the workflow imports this module while it parses (config.check, lightningcli).
"""

from __future__ import annotations

import ast
import importlib.util
import json
import math
import re
from pathlib import Path

# torch.nn.parallel.DistributedDataParallel's defaults (torch 2.13), so a config that says
# nothing trains as DDP does out of the box; bucket_cap_mb None is torch's own 25 MiB
DEFAULTS = {"find_unused_parameters": False, "static_graph": False, "gradient_as_bucket_view": False,
            "bucket_cap_mb": None, "comm_hook": "none"}
FLAGS = ("find_unused_parameters", "static_graph", "gradient_as_bucket_view")
# the hooks a config may name: torch.distributed.algorithms.ddp_comm_hooks.default_hooks.<name>_hook
COMM_HOOKS = ("none", "fp16_compress", "bf16_compress")
# the width each hook sends a gradient at, in bytes per element (None: the gradient's own)
HOOK_BYTES = {"none": None, "fp16_compress": 2, "bf16_compress": 2}
HOOK_MODULE = "torch.distributed.algorithms.ddp_comm_hooks.default_hooks"
# a LightningCLI config names a hook by its import path (DDPStrategy's ddp_comm_hook): only these
HOOK_PATHS = {f"{HOOK_MODULE}.{name}_hook": name for name in COMM_HOOKS if name != "none"}
# schema's bound: beyond 4 GiB a bucket is no bucket at all (one all-reduce of every gradient)
MAX_BUCKET_CAP_MB = 4096


def problems(ddp, where: str, key: str = "ddp") -> list[str]:
    """What the schema lets through and DDP must not get, one line each: the schema accepts NaN
    as a number within its bounds (every comparison with NaN is false)."""
    if not isinstance(ddp, dict):
        return [f"{where}: {key} is {ddp!r}; give its keys ({', '.join(DEFAULTS)}) indented below it"]
    out = []
    for name in ddp:
        if name not in DEFAULTS:
            out.append(f"{where}: unknown key '{name}' in {key}; the keys allowed there are "
                       f"{', '.join(DEFAULTS)} (a misspelt key is never ignored)")
    for name in FLAGS:
        if name in ddp and not isinstance(ddp[name], bool):
            out.append(f"{where}: {key}.{name} is {ddp[name]!r} but must be true or false; write true or false")
    cap = ddp.get("bucket_cap_mb")
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, (int, float)) or not math.isfinite(cap)
                            or not 0 < cap <= MAX_BUCKET_CAP_MB):
        out.append(f"{where}: {key}.bucket_cap_mb is {cap!r} but must be a number of MiB above 0 and at most "
                   f"{MAX_BUCKET_CAP_MB}; give e.g. 25 (torch's default), or null for torch's default")
    hook = ddp.get("comm_hook", "none")
    if hook not in COMM_HOOKS:
        out.append(f"{where}: {key}.comm_hook is {hook!r} but must be one of: {', '.join(COMM_HOOKS)} "
                   "(only these named hooks; no import path is taken from a config)")
    return out


def complete(ddp: dict | None) -> dict:
    """The block with torch's defaults for what it leaves out."""
    return {**DEFAULTS, **(ddp or {})}


def flag(ddp: dict) -> str:
    """The block as train.py's --ddp flag: every key, sorted, so the command line says all."""
    return json.dumps(complete(ddp), sort_keys=True)


def parse(text: str) -> dict:
    """train.py's --ddp, checked as the workflow checks the config; ValueError in one line."""
    try:
        given = json.loads(text)
    except ValueError as err:
        raise ValueError(f"--ddp is not JSON ({err}); give e.g. {flag({})}") from None
    return checked(given)


def checked(ddp) -> dict:
    """A run's block (train.py's --ddp, a RunSpec's ddp) checked as the workflow checks the
    config, completed with torch's defaults; ValueError in one line naming the config key."""
    found = problems(ddp, "--ddp", "ddp")
    if found:
        raise ValueError(found[0].removeprefix("--ddp: ") + " (in --ddp, which the workflow sets from "
                         "config ddp:)")
    return complete(ddp)


def strategy_kwargs(ddp: dict) -> dict:
    """DDPStrategy's kwargs, as DistributedDataParallel receives them; the hook by its name
    (job.build turns it into torch's function). bucket_cap_mb only when set: DDP gives an unset
    cap a 1 MiB first bucket, a set one none (ddpscale.job.probe.allreduce.ddp_buckets)."""
    out = {name: ddp[name] for name in FLAGS}
    if ddp["bucket_cap_mb"] is not None:
        out["bucket_cap_mb"] = ddp["bucket_cap_mb"]
    return out


def record(ddp: dict, world_size: int) -> dict:
    """The run record's `ddp`: the settings and whether DDP ran at all (one device trains
    without DDP, as a user would, so there they were configured but unused)."""
    return {**ddp, "used": world_size > 1,
            "comm_bytes_per_element": HOOK_BYTES[ddp["comm_hook"]]}


def said(ddp: dict | None) -> str:
    """The report's words: 'torch's defaults', or the settings that differ from them."""
    if not isinstance(ddp, dict):
        return "unknown"
    changed = [f"{k} {str(ddp[k]).lower() if isinstance(ddp[k], bool) else ddp[k]}" for k in DEFAULTS
               if k in ddp and ddp[k] != DEFAULTS[k]]
    return ", ".join(changed) or "torch's defaults"


def torch_built_with_gpu(find_spec=importlib.util.find_spec) -> bool | None:
    """Whether the installed torch was built for CUDA or ROCm (torch.version.cuda / .hip, which
    DDP's bf16_compress hook asks for), read from torch/version.py without importing torch; None
    where it cannot tell (no torch, no such file)."""
    spec = find_spec("torch")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        try:
            tree = ast.parse((Path(folder) / "version.py").read_text())
        except (OSError, SyntaxError, ValueError):
            continue
        built = {}
        for node in tree.body:
            target = node.target if isinstance(node, ast.AnnAssign) else (
                node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None)
            if isinstance(target, ast.Name) and target.id in ("cuda", "hip") and isinstance(node.value, ast.Constant):
                built[target.id] = node.value.value
        if built:
            return any(value is not None for value in built.values())
    return None


def unused_parameters_line(err: BaseException) -> str | None:
    """torch's error for a parameter that got no gradient under DDP (Reducer: "Expected to have
    finished reduction in the prior iteration ..."), as one line with the config key that fixes
    it; None for any other error. Lightning's DDPStrategy.on_exception replaces torch's text with
    its own advice, which names its strategy= arguments, not ddpscale's key; where torch's text
    is left, the indices it lists stay in the line: they say which parameters went unused."""
    text = str(err)
    if ("Expected to have finished reduction" not in text
            and "has parameters that were not used in producing the loss" not in text):
        return None
    unused = re.search(r"Parameter indices which did not receive grad for rank \d+: [\d ]+", text)
    detail = f" ({unused.group(0).strip()})" if unused else ""
    if "static_graph set to True" in text:
        return (f"DDP's static graph changed between steps: a parameter used in one step went unused in "
                f"another{detail}; set ddp.static_graph: false in your config")
    return (f"DDP got no gradient for some of the module's parameters: a training step did not use them"
            f"{detail}; set ddp.find_unused_parameters: true in your config (in a LightningCLI config, "
            "trainer.strategy: ddp_find_unused_parameters_true), or use every parameter in training_step")


class SettingError(RuntimeError):
    """A training step stopped by a DDP setting the module cannot train with: one line, its fix."""


STATIC_GRAPH_ACCUMULATION = ("ddp.static_graph: true cannot start under gradient accumulation (accumulate_grad_batches "
                             "{accumulate}: torch's DDP records its static graph in the first step, which accumulation "
                             "runs under no_sync()); set ddp.static_graph: false or accumulate_grad_batches: 1")


def step_error_line(err: BaseException, ddp: dict, accumulate: int) -> str | None:
    """The config setting behind an error torch's DDP raises in a training step, with its fix,
    or None: training and the probe (whose DDP takes the run's settings) meet the same errors,
    and torch's own text calls some of them bugs of DDP. ddp: the run's DDP settings."""
    line = unused_parameters_line(err)
    if line is not None:
        return line
    text = str(err)
    if "not compatible with static_graph set to True" in text:
        return ("DDP's static graph changed between steps: a parameter used in one step went unused in "
                "another; set ddp.static_graph: false in your config")
    if "expect_autograd_hooks_" in text and ddp.get("static_graph") and accumulate > 1:
        # DDP's static graph records its first iteration, which under no_sync() has no backward to
        # record: torch asserts (Reducer::delay_all_reduce), in training as in the probe
        return STATIC_GRAPH_ACCUMULATION.format(accumulate=accumulate) + " in your config"
    return None
