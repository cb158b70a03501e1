"""config/config.yaml against workflow/schemas/config.schema.yaml, as common.smk validates it."""
import copy

import pytest
import yaml
from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

from helpers.workflow import ROOT

SCHEMA = str(ROOT / "workflow/schemas/config.schema.yaml")
SHIPPED = yaml.safe_load((ROOT / "config/config.yaml").read_text())


def shipped(**changes):
    config = copy.deepcopy(SHIPPED)
    config.update(changes)
    return config


def test_shipped_config_validates_unchanged():
    config = shipped()
    validate(config, SCHEMA)
    assert config == SHIPPED  # every key is set, so no default is added or altered


def test_empty_config_gets_every_default():
    config = {}
    validate(config, SCHEMA)
    assert config["topologies"] == ["1x1", "1x2", "2x2"]
    assert config["baseline"] == "1x1"
    assert config["repeats"] == "auto"
    assert config["compile"] == "none"
    assert config["max_epochs"] == 4
    assert config["batch"] == {"scaling": "weak", "size": 32, "dim": 0}
    assert config["dataloader"] == {
        "num_workers": 0, "pin_memory": False, "persistent_workers": False, "prefetch_factor": None,
    }
    assert config["dataset"]["split"] == [0.7, 0.15, 0.15]
    assert config["ddp"] == {"find_unused_parameters": False, "static_graph": False, "gradient_as_bucket_view": False,
                             "bucket_cap_mb": None, "comm_hook": "none"}
    assert config["model"] == {"class_path": "ddpscale.workloads.models.SpiralMLP", "init_args": {}}
    assert config["accuracy"] == {"metric": "test_acc", "mode": "auto", "tolerance": 0.02, "epoch_metric": "auto",
                                  "target": None}
    assert config["experiment"] is None


def test_partial_nested_section_is_completed():
    config = {"batch": {"scaling": "strong"}}
    validate(config, SCHEMA)
    assert config["batch"] == {"scaling": "strong", "size": 32, "dim": 0}


def test_dataset_generator_none_is_allowed():
    config = shipped(dataset={"generator": "none"})
    validate(config, SCHEMA)
    assert config["dataset"]["generator"] == "none"


def test_dataset_null_is_refused_clearly():
    # null would crash Snakemake's default-filling validator; generator: none says it instead
    with pytest.raises(WorkflowError, match="None is not of type 'object'"):
        validate(shipped(dataset=None), SCHEMA)


@pytest.mark.parametrize("changes, expected", [
    ({"max_epoch": 3}, ["'max_epoch' was unexpected"]),
    ({"batch": {"scalling": "weak"}}, ["'scalling' was unexpected", "schema['properties']['batch']"]),
    ({"batch": {"scaling": "medium", "size": 64}}, ["'medium' is not one of ['weak', 'strong']",
                                                    "instance['batch']['scaling']"]),
    ({"batch": {"dim": -1}}, ["-1 is less than the minimum of 0", "instance['batch']['dim']"]),
    ({"batch": {"dim": 1.5}}, ["1.5 is not of type 'integer'", "instance['batch']['dim']"]),
    ({"batch": {"dim": "1; $(reboot)"}}, ["is not of type 'integer'", "instance['batch']['dim']"]),
    ({"repeats": 0}, ["0 is less than the minimum of 1", "instance['repeats']"]),
    ({"max_epochs": 1}, ["1 is less than the minimum of 2", "instance['max_epochs']"]),
    ({"topologies": ["1x1", "2by4"]}, ["'2by4' does not match", "instance['topologies'][1]"]),
    ({"topologies": []}, ["instance['topologies']"]),
    ({"dataloader": {"num_workers": -1}}, ["-1 is less than the minimum of 0",
                                            "instance['dataloader']['num_workers']"]),
    ({"accelerator": "tpu"}, ["'tpu' is not one of", "instance['accelerator']"]),
    ({"ddp": {"bucket_cap_mb": -1}}, ["-1 is less than or equal to the minimum of 0",
                                      "instance['ddp']['bucket_cap_mb']"]),
    ({"ddp": {"bucket_cap_mb": 1e6}}, ["1000000.0 is greater than the maximum of 4096"]),
    ({"ddp": {"comm_hook": "my.module.hook"}}, ["'my.module.hook' is not one of ['none', 'fp16_compress'"]),
    ({"ddp": {"timeout": 60}}, ["'timeout' was unexpected", "schema['properties']['ddp']"]),
    ({"compile": "fast"}, ["'fast' is not one of ['none', 'default', 'reduce-overhead', 'max-autotune']",
                           "instance['compile']"]),
])
def test_bad_config_is_rejected_naming_the_key(changes, expected):
    with pytest.raises(WorkflowError) as err:
        validate(shipped(**changes), SCHEMA)
    message = str(err.value)
    for text in expected:
        assert text in message
