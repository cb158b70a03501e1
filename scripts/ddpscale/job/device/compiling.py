"""torch.compile as a run setting: the same compiled methods in training and in the probe.

Lightning compiles a module's forward and *_step methods in place (`from_compiled`), which
is what it does itself when handed the output of torch.compile; the probe calls
training_step directly, so it needs that form, not the OptimizedModule wrapper.
"""

from __future__ import annotations

import os
import re
import shutil
import sysconfig


def python_include_dir() -> str:
    """Where Triton looks for Python.h: this interpreter's include folder, by its install scheme."""
    scheme = sysconfig.get_default_scheme()
    return sysconfig.get_paths(scheme="posix_prefix" if scheme == "posix_local" else scheme)["include"]


def check_compiler(mode: str, on_cpu: bool, environ=os.environ, which=shutil.which,
                   include_dir: str | None = None) -> None:
    """What torch.compile builds with, present before any group forms: without it the run
    fails at its first compiled step, after the queue and the probe. On CPU, Inductor writes
    C++ kernels (a C++ compiler). On a GPU, Triton builds its kernel launcher as a C extension:
    a C compiler ($CC, else gcc, else clang, as Triton looks) and Python's headers (Python.h)."""
    if mode == "none":
        return
    if on_cpu:
        compiler = environ.get("CXX", "g++")
        if which(compiler) is None:
            raise ValueError(f"compile: {mode} on CPU needs a C++ compiler ({compiler}) and none is on PATH; "
                             "install one (Debian: apt-get install g++) or set compile: none")
        return
    cc = environ.get("CC")
    if (which(cc) if cc else which("gcc") or which("clang")) is None:
        named = f"$CC ({cc})" if cc else "gcc or clang"
        raise ValueError(f"compile: {mode} on a GPU needs a C compiler for Triton's kernel launcher and {named} "
                         "is not on PATH on this node; put one on the jobs' PATH (site_env: PATH=..., or a "
                         "module loaded before snakemake starts), set CC, or set compile: none")
    include_dir = include_dir or python_include_dir()
    if not os.path.isfile(os.path.join(include_dir, "Python.h")):
        raise ValueError(f"compile: {mode} on a GPU needs Python's headers for Triton's kernel launcher and "
                         f"{include_dir}/Python.h is missing on this node; install them (Debian: apt-get "
                         f"install python{sysconfig.get_python_version()}-dev) or use a Python that has them, "
                         "or set compile: none")


def wrap(model, mode: str):
    """The LightningModule with compiled forward and steps, or itself for mode 'none'."""
    if mode == "none":
        return model
    import types

    import torch
    from pytorch_lightning.utilities.compile import from_compiled

    # self.log is bookkeeping, not the model's arithmetic: traced inside a compiled step, each
    # metric name became a guard and each new one a recompilation inside the measured steps
    # (the transformer's val_loss and val_acc: 3 on the first H100 run). Run eagerly instead;
    # bound to the module, so the probe's deep copy logs through its own copy.
    for name in ("log", "log_dict"):
        setattr(model, name, types.MethodType(torch.compiler.disable(getattr(type(model), name)), model))
    return from_compiled(torch.compile(model, mode=mode))


def unwrap(model):
    """The module with its original methods back (FLOPs are counted on eager code)."""
    if getattr(model, "_compiler_ctx", None) is None:
        return model
    from pytorch_lightning.utilities.compile import to_uncompiled

    return to_uncompiled(model)


BY_THE_MODULE = "by the module"


def said(mode: str, module) -> str:
    """The run's compile setting as it was: config `compile`, or where that is none and the
    module compiled parts of itself (torch.compile in configure_model or __init__: a submodule
    that is an OptimizedModule, or a compiled forward), BY_THE_MODULE, so the report does not
    say "none" for compiled code."""
    if mode != "none":
        return mode
    import torch._dynamo

    compiled = any(isinstance(m, torch._dynamo.eval_frame.OptimizedModule) for m in module.modules())
    compiled = compiled or hasattr(getattr(module, "forward", None), "_torchdynamo_orig_callable")
    return BY_THE_MODULE if compiled else "none"


def section(mode: str, module) -> dict:
    """The record's compile section (ddpscale.core.record.SECTIONS): the setting as it was (said),
    and where anything compiled, dynamo's statistics (stats)."""
    compiled = said(mode, module)
    return {"compile": compiled, **(stats() if compiled != "none" else {})}


def stats() -> dict:
    """Graphs dynamo compiled in this process, its graph breaks (each one splits a step into
    separately compiled pieces with Python between them) and its recompilations: a guard that
    failed, usually a new batch shape (a last partial batch, validation), compiles the function
    again inside the measured epochs, and with reduce-overhead records new CUDA graphs too."""
    from torch._dynamo.utils import counters, get_compilation_metrics

    reasons = [m.recompile_reason for m in get_compilation_metrics()
               if getattr(m, "recompile_reason", None)]
    return {"compile_graphs": int(counters["stats"]["unique_graphs"]),
            "compile_graph_breaks": int(sum(counters["graph_break"].values())),
            "compile_recompiles": len(reasons),
            # the first few, e.g. "tensor 'x' size mismatch at index 0. expected 64, actual 16"
            "compile_recompile_reasons": list(dict.fromkeys(reasons))[:3]}


# torch's cudagraph trees say this when a tensor a compiled step returned is read after the next
# replay wrote over it (torch/_inductor/cudagraph_trees.py)
_OVERWRITTEN = "accessing tensor output of CUDAGraphs that has been overwritten by a subsequent run"


def overwritten_output_line(err: BaseException) -> str | None:
    """One line for a run that kept a CUDA-graph output past the next replay (compile:
    reduce-overhead), naming where torch saw it; None for any other error."""
    text = str(err)
    if _OVERWRITTEN not in text:
        return None
    where = re.search(r'File "([^"]+)", line (\d+), in (\w+)', text)
    place = f" ({os.path.basename(where[1])}:{where[2]} in {where[3]})" if where else ""
    return ("compile: reduce-overhead replays CUDA graphs, and the next replay overwrote a tensor that the "
            f"module kept from a compiled step{place}; keep a copy (.clone()) of what it holds across "
            "steps, or set compile: default in the config")


def static_shape_args(mode: str, data_cls_accepts: set[str] | None, user_args: dict) -> dict:
    """What the pipeline sets so that compiled training sees one batch shape: drop_last for a
    data module that takes it (the built-in ones do) and whose config did not choose."""
    if mode == "none" or "drop_last" in user_args:
        return {}
    if data_cls_accepts is None or "drop_last" not in data_cls_accepts:
        return {}  # a module taking **kwargs may pass it on to something that does not know it
    return {"drop_last": True}
