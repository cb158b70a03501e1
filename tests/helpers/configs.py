"""The shipped configs as the unit tests read them: validated with the schema's defaults, as
ddpscale's LightningCLI settings, the transformer presets' shapes, a RunSpec's own fields, and
the plan of an experiment's runs built from a config."""

from __future__ import annotations

import yaml
from snakemake.utils import validate

from ddpscale.core.steadystate import Rule
from ddpscale.plan import runplan
from ddpscale.run.hostdevices import VisibleGpus
from ddpscale.plan.site.resources import Site
from helpers.workflow import ROOT


SCHEMA = ROOT / "workflow/schemas/config.schema.yaml"


def rule(**changes) -> Rule:
    """A stopping rule of the schema's defaults (the one place they live), changes applied; no
    cap unless a test gives one, so a test's windows stop on their precision alone."""
    settings = yaml.safe_load(SCHEMA.read_text())["properties"]["throughput"]["properties"]
    return Rule(**{**{k: v["default"] for k, v in settings.items()}, "max_steps": None, "max_minutes": None,
                   **changes})


BASE = dict(topology="2x4", num_nodes=2, devices_per_node=4, model_class="pkg.mod.Net", data_class="pkg.data.Data",
            scaling="weak", batch_size=32, max_epochs=3, throughput=rule())


def default_config(**changes) -> dict:
    config = yaml.safe_load((ROOT / "config/config.yaml").read_text())
    config.update(changes)
    validate(config, str(SCHEMA))  # fills the schema's defaults
    return config


def ddpscale_config() -> dict:
    config = yaml.safe_load((ROOT / "config/config.yaml").read_text())
    config["experiment"], config["accumulate_grad_batches"] = None, 1
    return config


TINY_PRESET = yaml.safe_load((ROOT / "config/transformer_tiny.yaml").read_text())
SHAPES = ("vocab_size", "seq_len", "d_model", "n_layers", "mlp_ratio", "tie_weights")


def shapes(init_args: dict) -> dict:
    return {k: init_args[k] for k in SHAPES if k in init_args}


NO_GPU = VisibleGpus(0, (), "nvidia-smi -L")


def plan(config=None, site=Site(), gpus=NO_GPU, cores=8, memory_mb=None, source=None, **changes) -> runplan.RunPlan:
    config = config or default_config(**changes)
    local = site.is_local
    return runplan.build(config, site, config_source="config/config.yaml", lightning=None, python="/v/bin/python",
                         versions={"torch": "2.13.0"}, gpus=gpus if local else None, cores=cores if local else None,
                         memory_mb=memory_mb if local else None, source=source)


def source(key):
    return "overlay.yaml"
