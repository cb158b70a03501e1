"""A run's spec: built from a config and a site, turned into train.py's flags and read back."""

from __future__ import annotations

import dataclasses
import shlex

import pytest

from helpers.configs import BASE, default_config, rule
from ddpscale.core.layout import layout
from ddpscale.run.topology import parse_topology
from ddpscale.run import runspec
from ddpscale.plan.site.resources import Site
from ddpscale.plan.runplan import build_spec
from ddpscale.run.runspec import RunSpec
from ddpscale.core.steadystate import Rule


def built(config: dict, topology: str, repeat: int, site: Site = Site(), measure: str = "full") -> RunSpec:
    topologies = [parse_topology(t) for t in config["topologies"]]
    return build_spec(config, site, parse_topology(topology), repeat, topologies=topologies, measure=measure,
                      throughput=Rule.of(config["throughput"]), accelerator="cpu", local_threads=1,
                      data_file="results/x/data/spiral/data.npz",
                      lightning=None, layout=layout(config))


def hostile() -> RunSpec:
    """Every kind of field set away from its default, with text a shell must not read."""
    return RunSpec(**{**BASE, "model_args": {"name": "it's $(id); `x`\n", "depth": [1, 2.5, None]},
                      "throughput": rule(window_steps=10, precision=0.05, min_windows=8, max_steps=500,
                                         max_minutes=2.5)},
                   data_args={"root": "/data/a b"}, data_file="/tmp/d ata.npz", data_files=["a;b", "c d"],
                   repeat=2, seed=7, cluster_env="slurm", batch_dim=1, precision="bf16-mixed", compile="default",
                   accumulate_grad_batches=2, loader={"num_workers": 4, "pin_memory": True},
                   ddp={"static_graph": True, "comm_hook": "fp16_compress"}, trainer_args={"gradient_clip_val": 0.5},
                   optimizers={"optimizer": {"class_path": "torch.optim.Adam"}}, loggers=[],
                   warmup_epochs=0, measure="throughput", metrics="r/m e.json", ckpt_dir="c k",
                   threads=3, collective_timeout_s=60.0, compile_timeout_s=900.0, probe=True,
                   probe_batch_sizes=[8, 16], held_from_job=True, held_devices=8, site_interconnect="ib",
                   accuracy_metric="val/acc", epoch_metric="val acc", attempt=1)


@pytest.mark.parametrize("spec", [RunSpec(**BASE), hostile()], ids=["defaults", "every-field-set"])
def test_the_command_reads_back_as_the_spec(spec):
    assert runspec.parse(shlex.split(spec.command())) == spec


def test_the_rules_two_parts_and_its_attempt_read_back_as_the_spec():
    """The rule's shell: the flags that rerun the job, those that do not, then the attempt."""
    spec = hostile()
    argv = [*shlex.split(spec.command(rerun=True)), *shlex.split(spec.command(rerun=False)), "--attempt", "3"]
    assert runspec.parse(argv) == spec.replace(attempt=3)
    # each flag in exactly one part, the attempt in neither
    rerun, log = ({a.partition("=")[0] for a in shlex.split(spec.command(rerun=part))} for part in (True, False))
    assert "--accuracy-metric" in log and "--epoch-metric" in log and "--seed" in rerun
    assert not {f for f in rerun | log if f.startswith("--")} & {"--attempt"}


def test_the_built_spec_of_the_default_config_reads_back():
    config = default_config()
    for topology in config["topologies"]:
        for repeat in (0, 1):
            spec = built(config, topology, repeat)
            assert runspec.parse(shlex.split(spec.command())) == spec


def test_what_a_run_measures_excludes_how_it_runs():
    spec = RunSpec(**BASE)
    for how in ("threads", "collective_timeout_s", "metrics", "ckpt_dir", "probe", "accuracy_metric", "attempt",
                "held_devices", "site_interconnect"):
        assert how not in spec.measured()
    changed = {"threads": 4, "collective_timeout_s": 10.0, "ckpt_dir": "elsewhere", "probe": True,
               "epoch_metric": "val_loss", "attempt": 2}
    assert spec.replace(**changed).measured() == spec.measured(), "how it runs changed what it measures"
    for name, value in {"seed": 1, "batch_size": 64, "precision": "16-mixed", "model_args": {"w": 2},
                        "measure": "throughput", "ddp": {"static_graph": True},
                        "throughput": rule(precision=0.05)}.items():
        assert spec.replace(**{name: value}).measured() != spec.measured(), name


def test_every_field_says_what_it_is():
    for f in dataclasses.fields(RunSpec):
        assert f.metadata.get("help"), f"{f.name} has no help"
    assert "--collective-timeout-s" in runspec.parser().format_help()


@pytest.mark.parametrize("change, said", [
    ({"num_nodes": 0}, "--num-nodes must be >= 1, got 0"),
    ({"collective_timeout_s": float("nan")}, "--collective-timeout-s must be a finite number > 0, got nan"),
    ({"compile": "turbo"}, "--compile is 'turbo'; choose one of none, default"),
    ({"probe_batch_sizes": [0, 8]}, "--probe-batch-sizes must be integers >= 1"),
    ({"ddp": {"bucket_cap_mb": -1}}, "ddp.bucket_cap_mb is -1"),
])
def test_a_spec_that_cannot_run_is_refused_in_one_line(change, said):
    with pytest.raises(ValueError) as err:
        RunSpec(**{**BASE, **change})
    assert said in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("flag, text, said", [
    ("--model-args", "{oops", "argument --model-args: not JSON"),
    ("--data-files", '{"a": 1}', "argument --data-files: expected a JSON list"),
    ("--num-nodes", "0", "--num-nodes must be >= 1"),
    ("--throughput", '{"precision": 0.02}', "argument --throughput: throughput settings must be exactly"),
    ("--throughput", '{"precision": 2, "window_steps": 20, "min_windows": 30, "max_steps": null, "max_minutes": 10}',
     "argument --throughput: throughput.precision must be a number between 0 and 1"),
])
def test_a_bad_flag_exits_with_argparses_one_line(flag, text, said, capsys):
    argv = [*shlex.split(RunSpec(**BASE).command()), flag, text]
    with pytest.raises(SystemExit) as exited:
        runspec.parse(argv)
    assert exited.value.code == 2 and said in capsys.readouterr().err.strip().splitlines()[-1]


def test_the_plan_probes_the_first_repeat_and_times_every_batch_at_the_baseline():
    config = default_config(topologies=["1x1", "1x2", "2x2"], baseline="1x1",
                            batch={"scaling": "strong", "size": 64})
    assert built(config, "1x1", 0).probe_batch_sizes == [16, 32, 64]
    assert built(config, "1x2", 0).probe and built(config, "1x2", 0).probe_batch_sizes == []
    assert not built(config, "1x1", 1).probe and built(config, "1x1", 1).probe_batch_sizes == []


def test_the_plan_takes_the_site_and_the_measure_mode():
    config = default_config()
    site = Site(launcher="srun", gpus_per_node=4, cpus_per_gpu=8, exclusive=True, interconnect="infiniband")
    spec = built(config, "2x2", 1, site=site, measure="throughput")
    assert (spec.cluster_env, spec.threads, spec.held_from_job, spec.site_interconnect) == ("slurm", 8, True,
                                                                                            "infiniband")
    assert spec.held_devices == 8, "whole nodes of 4 GPUs are billed"
    assert spec.throughput == Rule.of(config["throughput"]), "the config's throughput: whole, by its names"
    assert spec.metrics == layout(config).metrics("2x2", 1)
    full = built(config, "2x2", 1)
    assert (full.cluster_env, full.threads, full.held_from_job, full.held_devices) == ("local", 1, False, None)
    assert (full.throughput.max_steps, full.throughput.max_minutes) == (None, None), "full mode has no cap"
    assert full.throughput.precision == config["throughput"]["precision"]
