"""torch.compile as a run setting (ddpscale.job.device.compiling): a missing compiler is named before the
run, the collective timeout is widened while graphs compile, and a kept CUDA-graph output is named
in one line (compiled for real: tests/workflow/test_compiling.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from ddpscale.job.device import compiling
from ddpscale.workloads.models import SpiralMLP


def test_a_missing_cpu_compiler_names_the_fix(monkeypatch):
    monkeypatch.setenv("CXX", "/nonexistent/g++")
    with pytest.raises(ValueError, match=r"needs a C\+\+ compiler \(/nonexistent/g\+\+\).*set compile: none"):
        compiling.check_compiler("default", on_cpu=True)
    compiling.check_compiler("none", on_cpu=True)  # nothing to compile


def test_on_a_gpu_triton_needs_a_c_compiler_and_pythons_headers(tmp_path):
    """Triton builds its launcher with $CC, gcc or clang against Python.h: a GPU node without
    them failed at the first compiled step, after the queue and the probe."""
    headers = tmp_path / "include"
    headers.mkdir()
    (headers / "Python.h").write_text("")
    gcc_only = {"gcc": "/usr/bin/gcc"}.get
    compiling.check_compiler("default", on_cpu=False, environ={}, which=gcc_only, include_dir=str(headers))
    compiling.check_compiler("none", on_cpu=False, environ={}, which=lambda name: None, include_dir="/nowhere")
    with pytest.raises(ValueError, match=r"on a GPU needs a C compiler .* gcc or clang is not on PATH.*compile: none"):
        compiling.check_compiler("max-autotune", on_cpu=False, environ={}, which=lambda name: None,
                                 include_dir=str(headers))
    with pytest.raises(ValueError, match=r"\$CC \(/opt/cc\) is not on PATH"):
        compiling.check_compiler("default", on_cpu=False, environ={"CC": "/opt/cc"}, which=gcc_only,
                                 include_dir=str(headers))
    with pytest.raises(ValueError, match=r"needs Python's headers .*/nowhere/Python.h is missing.*-dev"):
        compiling.check_compiler("default", on_cpu=False, environ={}, which=gcc_only, include_dir="/nowhere")


def test_the_header_check_looks_where_this_python_keeps_them():
    import sysconfig

    assert compiling.python_include_dir() == sysconfig.get_paths()["include"]


def test_compiled_runs_ask_the_data_module_for_one_batch_shape():
    from ddpscale.job.device import compiling

    takes = {"batch_size", "drop_last"}
    assert compiling.static_shape_args("default", takes, {}) == {"drop_last": True}
    assert compiling.static_shape_args("none", takes, {}) == {}
    assert compiling.static_shape_args("default", takes, {"drop_last": False}) == {}  # the user chose
    assert compiling.static_shape_args("default", {"batch_size"}, {}) == {}
    assert compiling.static_shape_args("default", None, {}) == {}  # **kwargs: do not guess


class FakeTrainer:
    sanity_checking = False

    def __init__(self):
        self.current_epoch = 0
        self.state = SimpleNamespace(fn="fit")


@pytest.fixture
def timeouts(monkeypatch) -> list:
    """The process-group timeouts CompileGrace sets, in order, instead of setting them."""
    from ddpscale.job.callbacks import CompileGrace

    seen = []
    monkeypatch.setattr(CompileGrace, "_set", staticmethod(seen.append))
    return seen


def started(mode: str):
    """A CompileGrace (300 s, 1800 s while compiling) at the first epoch's start, and its trainer."""
    from ddpscale.job.callbacks import CompileGrace

    grace, trainer = CompileGrace(mode, timeout_s=300, grace_s=1800), FakeTrainer()
    grace.on_fit_start(trainer, None)
    grace.on_train_epoch_start(trainer, None)
    return grace, trainer


def test_the_compile_wait_ends_once_every_graph_has_run(timeouts):
    grace, trainer = started("max-autotune")
    for step in range(5):  # the first validation is still to compile
        grace.on_train_batch_end(trainer, None, None, None, step)
    assert timeouts == [1800]
    grace.on_validation_end(trainer, None)
    assert timeouts == [1800, 300]
    grace.on_test_start(trainer, None)  # test graphs compile anew
    grace.on_test_end(trainer, None)
    assert timeouts == [1800, 300, 1800, 300]
    # throughput mode's validation after its stop (trainer.validate) may compile eval graphs
    # that the training never ran (check_val_every_n_epoch > 1)
    trainer.state.fn = "validate"
    grace.on_validation_start(trainer, None)
    grace.on_validation_end(trainer, None)
    assert timeouts == [1800, 300, 1800, 300, 1800, 300]


def test_without_validation_the_wait_ends_when_the_second_epoch_starts(timeouts):
    grace, trainer = started("default")
    for step in range(3):
        grace.on_train_batch_end(trainer, None, None, None, step)
    trainer.current_epoch = 1
    grace.on_train_epoch_start(trainer, None)
    assert timeouts == [1800, 300]
    eager, trainer = started("none")
    eager.on_test_start(trainer, None)
    assert timeouts == [1800, 300], "an eager run keeps the collective timeout throughout"


def test_the_spiral_models_evaluation_sums_survive_a_step_output_buffer_being_reused(monkeypatch):
    """What CUDA graphs do to a compiled validation_step's outputs (the first H200 run): the next
    replay writes the same buffer. Emulated on CPU: every stack lands in one buffer."""
    import torch

    model, buffer, real_stack = SpiralMLP(), torch.zeros(3, dtype=torch.float64), torch.stack

    def stack_into_one_buffer(tensors, *args, **kwargs):
        return buffer.copy_(real_stack(tensors, *args, **kwargs))

    monkeypatch.setattr(torch, "stack", stack_into_one_buffer)
    batches = [(torch.randn(n, 2), torch.randint(0, 2, (n,))) for n in (8, 5, 3)]
    for batch in batches:
        model._evaluate(batch, "val")
    buffer.zero_()
    assert model._sums["val"][2].item() == 16.0  # every sample once, not the last batch thrice


def test_a_kept_cuda_graph_output_is_named_in_one_line():
    # torch's own text, as the first H200 run printed it
    err = RuntimeError(
        "Error: accessing tensor output of CUDAGraphs that has been overwritten by a subsequent run. Stack trace: "
        'File "/work/main/scripts/ddpscale/workloads/models.py", line 54, in validation_step\n'
        '    self._evaluate(batch, "val")\n. To prevent overwriting, clone the tensor outside of torch.compile() '
        "or call torch.compiler.cudagraph_mark_step_begin() before each model invocation.")
    line = compiling.overwritten_output_line(err)
    assert line.startswith("compile: reduce-overhead replays CUDA graphs") and "\n" not in line
    assert "(models.py:54 in validation_step)" in line and line.endswith("set compile: default in the config")
    assert compiling.overwritten_output_line(RuntimeError("CUDA out of memory")) is None
