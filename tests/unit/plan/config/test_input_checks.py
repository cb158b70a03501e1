"""Inputs that cannot work are named in one line before any job: an earlier table the comparison
cannot read (ddpscale.core.earliertable), data that is the experiment's own output or the
system's, an experiment named like a folder results/ already uses, and nested numbers given with
--config (ddpscale.plan.config.check.input_problems)."""

from __future__ import annotations

import pytest
import yaml
from helpers.workflow import ROOT
from ddpscale.core import earliertable
from ddpscale.plan.config.check import input_problems, override_problems
from snakemake.cli import parse_config

ADVERSARIAL = ROOT / "tests/fixtures/adversarial"


SCHEMA = yaml.safe_load((ROOT / "workflow/schemas/config.schema.yaml").read_text())


def source(key):
    return "overlay.yaml"


@pytest.mark.parametrize("name, said", [
    ("duplicate_topology", "line 4: topology '1x1' is listed twice (one row per topology)"),
    ("text_in_number", "line 3: throughput_samples_s is 'fast', which is not a number"),
    ("missing_column", "is not a ddpscale scaling.tsv (no column efficiency)"),
    ("not_utf8", "is not a ddpscale scaling.tsv (not UTF-8 text)"),
])
def test_an_earlier_table_the_comparison_cannot_read_is_named_with_its_line(name, said):
    path = ADVERSARIAL / f"input_compare_{name}.tsv"
    assert earliertable.problem(path) == f"{path} {said}"


def test_an_earlier_table_with_missing_numbers_passes_and_pandas_reads_it_alike():
    import pandas as pd

    path = ADVERSARIAL / "input_compare_valid.tsv"
    assert earliertable.problem(path) is None
    table = pd.read_csv(path, sep="\t")
    assert table["topology"].is_unique and pd.api.types.is_float_dtype(table["efficiency"])


def test_an_earlier_table_row_of_the_wrong_width_a_folder_and_a_huge_file_are_named(tmp_path):
    path = tmp_path / "scaling.tsv"
    path.write_text("topology\tthroughput_samples_s\tefficiency\tfit_time_s\n1x1\t1\t1\n")
    assert earliertable.problem(path) == f"{path} line 2 has 3 cells but the header 4"
    assert earliertable.problem(tmp_path).startswith(f"{tmp_path} cannot be read")
    path.write_bytes(b"topology\tthroughput_samples_s\tefficiency\tfit_time_s\n" + b"0" * (5 << 20))
    assert earliertable.problem(path) == f"{path} is not a ddpscale scaling.tsv (larger than 4 MiB)"


@pytest.mark.parametrize("files, init_args, said", [
    (["/proc/self/environ"], {}, "data.files lists '/proc/self/environ', a file of the running system"),
    (["/dev/zero"], {}, "data.files lists '/dev/zero', a file of the running system"),
    ([], {"data_file": "/sys/kernel/notes"}, "data.init_args.data_file is '/sys/kernel/notes', a file of the running"),
    (["results/exp/runs/1x1/r0/metrics.json"], {}, ("data.files lists 'results/exp/runs/1x1/r0/metrics.json', "
                                                    "which is this experiment's own output (results/exp/)")),
    (["./results/exp/../exp/data/spiral.npz"], {}, ("data.files lists './results/exp/../exp/data/spiral.npz', "
                                                   "which is this experiment's own output (results/exp/)")),
])
def test_data_that_is_the_experiments_own_output_or_the_systems_is_refused(files, init_args, said):
    config = {"experiment": "exp", "data": {"files": files, "init_args": init_args}}
    found = input_problems(config, {}, source)
    assert len(found) == 1 and found[0].startswith(f"overlay.yaml: {said}"), found


def test_data_of_another_experiment_or_outside_results_passes():
    config = {"experiment": "exp", "data": {"files": ["results/other/data/x.npz", "data/points.csv"]}}
    assert input_problems(config, {}, source) == []


@pytest.mark.parametrize("name", ["runs", "report", "Data", "logs", "checkpoints"])
def test_an_experiment_named_like_a_legacy_folder_of_results_is_refused(name):
    found = input_problems({"experiment": name}, {}, source)
    assert found == [(f"overlay.yaml: experiment is {name!r}, but results/{name}/ is a folder of results/ as it was "
                      "before experiments had their own (data, runs, logs, checkpoints, report), so its runs would "
                      "mix with those; set experiment: to another name")]


def test_a_model_class_named_like_a_legacy_folder_is_said_as_such():
    found = input_problems({"experiment": None, "model": {"class_path": "lab.models.Report"}}, {}, source)
    assert len(found) == 1 and "experiment is null, so the model class's name, 'report'" in found[0]


@pytest.mark.parametrize("name", ["workflow", "config", "scripts", "results", "tests", "docs", "spiralmlp"])
def test_other_names_pass_since_an_experiment_lives_under_results(name):
    """results/<name>/: a project folder's name is no clash there."""
    assert input_problems({"experiment": name}, {}, source) == []


@pytest.mark.parametrize("argument, said", [
    ("report={efficiency_threshold: 0.8}", "report.efficiency_threshold arrives as the text '0.8'"),
    ('model={"init_args": {"hidden": 64}}', "model.init_args.hidden arrives as the text '64'"),
    ("dataset={split: [0.8, 0.1, 0.1]}", "dataset.split[0] arrives as the text '0.8'"),
    ("trainer={deterministic: true}", "trainer.deterministic arrives as the text 'true'"),
])
def test_a_nested_number_given_with_config_is_said_to_need_an_overlay_file(argument, said):
    """As Snakemake 9 parses --config (snakemake.cli.parse_config)."""
    found = override_problems(parse_config([argument]), SCHEMA)
    assert found == [(f"--config: {said}: Snakemake reads a mapping or list given with --config as text throughout; "
                      f"put nested keys in an overlay file and pass it with --configfile (e.g. a file holding "
                      f"`{argument.split('=')[0]}: {{...}}`)")]


@pytest.mark.parametrize("argument", ["repeats=3", "topologies=[1x1, 2x4]", "measure=full", "report={note: fast}",
                                      # text where the schema takes text, though YAML would read 0x2 as 2
                                      "topologies=[0x2, 1x1]"])
def test_top_level_values_and_nested_text_pass(argument):
    assert override_problems(parse_config([argument]), SCHEMA) == []
