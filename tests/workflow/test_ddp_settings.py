"""Config ddp: DistributedDataParallel's settings, from the flag to the Trainer, the probe and the
record (ddpscale.run.ddpsettings); the config's own refusals are in tests/test_configcheck.py."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from helpers.configs import rule
from helpers.training import run_user_module, throughput
from helpers.workflow import ROOT
from ddpscale.run import ddpsettings
from ddpscale.job.probe import allreduce
from ddpscale.job import build
from ddpscale.run.runspec import RunSpec

SET = {"find_unused_parameters": True, "static_graph": False, "gradient_as_bucket_view": True,
       "bucket_cap_mb": 50, "comm_hook": "fp16_compress"}


def flags(nodes: int, devices: int, ddp: dict | None = None):
    return RunSpec(topology=f"{nodes}x{devices}", num_nodes=nodes, devices_per_node=devices, accelerator="cpu",
                   throughput=rule(),
                   scaling="weak", batch_size=8, model_class="m.M", data_class="d.D", max_epochs=1,
                   **({"ddp": ddp} if ddp is not None else {}))


# -- pure ---------------------------------------------------------------------------------

def test_the_flag_says_every_key_and_reads_back_as_the_block():
    assert ddpsettings.parse(ddpsettings.flag({"static_graph": True})) == {**ddpsettings.DEFAULTS, "static_graph": True}
    assert json.loads(ddpsettings.flag({})) == ddpsettings.DEFAULTS
    assert ddpsettings.strategy_kwargs(ddpsettings.complete({})) == {
        "find_unused_parameters": False, "static_graph": False, "gradient_as_bucket_view": False}
    assert ddpsettings.strategy_kwargs(SET)["bucket_cap_mb"] == 50


@pytest.mark.parametrize("text, expected", [
    ('{"bucket_cap_mb": NaN}', "ddp.bucket_cap_mb is nan but must be a number of MiB above 0 and at most 4096"),
    ('{"bucket_cap_mb": Infinity}', "ddp.bucket_cap_mb is inf"),
    ('{"bucket_cap_mb": -5}', "ddp.bucket_cap_mb is -5"),
    ('{"bucket_cap_mb": 1e12}', "ddp.bucket_cap_mb is 1000000000000.0"),
    ('{"bucket_cap_mb": true}', "ddp.bucket_cap_mb is True"),
    ('{"static_graph": "true; reboot"}', "ddp.static_graph is 'true; reboot' but must be true or false"),
    ('{"comm_hook": "os.system"}', "ddp.comm_hook is 'os.system' but must be one of: none, fp16_compress"),
    ('{"comm_hook": "$(id)"}', "ddp.comm_hook is '$(id)'"),
    ('{"timeout": 5}', "unknown key 'timeout' in ddp"),
    ('[1]', "ddp is [1]; give its keys"),
    ("{oops", "--ddp is not JSON"),
])
def test_a_hostile_flag_is_refused_in_one_line_before_anything_trains(text, expected):
    with pytest.raises(ValueError) as err:
        ddpsettings.parse(text)
    assert expected in str(err.value) and "\n" not in str(err.value)


def test_train_py_refuses_a_hostile_flag_in_one_line_naming_the_config_key():
    """Before torch is imported for training: argparse exits with its one line."""
    done = subprocess.run([sys.executable, str(ROOT / "scripts/train.py"), "--topology", "1x2", "--num-nodes", "1",
                           "--devices-per-node", "2",
                           *throughput(), "--scaling", "weak", "--batch-size", "8", "--model-class", "m.M",
                           "--data-class", "d.D", "--max-epochs", "2", "--ckpt-dir", "x", "--metrics", "x.json",
                           "--ddp", '{"bucket_cap_mb": NaN}'],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 2
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("train.py: error: argument --ddp: ddp.bucket_cap_mb is nan") and "config ddp:" in last


def test_the_record_says_whether_ddp_ran_and_at_what_width_the_gradient_went():
    assert ddpsettings.record(SET, 1) == {**SET, "used": False, "comm_bytes_per_element": 2}
    assert ddpsettings.record(ddpsettings.complete({}), 4)["used"] is True
    assert ddpsettings.said(SET) == ("find_unused_parameters true, gradient_as_bucket_view true, bucket_cap_mb 50, "
                                     "comm_hook fp16_compress")


def test_a_16_bit_hook_halves_the_comm_model_s_bytes():
    buckets = allreduce.ddp_buckets(100 * allreduce.MIB, 50)
    assert buckets == [50 * allreduce.MIB, 50 * allreduce.MIB]
    assert allreduce.on_the_wire(buckets, None) == (buckets, None)
    sent, dtype = allreduce.on_the_wire(buckets, ddpsettings.HOOK_BYTES["bf16_compress"])
    assert sent == [25 * allreduce.MIB, 25 * allreduce.MIB] and dtype == "float16"


def test_torch_s_unused_parameter_error_becomes_one_line_naming_the_key():
    torch_says = ("Expected to have finished reduction in the prior iteration before starting a new one. This "
                  "error indicates that your module has parameters that were not used in producing loss. ...\n"
                  "Parameter indices which did not receive grad for rank 1: 8 9\n In addition, ...")
    line = ddpsettings.unused_parameters_line(RuntimeError(torch_says))
    assert line.startswith("DDP got no gradient for some of the module's parameters: a training step did not use "
                           "them (Parameter indices which did not receive grad for rank 1: 8 9); set "
                           "ddp.find_unused_parameters: true in your config") and "\n" not in line
    static = ddpsettings.unused_parameters_line(RuntimeError(
        "Expected to have finished reduction ... this is not compatible with static_graph set to True."))
    assert static.endswith("set ddp.static_graph: false in your config")
    assert ddpsettings.unused_parameters_line(RuntimeError("CUDA out of memory")) is None
    # Lightning's DDPStrategy replaces torch's text with its own (pytorch_lightning 2.6, on_exception)
    lightning_says = ddpsettings.unused_parameters_line(RuntimeError(
        "It looks like your LightningModule has parameters that were not used in producing the loss returned by "
        "training_step. If this is intentional, ..."))
    assert "a training step did not use them; set ddp.find_unused_parameters: true" in lightning_says


def test_the_probe_s_counted_all_reduce_goes_through_the_run_s_hook():
    from ddpscale.job.probe import step as step_probe

    seen = []
    state = step_probe._Calls()
    state.hook = lambda group, bucket: seen.append(bucket) or "compressed"
    assert step_probe.counting_allreduce(state, "bucket") == "compressed"
    assert seen == ["bucket"] and state.calls == 1


# -- the Trainer ---------------------------------------------------------------------------

def test_the_trainer_s_ddp_gets_the_settings_and_the_probe_sees_them():
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    from ddpscale.job.probe import inrun

    strategy = build.build_trainer(flags(1, 2, SET), []).strategy
    assert strategy._ddp_kwargs == {"find_unused_parameters": True, "static_graph": False,
                                    "gradient_as_bucket_view": True, "bucket_cap_mb": 50}
    assert strategy._ddp_comm_hook is default_hooks.fp16_compress_hook
    assert strategy._timeout.total_seconds() == 300
    assert inrun.bucket_cap_mb(strategy) == 50
    assert inrun.comm_bytes_per_element(flags(1, 2, SET)) == 2
    plain = build.build_trainer(flags(1, 2), []).strategy
    assert inrun.bucket_cap_mb(plain) is None and plain._ddp_comm_hook is None
    assert plain._ddp_kwargs == {"find_unused_parameters": False, "static_graph": False,
                                 "gradient_as_bucket_view": False}


def test_one_device_trains_without_ddp_whatever_the_settings():
    from pytorch_lightning.strategies import DDPStrategy

    assert not isinstance(build.build_trainer(flags(1, 1, SET), []).strategy, DDPStrategy)


# -- real training on 1x2 (CPU, gloo) -------------------------------------------------------

UNUSED = '''
import torch
from ddpscale.workloads.models import SpiralMLP


class WithUnusedHead(SpiralMLP):
    """A second head training_step never uses, as a GAN's or a conditional branch's parameters."""

    def __init__(self):
        super().__init__()
        self.unused_head = torch.nn.Linear(2, 2)
'''


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_module_with_an_unused_parameter_needs_find_unused_parameters(tmp_path, data_file):
    (tmp_path / "on").mkdir()
    found = run_user_module(tmp_path / "on", UNUSED, "unusedmod.WithUnusedHead", data_file, "--max-epochs", "2",
                            "--warmup-epochs", "1", "--ddp", json.dumps({"find_unused_parameters": True}),
                            "--probe", devices=2, timeout=200)
    assert found.returncode == 0, found.stderr[-3000:]
    record = json.loads((tmp_path / "on" / "metrics.json").read_text())
    assert record["ddp"] == {**ddpsettings.DEFAULTS, "find_unused_parameters": True, "used": True,
                             "comm_bytes_per_element": None}
    assert record["identity"]["settings"]["ddp"]["find_unused_parameters"] is True
    # the probe's own DDP wrapper got the setting too: without it, its synced steps fail as training's do
    assert record["probe"]["status"] == "ok", record["probe"]
    (tmp_path / "off").mkdir()
    refused = run_user_module(tmp_path / "off", UNUSED, "unusedmod.WithUnusedHead", data_file, "--max-epochs", "2",
                              "--warmup-epochs", "1", devices=2, timeout=200)
    assert refused.returncode == 3, refused.stderr[-3000:]
    assert ("ddpscale train: DDP got no gradient for some of the module's parameters: a training step did not use "
            "them; set ddp.find_unused_parameters: true") in refused.stderr
    assert "ddpscale launch: rank 0 exited with code 3" in refused.stderr  # ddpscale's line, not a traceback
