"""ddpscale.plan.config.check: each config problem as one line naming the key and the fix."""

from __future__ import annotations

import copy

import pytest
import yaml
from snakemake.utils import validate

from helpers.workflow import ROOT
from ddpscale.plan.config.check import (
    dataset_problems, device_problems, epoch_problems, fewest_samples, file_problems, key_name, loader_problems,
    schema_problems, setting_problems,
)
from ddpscale.run.topology import Topology, parse_topology
from ddpscale.plan.config.source import config_source
from ddpscale.core.spiral import split_sizes

SCHEMA_PATH = ROOT / "workflow/schemas/config.schema.yaml"
SCHEMA = yaml.safe_load(SCHEMA_PATH.read_text())
SHIPPED = yaml.safe_load((ROOT / "config/config.yaml").read_text())


def shipped(**changes) -> dict:
    config = copy.deepcopy(SHIPPED)
    config.update(changes)
    return config


def validated(config: dict) -> dict:
    validate(config, str(SCHEMA_PATH))  # fills the defaults, as common.smk does
    return config


def topologies(config: dict) -> list[Topology]:
    return [parse_topology(t) for t in config["topologies"]]


def with_preset(name: str) -> dict:
    """config.yaml with a preset on top, merged as Snakemake merges --configfile (common.smk's rule
    for init_args: a section that names its class brings only its own)."""
    config = copy.deepcopy(SHIPPED)
    preset = yaml.safe_load((ROOT / "config" / name).read_text())

    def merge(into, new):
        for key, value in new.items():
            if isinstance(value, dict) and isinstance(into.get(key), dict):
                merge(into[key], value)
            else:
                into[key] = value
    merge(config, preset)
    for section in ("model", "data"):
        if "class_path" in preset.get(section, {}):
            config[section]["init_args"] = preset[section].get("init_args", {})
    return config


def test_key_names_read_as_in_yaml():
    assert key_name(["dataset", "split", 0]) == "dataset.split[0]"
    assert key_name(["topologies", 2]) == "topologies[2]"
    assert key_name([]) == "the config"


@pytest.mark.parametrize("preset", ["config.yaml", "transformer.yaml", "transformer_tiny.yaml", "compute_bound.yaml"])
def test_shipped_configs_have_no_problem(preset):
    config = with_preset(preset)
    assert schema_problems(config, SCHEMA) == []
    assert setting_problems(validated(config), topologies(config)) == []


def test_unknown_key_names_the_closest_known_one():
    config = shipped(max_epoch=3)
    del config["max_epochs"]
    assert schema_problems(config, SCHEMA, "my.yaml") == [
        "my.yaml: unknown key 'max_epoch' at the top level; did you mean 'max_epochs'? (a misspelt key is never ignored)"
    ]


def test_unknown_key_with_no_close_match_lists_the_allowed_ones():
    [message] = schema_problems(shipped(accuracy={"metric": "test_acc", "shoe": 1}), SCHEMA)
    assert "unknown key 'shoe' in accuracy; the keys allowed there are epoch_metric, metric, mode, target, tolerance" in message


def test_number_in_quotes_says_to_drop_them():
    [message] = schema_problems(shipped(max_epochs="5"), SCHEMA)
    assert "max_epochs is '5' (text) but must be a whole number; write 5 without quotes" in message


def test_a_fraction_where_a_whole_number_goes_is_not_told_to_lose_its_quotes():
    [message] = schema_problems(shipped(seed="2.5"), SCHEMA)
    assert "without quotes" not in message and "seed is '2.5'" in message


def test_a_word_where_a_number_or_auto_goes_names_both():
    [message] = schema_problems(shipped(repeats="three"), SCHEMA)
    assert "repeats is 'three'; it must be a whole number or auto" in message and "^" not in message


def test_boolean_where_a_word_goes_is_one_message():
    # YAML reads `compile: true` as a boolean: the type and the enum both fail; say it once
    [message] = schema_problems(shipped(compile=True), SCHEMA)
    assert "compile is true (true/false) but must be text; quote the value" in message


def test_enum_suggests_the_closest_value_only_when_close():
    [close] = schema_problems(shipped(precision="bf16"), SCHEMA)
    assert "did you mean 'bf16-mixed'?" in close
    [far] = schema_problems(shipped(accelerator="nvidia"), SCHEMA)
    assert "must be one of: auto, cpu, gpu" in far and "did you mean" not in far
    [cuda] = schema_problems(shipped(accelerator="cuda"), SCHEMA)
    assert "did you mean 'gpu'?" in cuda  # not 'cpu', nearest by letters


def test_lightning_legacy_precision_is_answered_with_its_full_name():
    [number] = schema_problems(shipped(precision=16), SCHEMA)
    assert "precision is 16 but must be text; write '16-mixed'" in number


def test_threshold_given_in_percent_is_read_back_as_a_fraction():
    [message] = schema_problems(shipped(report={"efficiency_threshold": 80}), SCHEMA)
    assert "report.efficiency_threshold is 80; it must be at most 1 (a fraction: 80% is 0.8)" in message


def test_topology_pattern_says_how_to_write_one():
    [message] = schema_problems(shipped(topologies=["1x1", "2x"]), SCHEMA)
    assert "topologies[1] is '2x', which is not a topology; write NODESxDEVICES" in message


def test_several_problems_are_one_line_each():
    problems = schema_problems(shipped(repeats=0, seed="x", batch={"size": "64"}), SCHEMA)
    assert len(problems) == 3 and all("\n" not in p for p in problems)
    assert [p.split(": ")[1].split(" ")[0] for p in problems] == ["batch.size", "repeats", "seed"]


def test_null_section_says_to_give_keys_or_drop_the_line():
    [message] = schema_problems(shipped(dataset=None), SCHEMA)
    assert "dataset is empty (null)" in message and "remove the 'dataset:' line" in message


def test_warmup_must_leave_a_steady_epoch():
    assert epoch_problems({"warmup_epochs": 1, "max_epochs": 2}, "c") == []
    [message] = epoch_problems({"warmup_epochs": 4, "max_epochs": 3}, "c")
    assert message.startswith("c: warmup_epochs is 4 but max_epochs is 3, so no steady epoch")
    assert "warmup_epochs: 2" in message


@pytest.mark.parametrize("loader, init_args, expected", [
    ({"persistent_workers": True}, {}, "dataloader.persistent_workers is true but dataloader.num_workers is 0"),
    ({"prefetch_factor": 2}, {}, "dataloader.prefetch_factor is 2 but dataloader.num_workers is 0"),
    ({"num_workers": 2}, {"resident": True}, "dataloader.num_workers is 2 but data.init_args.resident is true"),
])
def test_loader_knobs_that_need_each_other(loader, init_args, expected):
    config = validated(shipped(dataloader=loader, data={"class_path": "x.Y", "init_args": init_args}))
    [message] = loader_problems(config, "c")
    assert expected in message


def test_loader_knobs_that_fit_together():
    config = validated(shipped(dataloader={"num_workers": 2, "persistent_workers": True, "prefetch_factor": 4},
                               data={"class_path": "x.Y", "init_args": {"resident": False}}))
    assert loader_problems(config, "c") == []


def test_split_must_sum_to_one():
    config = validated(shipped(dataset={"split": [0.5, 0.2, 0.2]}))
    [message] = dataset_problems(config, topologies(config), "c")
    assert "dataset.split [0.5, 0.2, 0.2] sums to 0.9, not 1" in message


def test_dataset_must_hold_a_global_batch_of_the_largest_topology():
    config = validated(shipped(topologies=["1x1", "2x2"], batch={"scaling": "weak", "size": 32},
                               dataset={"samples": 150}))
    [message] = dataset_problems(config, topologies(config), "c")
    assert "105 train samples, fewer than one global batch of 128 on '2x2'" in message
    enough = int(message.split("at least ")[1].split(" ")[0])
    assert split_sizes(enough, [0.7, 0.15, 0.15])["train"] >= 128 > split_sizes(enough - 1, [0.7, 0.15, 0.15])["train"]
    config["dataset"]["samples"] = enough
    assert dataset_problems(config, topologies(config), "c") == []


def test_fewest_samples_is_exact_and_gives_up_rather_than_hang():
    split, need = [0.7, 0.15, 0.15], {"train": 128, "val": 4, "test": 4}
    enough = fewest_samples(split, need)
    assert split_sizes(enough, split)["train"] >= 128 > split_sizes(enough - 1, split)["train"]
    # a validation fraction so small that no nearby size holds 8 samples: found far away, fast
    far = fewest_samples([0.999998, 0.000001, 0.000001], {"train": 1, "val": 8, "test": 8})
    assert far is not None and split_sizes(far, [0.999998, 0.000001, 0.000001])["val"] >= 8


def test_a_section_given_as_one_value_is_shown_as_keys():
    [message] = schema_problems(shipped(model="ddpscale.workloads.models.SpiralMLP"), SCHEMA)
    assert "model is 'ddpscale.workloads.models.SpiralMLP' (text) but must be a mapping of keys" in message
    assert "give its keys (class_path, init_args) indented below it, e.g. class_path: ddpscale.workloads.models.SpiralMLP" in message


def test_validation_split_needs_a_sample_per_device():
    config = validated(shipped(topologies=["1x1", "2x4"], batch={"scaling": "strong", "size": 8},
                               dataset={"samples": 20, "split": [0.9, 0.05, 0.05]}))
    [message] = dataset_problems(config, topologies(config), "c")
    assert "gives 1 val samples, fewer than one sample per device of '2x4' (8)" in message
    assert message.endswith("or give val a larger fraction in dataset.split")


def test_data_file_is_the_workflows_only_when_it_generates_the_data():
    init_args = {"data_file": "mine.npz"}
    generated = validated(shipped(data={"class_path": "x.Y", "init_args": init_args}))
    [message] = dataset_problems(generated, topologies(generated), "c")
    assert "remove data.init_args.data_file" in message
    own = validated(shipped(dataset={"generator": "none"}, data={"class_path": "x.Y", "init_args": init_args}))
    assert dataset_problems(own, topologies(own), "c") == []


def test_the_spiral_module_needs_the_generated_dataset():
    config = validated(shipped(dataset={"generator": "none"}))
    [message] = dataset_problems(config, topologies(config), "c")
    assert "dataset.generator is none, but data.class_path ddpscale.workloads.spiral_datamodule.SpiralDataModule" in message


def test_data_files_must_exist_before_any_run():
    config = validated(shipped(data={"class_path": "x.Y", "files": ["a.csv", "b.csv", "c.csv"]}))
    assert file_problems(config, "c", lambda path: path == "b.csv", lambda path: True) == [
        "c: data.files lists a.csv, c.csv, which do not exist (paths are relative to the directory snakemake "
        "runs in); fix the path or create the file"
    ]
    assert file_problems(config, "c", lambda path: True, lambda path: True) == []


def test_a_directory_or_device_as_a_data_file_is_refused(tmp_path):
    """Their checksum was null, so an edit inside a directory never reran anything."""
    (tmp_path / "folder").mkdir()
    (tmp_path / "ok.csv").write_text("x\n")
    files = [str(tmp_path / "ok.csv"), str(tmp_path / "folder"), "/dev/zero"]
    config = validated(shipped(data={"class_path": "x.Y", "files": files}))
    assert file_problems(config, "c") == [
        f"c: data.files lists {files[1]}, /dev/zero, which are not regular files (a directory or a device); list "
        "the files inside it that the data module reads"]


def test_config_source_names_the_default_first_and_relative(tmp_path):
    files = [tmp_path / "presets/fast.yaml", tmp_path / "config/config.yaml"]
    assert config_source(files, tmp_path) == "config/config.yaml + presets/fast.yaml"
    assert config_source([tmp_path / "config/config.yaml"], tmp_path) == "config/config.yaml"


@pytest.mark.parametrize("ddp, expected", [
    ({"bucket_cap_mb": -1}, "ddp.bucket_cap_mb is -1; it must be greater than 0"),
    ({"bucket_cap_mb": 0}, "ddp.bucket_cap_mb is 0; it must be greater than 0"),
    ({"bucket_cap_mb": 1e9}, "ddp.bucket_cap_mb is 1000000000.0; it must be at most 4096"),
    ({"bucket_cap_mb": float("inf")}, "ddp.bucket_cap_mb is inf; it must be at most 4096"),
    ({"bucket_cap_mb": True}, "ddp.bucket_cap_mb is true (true/false) but must be a number or null"),
    ({"bucket_cap_mb": "25; rm -rf ~"}, "ddp.bucket_cap_mb is '25; rm -rf ~' (text) but must be a number or null"),
    ({"find_unused_parameters": "yes"}, "ddp.find_unused_parameters is 'yes' (text) but must be true or false"),
    ({"comm_hook": "$(touch /tmp/x)"}, "ddp.comm_hook is '$(touch /tmp/x)' but must be one of: none, "
                                       "fp16_compress, bf16_compress"),
    ({"comm_hook": "fp16-compress"}, "did you mean 'fp16_compress'?"),
    ({"comm_hook": "torch.distributed.algorithms.ddp_comm_hooks.default_hooks.fp16_compress_hook"},
     "must be one of: none, fp16_compress, bf16_compress"),
    ({"find_unused_parameter": True}, "unknown key 'find_unused_parameter' in ddp; did you mean "
                                      "'find_unused_parameters'?"),
])
def test_hostile_ddp_settings_are_one_line_naming_the_key_and_the_file(ddp, expected):
    [message] = schema_problems(shipped(ddp=ddp), SCHEMA, "my.yaml")
    assert message.startswith("my.yaml: ") and expected in message and "\n" not in message


def test_a_nan_or_an_infinity_is_refused_where_the_schema_s_bounds_let_it_through():
    # every comparison with NaN is false, so `exclusiveMinimum` and `maximum` pass it
    [message] = schema_problems(shipped(ddp={"bucket_cap_mb": float("nan")}), SCHEMA, "my.yaml")
    assert message == "my.yaml: ddp.bucket_cap_mb is nan, which no setting can use; give a finite number"
    # a key with a minimum only took .inf (collective_timeout_s did: a collective that waited forever)
    [message] = schema_problems(shipped(accuracy={**SHIPPED["accuracy"], "tolerance": float("inf")}), SCHEMA,
                                lambda path: f"{path[0]}.yaml")
    assert message == "accuracy.yaml: accuracy.tolerance is inf, which no setting can use; give a finite number"
    [message] = schema_problems(shipped(dataset={**SHIPPED["dataset"], "split": [0.7, float("nan"), 0.15]}), SCHEMA)
    assert message.startswith("config/config.yaml: dataset.split[1] is nan")


@pytest.mark.parametrize("changes, expected", [
    ({"max_epochs": 10**18}, "max_epochs is 1000000000000000000; it must be at most 100000"),
    ({"batch": {"size": 10**12}}, "batch.size is 1000000000000; it must be at most 16777216"),
    ({"accumulate_grad_batches": 10**9}, "accumulate_grad_batches is 1000000000; it must be at most 100000"),
    ({"throughput": {"max_minutes": 1e300}}, "throughput.max_minutes is 1e+300; it must be at most 43200"),
    ({"throughput": {"max_steps": 10**20}}, "throughput.max_steps is 100000000000000000000; it must be at most"),
    ({"throughput": {"window_steps": 10**9}}, "throughput.window_steps is 1000000000; it must be at most 100000"),
    ({"dataloader": {"num_workers": 100000}}, "dataloader.num_workers is 100000; it must be at most 256"),
    ({"dataset": {"samples": 10**11}}, "dataset.samples is 100000000000; it must be at most 100000000"),
    ({"dataset": {"noise": 1e300}}, "dataset.noise is 1e+300; it must be at most 100"),
])
def test_a_number_no_run_can_use_is_refused_in_one_line(changes, expected):
    config = shipped(**{key: ({**SHIPPED.get(key, {}), **value} if isinstance(value, dict) else value)
                        for key, value in changes.items()})
    [message] = schema_problems(config, SCHEMA, "my.yaml")
    assert message.startswith("my.yaml: ") and expected in message and "\n" not in message


def test_ddp_defaults_are_torch_s_and_a_block_may_name_some_keys_only():
    import inspect

    torch = pytest.importorskip("torch")
    config = validated(shipped(ddp={"static_graph": True}))
    assert config["ddp"] == {"find_unused_parameters": False, "static_graph": True, "gradient_as_bucket_view": False,
                             "bucket_cap_mb": None, "comm_hook": "none"}
    assert setting_problems(config, topologies(config)) == []
    wrapper = inspect.signature(torch.nn.parallel.DistributedDataParallel.__init__).parameters
    for key in ("find_unused_parameters", "static_graph", "gradient_as_bucket_view", "bucket_cap_mb"):
        assert validated({})["ddp"][key] == wrapper[key].default


@pytest.mark.parametrize("name", ["data/{split}.csv", "a}.csv", "a\nb.csv"])
def test_a_data_file_name_snakemake_cannot_take_is_refused(name):
    config = validated(shipped(data={"class_path": "x.Y", "files": [name]}))
    assert file_problems(config, "c", lambda path: True, lambda path: True) == [
        f"c: data.files lists {name!r}, whose name holds a brace or a control character, which Snakemake "
        "cannot take as an input; rename the file"]


# -- settings the runs' devices cannot run (device_problems) --

def device_lines(runs_on="cpu", names=("1x1", "1x2"), trainer_args=None, gpu_torch=False, **changes) -> list[str]:
    """device_problems of the shipped config with changes, for runs on runs_on (the accelerator
    the plan resolved; config accelerator stays auto unless changed)."""
    config = validated(shipped(lightning_config="cli.yaml", **changes))
    where = {("precision",): "my.yaml", ("ddp", "comm_hook"): "hooks.yaml"}
    return device_problems(config, runs_on, [parse_topology(n) for n in names], trainer_args or {},
                           lambda key: where.get(key, "config/config.yaml"), gpu_torch)


def test_sync_batchnorm_on_cpu_processes_is_refused_before_ddp_dies():
    [line] = device_lines(trainer_args={"sync_batchnorm": True}, names=("1x1", "2x1", "1x2"))
    assert line.startswith("cli.yaml: trainer.sync_batchnorm is true, but every run here trains on CPU processes "
                           "(accelerator auto found too few GPUs here)")
    assert "SyncBatchNorm layers only work with GPU modules" in line and "so 2x1 would die" in line
    assert "remove trainer.sync_batchnorm here" in line and "\n" not in line
    assert "(accelerator is cpu)" in device_lines(trainer_args={"sync_batchnorm": True}, accelerator="cpu")[0]


@pytest.mark.parametrize("runs_on,names,trainer_args", [
    ("gpu", ("1x1", "1x2"), {"sync_batchnorm": True}),  # GPUs: what sync BN is for
    ("cpu", ("1x1",), {"sync_batchnorm": True}),  # one device trains without DDP: nothing to refuse
    ("cpu", ("1x1", "1x2"), {"sync_batchnorm": False, "gradient_clip_val": 0.5}),
])
def test_what_the_devices_can_run_is_accepted(runs_on, names, trainer_args):
    assert device_lines(runs_on, names, trainer_args) == []


def test_fp16_mixed_precision_on_cpu_is_refused_where_lightning_would_train_bf16():
    [line] = device_lines(precision="16-mixed", names=("1x1",))
    assert line.startswith("my.yaml: precision is 16-mixed, but every run here trains on CPU processes")
    assert "Lightning would train bf16-mixed instead" in line and "set precision: bf16-mixed or 32-true" in line
    assert device_lines("gpu", precision="16-mixed") == []
    assert device_lines(precision="bf16-mixed") == device_lines(precision="16-true") == []


def test_the_bf16_hook_is_refused_only_where_torch_has_no_cuda():
    hook = {"ddp": {"comm_hook": "bf16_compress"}}
    [line] = device_lines(gpu_torch=False, **hook)
    assert line.startswith("hooks.yaml: ddp.comm_hook is bf16_compress, but torch here is built without CUDA")
    assert "set ddp.comm_hook: fp16_compress" in line and "so 1x2 would die" in line
    assert device_lines(gpu_torch=True, **hook) == device_lines(gpu_torch=None, **hook) == []
    assert device_lines(gpu_torch=False, names=("1x1",), **hook) == []


def test_torch_s_build_is_read_without_importing_it(tmp_path):
    import importlib.util

    from ddpscale.run.ddpsettings import torch_built_with_gpu

    def spec_at(folder):
        return lambda name: importlib.util.spec_from_file_location(name, folder / "__init__.py",
                                                                   submodule_search_locations=[str(folder)])

    for cuda, hip, built in (("'12.4'", "None", True), ("None", "'6.2'", True), ("None", "None", False)):
        folder = tmp_path / f"torch{built}{cuda}"
        folder.mkdir()
        (folder / "version.py").write_text(f"from typing import Optional\n__version__ = '2.13.0'\n"
                                           f"cuda: Optional[str] = {cuda}\nhip: Optional[str] = {hip}\n")
        assert torch_built_with_gpu(spec_at(folder)) is built
    assert torch_built_with_gpu(lambda name: None) is None
    assert torch_built_with_gpu(spec_at(tmp_path)) is None  # no version.py there
    import torch  # the installed torch, read both ways

    assert torch_built_with_gpu() is (torch.version.cuda is not None or torch.version.hip is not None)


@pytest.mark.parametrize("accumulate,static,names,refused", [
    (2, True, ["1x1", "1x2"], True),
    (1, True, ["1x1", "1x2"], False),  # a static graph alone trains
    (2, False, ["1x1", "1x2"], False),  # accumulation alone trains
    (2, True, ["1x1"], False),  # one device trains without DDP
])
def test_a_static_graph_under_accumulation_is_refused_where_ddp_runs(accumulate, static, names, refused):
    """torch's DDP asserts at the first step of such a run (tests/workflow/test_probe.py shows it
    in training): every topology above one device would die after 1x1 had trained."""
    config = validated(shipped(topologies=names, accumulate_grad_batches=accumulate, ddp={"static_graph": static}))
    problems = setting_problems(config, topologies(config), "mine.yaml")
    said = [p for p in problems if "static_graph" in p]
    assert len(said) == int(refused), problems
    if refused:
        assert said[0].startswith(f"mine.yaml: ddp.static_graph: true cannot start under gradient accumulation "
                                  f"(accumulate_grad_batches {accumulate}")
        assert "set ddp.static_graph: false or accumulate_grad_batches: 1" in said[0] and "\n" not in said[0]


def test_a_step_s_ddp_error_is_named_by_its_setting():
    from ddpscale.run import ddpsettings

    static = RuntimeError("Your training graph has changed in this iteration ... not compatible with static_graph "
                          "set to True.")
    assert ddpsettings.step_error_line(static, {}, 1).endswith("set ddp.static_graph: false in your config")
    hooks = RuntimeError('expect_autograd_hooks_ INTERNAL ASSERT FAILED at "reducer.cpp":1732, please report a bug')
    assert "accumulate_grad_batches 4" in ddpsettings.step_error_line(hooks, {"static_graph": True}, 4)
    assert ddpsettings.step_error_line(hooks, {"static_graph": False}, 4) is None  # another cause: torch's text
    assert ddpsettings.step_error_line(RuntimeError("CUDA out of memory"), {"static_graph": True}, 4) is None
