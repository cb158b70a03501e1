"""The probe a run's job makes before training: all-reduce bandwidth and where a step's time goes."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.configs import rule
from ddpscale.job.probe.allreduce import message_sizes

from helpers.devices import require_cuda
from helpers.training import launched, throughput
from helpers.workflow import ROOT

# SpiralMLP(hidden=[64, 32, 16]) on 2-D points, 2 classes: weights + biases of 4 layers
SPIRAL_NUMEL = (2 * 64 + 64) + (64 * 32 + 32) + (32 * 16 + 16) + (16 * 2 + 2)


# -- pure ---------------------------------------------------------------------------------

def test_the_probe_takes_the_optimizer_in_every_form_lightning_accepts():
    """The copy's configure_optimizers, parsed as Lightning parses it for training."""
    import pytorch_lightning as pl
    import torch

    from ddpscale.run.usermodule import PluginError
    from ddpscale.job.probe import inrun

    def forms(opt, sched):
        return (opt, [opt], (opt,), ([opt], [sched]), {"optimizer": opt, "lr_scheduler": sched}, [{"optimizer": opt}])

    class MyModule(pl.LightningModule):
        form = None

        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(2, 2)

        def configure_optimizers(self):
            if self.form is None:
                return None
            if self.form == "empty":
                return []
            self.made = torch.optim.SGD(self.parameters(), lr=0.1)
            return forms(self.made, torch.optim.lr_scheduler.StepLR(self.made, 1))[self.form]

    trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False)
    for form in range(6):
        MyModule.form = form
        copied, view = inrun.attach(trainer, MyModule())
        assert inrun.build_optimizers(view) == [copied.made]
    for form in (None, "empty"):
        MyModule.form = form
        with pytest.raises(PluginError, match=r"MyModule\.configure_optimizers\(\) returned no optimizer"):
            inrun.build_optimizers(inrun.attach(trainer, MyModule())[1])


def test_precision_plan():
    import torch

    from ddpscale.job.device.flops import precision_plan

    assert precision_plan("32-true", "cpu") == {"autocast": None, "params": None, "scaler": False}
    assert precision_plan("bf16-mixed", "cpu")["autocast"] is torch.bfloat16
    assert precision_plan("16-mixed", "cuda") == {"autocast": torch.float16, "params": None, "scaler": True}
    assert precision_plan("bf16-true", "cuda")["params"] is torch.bfloat16
    with pytest.raises(ValueError, match="needs a GPU"):
        precision_plan("16-mixed", "cpu")
    with pytest.raises(ValueError, match="does not know precision"):
        precision_plan("8-bit", "cpu")


def test_step_probe_of_a_module_that_logs_and_returns_a_dict(tmp_path, monkeypatch):
    """One rank in this process, under train.py's Trainer: a dict loss and self.log() in the
    probed steps are fine, silently, and log nothing into the run."""
    import warnings

    import pytorch_lightning as pl
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from ddpscale.job import build
    from ddpscale.job.callbacks import ProbeBeforeTraining
    from ddpscale.run.runspec import RunSpec

    class Logs(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(2, 2)

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.cross_entropy(self.net(x), y)
            self.log("train_loss", loss)
            return {"loss": loss}

        def configure_optimizers(self):
            return {"optimizer": torch.optim.SGD(self.parameters(), lr=0.1)}

    class Data(pl.LightningDataModule):
        def train_dataloader(self):
            return DataLoader(TensorDataset(torch.randn(20, 2), torch.randint(0, 2, (20,))), batch_size=8)

    monkeypatch.chdir(tmp_path)
    spec = RunSpec(topology="1x1", num_nodes=1, devices_per_node=1, throughput=rule(),
                   model_class="m.M", data_class="d.D", scaling="weak",
                   batch_size=8, max_epochs=1, accelerator="cpu")
    probed = ProbeBeforeTraining(spec, {"steps": 4, "rounds": 2, "warmup": 1, "iters": 2}, alone=True)
    trainer = build.build_trainer(spec, [probed], max_epochs=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(Logs(), datamodule=Data())
    assert not [w for w in caught if "self.log" in str(w.message)]
    step = probed.record["step"]
    assert step["steps"] == 4 and step["rounds"] == 2 and step["batch_per_device"] == 8
    assert step["compute_s"] > 0 and step["data_s"] > 0 and step["exposed_comm_s"] == 0
    assert (probed.record["gradient_numel"], probed.record["gradient_bytes"]) == (6, 24)
    assert "train_loss" not in trainer.callback_metrics


# -- real probes on CPU ---------------------------------------------------------------

def probe_command(tmp_path: Path, data_file: str, nodes: int, devices: int, *extra: str) -> list[str]:
    """As the workflow runs the first repeat: the topology's launcher, then train.py with
    --probe, here for one epoch (the probe is sized to at least FLOOR_S, so the spiral's
    milliseconds per step get the default sizes)."""
    train = [sys.executable, str(ROOT / "scripts/train.py"), "--topology", f"{nodes}x{devices}",
             "--num-nodes", str(nodes), "--devices-per-node", str(devices), *throughput(), "--accelerator", "cpu",
             "--scaling", "strong", "--batch-size", "64", "--model-class", "ddpscale.workloads.models.SpiralMLP",
             "--model-args", '{"hidden": [64, 32, 16]}',
             "--data-class", "ddpscale.workloads.spiral_datamodule.SpiralDataModule", "--data-file", data_file,
             "--max-epochs", "1", "--measure", "full", "--probe", "--ckpt-dir", str(tmp_path / "ckpt"),
             "--metrics", str(tmp_path / "metrics.json"), *extra]
    return launched(train, nodes, devices)


def run(command, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, timeout=150, cwd=ROOT, **kwargs)


def probed(tmp_path: Path) -> dict:
    """The probe's record, as the run kept it in metrics.json."""
    return json.loads((tmp_path / "metrics.json").read_text())["probe"]


def check_size(probe: dict, accumulate: int = 1) -> dict:
    """What the probe's cost bound guarantees, whatever the host's load (a busy host times a
    slower step and cuts the probe shorter): sizes from its ladder, at most the default's and at
    least its smallest rung, cut only where the default would cost more than the bound, the
    estimated cost within the bound; and the record says how many batches it timed."""
    from ddpscale.job.probe import record as probe_record

    size, step = probe["size"], probe["step"]
    ladder = [(rung["steps"], rung["rounds"]) for rung in probe_record.LADDER]
    assert (size["requested_steps"], size["requested_rounds"]) == ladder[0]
    assert (size["steps"], size["rounds"]) in ladder
    assert size["cut_by_bound"] == ((size["steps"], size["rounds"]) != ladder[0])
    assert size["estimated_s"] <= size["bound_s"] and size["bound_s"] >= probe_record.FLOOR_S
    assert ("cut from 20 x 5 by the bound" in probe["sized"]) == size["cut_by_bound"]
    assert probe["sized"].startswith(f"{size['steps']} steps x {size['rounds']} rounds")
    opt_steps = -(-size["steps"] // accumulate)
    assert step["steps"] == opt_steps and step["rounds"] == size["rounds"]
    assert step["micro_batches_per_block"] == opt_steps * accumulate
    assert size["timed_batches"] == size["rounds"] * opt_steps * accumulate
    assert f"{opt_steps} training steps" in step["method"] and f"{size['rounds']} rounds" in step["method"]
    return size


def check_step(probe: dict, world_size: int) -> None:
    step = probe["step"]
    check_size(probe)
    assert step["batch_per_device"] == 64 // world_size
    assert step["data_s"] > 0 and step["compute_s"] > 0 and step["sync_step_s"] > 0
    assert step["exposed_comm_s"] >= 0
    assert step["exposed_comm_s"] == pytest.approx(max(0.0, step["comm_diff_s"]))
    assert step["sync_step_s"] == pytest.approx(step["compute_s"] + step["comm_diff_s"])
    assert "slowest rank" in step["method"]


@pytest.mark.slow
def test_probe_on_one_rank(tmp_path, data_file):
    result = run(probe_command(tmp_path, data_file, 1, 1))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "ddpscale probe: 1x1 world size 1" in result.stdout
    probe = probed(tmp_path)
    assert probe["world_size"] == 1 and probe["backend"] == "none"
    assert probe["device_kind"] == "cpu" and probe["device_name"] == "cpu, simulated" and probe["simulated"]
    assert probe["hosts"] == [socket.gethostname()]
    assert probe["gradient_numel"] == SPIRAL_NUMEL and probe["gradient_bytes"] == 4 * SPIRAL_NUMEL
    assert [r["bytes"] for r in probe["allreduce"]] == message_sizes(4 * SPIRAL_NUMEL)
    assert all(r["time_s"] == 0 and r["busbw_gbps"] is None for r in probe["allreduce"])
    check_step(probe, 1)
    assert probe["step"]["exposed_comm_s"] == 0 and probe["step"]["sync_step_s"] == probe["step"]["compute_s"]
    assert "no DDP" in probe["step"]["method"]


@pytest.mark.slow
def test_probe_on_two_ranks_through_the_local_launcher(tmp_path, data_file):
    result = run(probe_command(tmp_path, data_file, 1, 2))
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("ddpscale probe:") == 1, "only rank 0 reports"
    probe = probed(tmp_path)
    assert probe["world_size"] == 2 and probe["backend"] == "gloo" and probe["node_ranks"] == [0, 0]
    assert probe["hosts"] == [socket.gethostname()]
    assert probe["gradient_bytes"] == 4 * SPIRAL_NUMEL == 4 * probe["gradient_numel"]
    sizes = [r["bytes"] for r in probe["allreduce"]]
    assert sizes[0] == 1024 and sizes[-1] == probe["gradient_bytes"]
    assert all(b == 2 * a for a, b in zip(sizes[:-2], sizes[1:-1])) and sizes[-2] < sizes[-1] <= 2 * sizes[-2]
    n = probe["world_size"]
    for row in probe["allreduce"]:
        assert row["time_s"] > 0 and row["iters"] == 10
        assert row["algbw_gbps"] == pytest.approx(row["bytes"] / row["time_s"] / 1e9)
        assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"] * 2 * (n - 1) / n)
    check_step(probe, 2)
    assert "no_sync()" in probe["step"]["method"]
    assert 0 < probe["probe_wall_s"] < 60
    # the spiral MLP's gradient fits DDP's first bucket: one all-reduce per synced batch, none
    # under no_sync (counted by a comm hook during the timed blocks)
    assert probe["step"]["accumulate_grad_batches"] == 1
    assert probe["step"]["allreduce_calls_per_batch"] == 1.0
    assert probe["step"]["allreduce_calls_per_batch_no_sync"] == 0.0
    # the comm term: the gradient as DDP sends it, here that one bucket
    as_ddp = probe["allreduce_ddp"]
    assert as_ddp["bucket_bytes"] == [probe["gradient_bytes"]] and as_ddp["time_s"] > 0 and as_ddp["iters"] == 10


@pytest.mark.slow
def test_probe_with_gradient_accumulation_syncs_once_per_k_batches(tmp_path, data_file):
    """accumulate_grad_batches 4: as Lightning runs it, 3 no_sync batches, then a synced one and
    the optimizer step; every time is per batch, so the exposed comm is one all-reduce over 4."""
    result = run(probe_command(tmp_path, data_file, 1, 2, "--accumulate-grad-batches", "4"))
    assert result.returncode == 0, result.stderr[-3000:]
    probe = probed(tmp_path)
    step = probe["step"]
    assert step["accumulate_grad_batches"] == 4
    check_size(probe, accumulate=4)  # 20 micro-batches a block by default: 5 optimizer steps of 4
    assert "of 4 micro-batches each" in step["method"]
    assert step["allreduce_calls_per_batch"] == 0.25  # one bucket, once every 4 batches
    assert step["allreduce_calls_per_batch_no_sync"] == 0.0
    assert step["exposed_comm_s"] == pytest.approx(max(0.0, step["comm_diff_s"]))
    print(f"1x2, accumulate 4: per batch compute {step['compute_s'] * 1e3:.3f} ms, "
          f"exposed comm {step['exposed_comm_s'] * 1e3:.3f} ms")


# -- on a GPU -----------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.slow
def test_probe_on_gpus_uses_nccl(tmp_path, data_file):
    torch = require_cuda()
    if torch.cuda.device_count() < 2:
        pytest.skip(f"needs 2 CUDA GPUs for an NCCL group; this machine has {torch.cuda.device_count()}")
    command = probe_command(tmp_path, data_file, 1, 2)
    command[command.index("--accelerator") + 1] = "gpu"
    result = run(command)
    assert result.returncode == 0, result.stderr[-3000:]
    probe = probed(tmp_path)
    assert probe["world_size"] == 2 and probe["backend"] == "nccl"
    assert probe["device_kind"] == "cuda" and probe["simulated"] is False
    assert probe["device_name"] == torch.cuda.get_device_name(0)
    assert all(r["time_s"] > 0 and r["busbw_gbps"] > 0 for r in probe["allreduce"])
    check_step(probe, 2)


@pytest.mark.gpu
@pytest.mark.slow
def test_probe_on_one_gpu(tmp_path, data_file):
    torch = require_cuda()
    command = probe_command(tmp_path, data_file, 1, 1, "--precision", "bf16-mixed")
    command[command.index("--accelerator") + 1] = "gpu"
    result = run(command)
    assert result.returncode == 0, result.stderr[-3000:]
    probe = probed(tmp_path)
    assert probe["device_kind"] == "cuda" and probe["device_name"] == torch.cuda.get_device_name(0)
    check_step(probe, 1)


NO_BATCH_IDX = '''
import torch.nn.functional as F
from ddpscale.workloads.models import SpiralMLP


class NoBatchIdx(SpiralMLP):
    """training_step without batch_idx, as Lightning allows and its GAN tutorial writes it."""

    def training_step(self, batch):
        x, y = batch
        return F.cross_entropy(self(x), y)
'''


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_training_step_without_batch_idx_is_probed_and_counted(tmp_path, data_file):
    from helpers.training import run_user_module

    done = run_user_module(tmp_path, NO_BATCH_IDX, "nobatchidx.NoBatchIdx", data_file, "--probe", devices=2)
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    # the probe timed its steps and the FLOP count ran: both call training_step themselves
    assert metrics["probe"]["step"]["compute_s"] > 0 and metrics["flops_per_sample"] > 0


LOGS_THROUGH_LOGGER = '''
from ddpscale.workloads.models import SpiralMLP


class LogsThroughLogger(SpiralMLP):
    """Logs through self.logger as Lightning's docs teach: hyperparameters at the start, a
    metric of its own every few steps."""

    def on_train_start(self):
        self.logger.log_hyperparams({"note": "from the module", "lr": 0.01})

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        if batch_idx % 10 == 0:
            self.logger.log_metrics({"my_metric": float(batch_idx)}, step=self.global_step)
        return loss
'''


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("devices", [1, 2])
def test_a_module_logging_through_self_logger_trains_and_its_logs_stay_in_the_run_s_folder(tmp_path, data_file,
                                                                                          devices):
    from helpers.training import run_user_module

    done = run_user_module(tmp_path, LOGS_THROUGH_LOGGER, "logsmod.LogsThroughLogger", data_file, "--probe",
                           devices=devices)
    assert done.returncode == 0, done.stderr[-3000:]
    logs = tmp_path / "logs" / "attempt-1"  # beside metrics.json, one folder per attempt
    # Lightning's default logger: TensorBoard's, as tensorboardX is installed for the tests
    written = b"".join(events.read_bytes() for events in logs.glob("events.out.tfevents.*"))
    assert b"from the module" in written and b"my_metric" in written
    m = json.loads((tmp_path / "metrics.json").read_text())
    # the spiral's 840 training samples an epoch, each counted once, and the throughput of them
    assert m["epochs_completed"] == 2 and m["samples_trained"] == 2 * 840 and m["loggers"] == ["TensorBoardLogger"]
    steady = m["steady_epochs"]
    assert m["throughput_samples_s"] == pytest.approx(
        840 * len(steady) / sum(m["train_times_s"][i] for i in steady), rel=1e-3)


# -- the probe's cost, bounded by the run's ----------------------------------------------------

def test_the_probe_costs_what_its_sizes_say_in_training_batches():
    from ddpscale.job.probe import record as probe_record

    # one rank: the block alone (20) plus warm-up and 5 rounds of 20 compute-only batches
    assert probe_record.cost_steps(probe_record.DEFAULTS, 1) == 20 + (3 + 100)
    # several: three kinds of block, and the all-reduce benchmark (3 steps per call, 13 calls)
    assert probe_record.cost_steps(probe_record.DEFAULTS, 2) == 20 + 3 * 103 + 3 * 13
    # accumulation of 4: 5 optimizer steps of 4 micro-batches a block; the baseline's batches
    # at other sizes (0.5 + 0.25 of its own) add their blocks
    assert probe_record.cost_steps(probe_record.DEFAULTS, 1, accumulate=4, other_batches=0.75) == \
        20 + 1.75 * (3 + 25) * 4


@pytest.mark.parametrize("step_s,planned,expected", [
    (0.001, 300, 20),  # a probe of a fraction of a second: the default, whatever the run
    (0.1, 40, 10),  # 12.3 s by default, over 10 s and 20% of 4 s: the next size down
    (0.1, 4000, 20),  # 12.3 s against 20% of 400 s
    (1.0, 40, None),  # even the smallest, 13 s, is over 10 s and 20% of 40 s: skipped
])
def test_the_probe_is_sized_to_a_share_of_the_run_or_skipped_with_the_reason(step_s, planned, expected):
    from ddpscale.job.probe import record as probe_record

    sizes, said, bound = probe_record.sized(step_s, planned, 1)
    assert (sizes or {}).get("steps") == expected
    assert ("skipped" in said) == (expected is None) and "\n" not in said
    assert bound["bound_s"] == max(0.2 * step_s * planned, 10.0)
    if sizes:
        assert bound["estimated_s"] == pytest.approx(step_s * probe_record.cost_steps(sizes, 1))
        assert bound["estimated_s"] <= bound["bound_s"]
        assert ("cut from 20 x 5 by the bound" in said) == (expected != 20)
    else:
        assert bound["estimated_s"] > bound["bound_s"]
    # a run of unknown length: the default, no bound
    assert probe_record.sized(step_s, None, 1)[::2] == (probe_record.DEFAULTS, {"bound_s": None, "estimated_s": None})


def test_the_record_says_how_many_batches_the_probe_timed_and_whether_the_bound_cut_them():
    from ddpscale.job.probe import record as probe_record

    sizes, _, bound = probe_record.sized(0.1, 40, 1)  # the default would cost 12.3 s
    step = {"rounds": 4, "micro_batches_per_block": 10}
    assert probe_record.size_record(probe_record.DEFAULTS, sizes, step, bound) == {
        "requested_steps": 20, "requested_rounds": 5, "steps": 10, "rounds": 4, "timed_batches": 40,
        "cut_by_bound": True, "bound_s": 10.0, "estimated_s": pytest.approx(5.2)}
    whole = probe_record.size_record(probe_record.DEFAULTS, probe_record.DEFAULTS,
                                     {"rounds": 5, "micro_batches_per_block": 20}, {"bound_s": None})
    assert whole["timed_batches"] == 100 and whole["cut_by_bound"] is False and whole["estimated_s"] is None


SLOW_STEP = '''
import time

from ddpscale.workloads.models import SpiralMLP


class SlowStep(SpiralMLP):
    """A step as slow as a large model's: the run's 4 batches take a few seconds."""

    def training_step(self, batch, batch_idx):
        time.sleep(STEP_S)
        return super().training_step(batch, batch_idx)
'''


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("step_s,steps", [(0.1, 10), (0.9, None)])
def test_a_slow_module_s_probe_is_sized_to_its_short_run_or_skipped(tmp_path, data_file, step_s, steps):
    """4 planned batches (2 epochs of 2): at 0.1 s a step the default probe (123 batches, 12 s)
    would cost three times the training; it times 10 steps x 4 rounds instead (fewer on a host
    busy enough to slow the step by half again). At 0.9 s even
    the smallest probe (13 batches) would: it is skipped, with the reason, and training goes on."""
    from helpers.training import run_user_module

    done = run_user_module(tmp_path, SLOW_STEP.replace("STEP_S", str(step_s)), "slowstep.SlowStep", data_file,
                           "--probe", "--trainer-args", json.dumps({"limit_train_batches": 2}))
    assert done.returncode == 0, done.stderr[-3000:]
    probe = json.loads((tmp_path / "metrics.json").read_text())["probe"]
    if steps is None:
        assert probe["status"] == "n/a" and probe["reason"].startswith("skipped: even its smallest size")
        assert "ddpscale probe: n/a for 1x1: skipped" in done.stdout
    else:
        # the bound cut it (a busier host may cut it further): what the bound guarantees
        size = check_size(probe)
        assert size["cut_by_bound"] and size["steps"] <= steps


def test_the_report_states_each_probe_s_size_and_time():
    from ddpscale.report.render.html_tables import probe_costs

    probes = {"1x2": {"world_size": 2, "sized": "10 steps x 4 rounds, about 5.2 s, within 20% of ...",
                      "probe_wall_s": 5.43},
              "1x1": {"world_size": 1, "sized": "20 steps x 5 rounds, about 0.3 s, within ...", "probe_wall_s": 0.31}}
    said = probe_costs(probes)
    assert "1x1 20 steps x 5 rounds, 0.3 s; 1x2 10 steps x 4 rounds, 5.4 s." in said
    assert probe_costs({}) == ""  # no probe


@pytest.mark.slow
def test_the_probe_s_ddp_takes_the_run_s_settings_and_times_a_16_bit_hook_at_half_the_bytes(tmp_path, data_file):
    """config ddp reaches the probe as it reaches training: its own DDP wrapper gets the
    strategy's kwargs and comm hook, and the comm term's buckets the configured cap and width."""
    settings = {"bucket_cap_mb": 4 / 1024, "comm_hook": "fp16_compress", "gradient_as_bucket_view": True}
    result = run(probe_command(tmp_path, data_file, 1, 2, "--ddp", json.dumps(settings)))
    assert result.returncode == 0, result.stderr[-3000:]
    probe = probed(tmp_path)
    assert probe["step"]["allreduce_calls_per_batch"] >= 2  # a 4 KiB cap splits the 11 KiB gradient
    as_ddp = probe["allreduce_ddp"]
    assert as_ddp["comm_bytes_per_element"] == 2 and as_ddp["time_s"] > 0
    assert as_ddp["bytes"] == probe["gradient_bytes"] // 2 and as_ddp["buckets"] == 3


# -- parameters a step may leave unused, and DDP's settings for them ----------------------------

def usermod_probed(tmp_path: Path, model: str, ddp: dict, *extra: str) -> tuple[subprocess.CompletedProcess, dict]:
    """train.py --probe on 1x2 (gloo) with a module of tests/fixtures/usermods on its 8x8 images,
    as a config's model.class_path names it, with the config's ddp: block: (the run, its record)."""
    import os

    train = [sys.executable, str(ROOT / "scripts/train.py"), "--topology", "1x2", "--num-nodes", "1",
             "--devices-per-node", "2", *throughput(),
             "--accelerator", "cpu", "--scaling", "weak", "--batch-size", "32", "--max-epochs", "2",
             "--model-class", f"usermods.{model}", "--data-class", "usermods.imagedata.TrainerShardedImages",
             "--data-args", '{"train_samples": 301}', "--ddp", json.dumps(ddp), "--probe",
             "--ckpt-dir", str(tmp_path / "ckpt"), "--metrics", str(tmp_path / "metrics.json"), *extra]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests/fixtures"), str(ROOT / "scripts")])}
    done = run(launched(train, 1, 2), env=env)
    path = tmp_path / "metrics.json"
    return done, json.loads(path.read_text()) if path.exists() else {}


def numel_of(model: str, **kwargs) -> int:
    """The trainable parameters of the user's module, counted from the module itself."""
    import importlib

    module_name, _, cls = f"usermods.{model}".rpartition(".")
    sys.path.insert(0, str(ROOT / "tests/fixtures"))
    try:
        built = getattr(importlib.import_module(module_name), cls)(**kwargs)
    finally:
        sys.path.remove(str(ROOT / "tests/fixtures"))
    return sum(p.numel() for p in built.parameters() if p.requires_grad)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("model,extra", [
    ("layerdrop.LayerDropMLP", ()),  # blocks skipped at random, each rank its own
    ("layerdrop.LayerDropMLP", ("--accumulate-grad-batches", "2")),
    ("layerdrop.ManualLayerDropMLP", ()),  # the same, optimised by hand
    ("auxhead.AuxHeadNet", ()),  # an auxiliary head on even steps only
])
def test_a_module_whose_steps_leave_parameters_unused_is_probed_on_two_ranks(tmp_path, model, extra):
    """ddp.find_unused_parameters: true, as such a module needs: the probe times its steps as
    training runs them, and the breakdown of 1x2 is a figure."""
    import pandas as pd

    from ddpscale.report.figures import breakdown

    done, metrics = usermod_probed(tmp_path, model, {"find_unused_parameters": True}, *extra)
    assert done.returncode == 0, done.stderr[-3000:]
    probe = metrics["probe"]
    assert probe.get("status") == "ok", probe.get("reason")
    assert probe["world_size"] == 2 and probe["backend"] == "gloo"
    assert probe["gradient_numel"] == numel_of(model)
    step = probe["step"]
    assert step["batch_per_device"] == 32 and step["compute_s"] > 0 and step["sync_step_s"] > 0
    assert step["allreduce_calls_per_batch"] > 0 and step["allreduce_calls_per_batch_no_sync"] == 0
    row = pd.Series({"topology": "1x2", "world_size": 2, "batch_per_device": 32,
                     "throughput_samples_s": metrics["throughput_samples_s"]})
    terms = breakdown.measured_terms(row, probe)
    assert all(pd.notna(terms[t]) and terms[t] >= 0 for t in breakdown.TERMS), terms
    table = breakdown.breakdown(pd.DataFrame([row]), {"1x2": probe})
    assert table.loc[0, "probe"] == breakdown.PROBE_OK and table[[f"{t}_s" for t in breakdown.TERMS]].notna().all(
        axis=None)
    assert table.loc[0, "probe_batches"] == probe["size"]["timed_batches"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ddp_s_static_graph_is_probed(tmp_path):
    """ddp.static_graph: true on a module that uses every parameter: DDP records its graph in a
    synchronised first step, and the probe times it."""
    done, metrics = usermod_probed(tmp_path, "cnn.SmallCNN", {"static_graph": True})
    assert done.returncode == 0, done.stderr[-3000:]
    assert metrics["probe"].get("status") == "ok", metrics["probe"].get("reason")
    assert metrics["probe"]["step"]["compute_s"] > 0


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("model,ddp,extra,words", [
    ("layerdrop.LayerDropMLP", {}, (), "set ddp.find_unused_parameters: true in your config"),
    ("layerdrop.LayerDropMLP", {"static_graph": True}, (), "set ddp.static_graph: false in your config"),
    ("cnn.SmallCNN", {"static_graph": True}, ("--accumulate-grad-batches", "2"),
     "set ddp.static_graph: false or accumulate_grad_batches: 1 in your config"),
])
def test_a_setting_the_module_cannot_train_with_is_named_in_the_probe_s_reason(tmp_path, model, ddp, extra, words):
    """Settings under which DDP cannot run the module's steps, in training as in the probe: the
    probe is n/a with the config key and its fix, not torch's text that calls it a bug of DDP.
    Training then stops at the same error, in the same line, without a traceback."""
    done, _ = usermod_probed(tmp_path, model, ddp, *extra)
    said = [line for line in done.stdout.splitlines() if line.startswith("ddpscale probe: n/a for 1x2")]
    assert len(said) == 1, done.stdout[-3000:]
    assert words in said[0] and "bug" not in said[0] and "DDP implementation" not in said[0], said[0]
    stopped = [line for line in done.stderr.splitlines() if line.startswith("ddpscale train: ")]
    assert done.returncode != 0 and stopped and all(words in line for line in stopped), done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
