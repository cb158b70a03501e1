"""Every setting reaches train.py and report.py as the value it is: one that begins with "-"
is never read as a flag, and settings longer than a command line may be reach the job through
the args file the workflow writes (ddpscale.run.argsfile)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import shlex
import threading

import pytest
import yaml
from helpers.configs import BASE, default_config, plan
from helpers.workflow import ROOT
from ddpscale.run import argsfile, runspec
from ddpscale.run.runspec import RunSpec

# a command line's longest argument on Linux (MAX_ARG_STRLEN): the whole shell line of a rule
# is one argument of `bash -c`
MAX_ARG_STRLEN = 128 * 1024
DASHED = yaml.safe_load((ROOT / "tests/fixtures/adversarial/args_dash_values.yaml").read_text())


def report_script():
    spec = importlib.util.spec_from_file_location("report_script", ROOT / "scripts/report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def dashed_config(**changes) -> dict:
    config = default_config(**changes)
    config["accuracy"].update(DASHED["accuracy"])
    return config


def huge_config() -> dict:
    config = default_config()
    config["data"]["init_args"] = huge_init_args()
    return config


def huge_init_args() -> dict:
    """A data module's init arguments of about 200 KB: a list of 5,000 shard paths."""
    return {"shards": [f"/data/shards/part-{i:05d}-of-05000.tar" for i in range(5000)]}


def test_values_that_begin_with_a_dash_read_back_as_values():
    spec = RunSpec(**{**BASE, "model_class": "-pkg.Net", "data_class": "-pkg.Data"}, accuracy_metric="-neg_loss",
                   epoch_metric="-neg_val_loss", site_interconnect="-ib", metrics="-m.json", ckpt_dir="-ckpt",
                   data_file="-d.npz", precision="32-true")
    assert runspec.parse(spec.argv()) == spec
    assert runspec.parse([*spec.argv(rerun=True), *spec.argv(rerun=False), "--attempt=2"]) == spec.replace(attempt=2)


def test_the_plans_spec_with_dashed_config_values_reads_back(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    p = plan(dashed_config())
    spec = p.spec("1x1", 0)
    assert (spec.accuracy_metric, spec.epoch_metric) == ("-neg_loss", "-neg_val_loss")
    argv = [*shlex.split(p.run_flags("1x1", 0, write=True)), *shlex.split(p.log_flags("1x1", 0)), "--attempt", "1"]
    assert runspec.parse(argv) == spec


def test_the_reports_dashed_settings_read_back_as_values():
    p = dataclasses.replace(plan(dashed_config()), config_source="-odd.yaml")
    args = report_script().parse_args([*p.report_argv({}), "--metrics", "m.json"])
    assert (args.accuracy_metric, args.accuracy_target, args.config_files) == ("-neg_loss", -0.5, "-odd.yaml")
    assert args.expected == p.topology_names and args.metrics == ["m.json"]


def test_init_args_past_the_command_lines_limit_reach_the_job(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = default_config()
    config["data"]["init_args"] = huge_init_args()
    assert len(json.dumps(config["data"]["init_args"])) > 200_000
    p = plan(config)
    flags, log_flags = p.run_flags("1x2", 0, write=True), p.log_flags("1x2", 0)
    # what the rule's shell line holds stays far below one argument's limit
    assert len(flags) + len(log_flags) < MAX_ARG_STRLEN // 32
    spec = runspec.parse([*shlex.split(flags), *shlex.split(log_flags), "--attempt", "1"])
    assert spec == p.spec("1x2", 0) and spec.data_args == huge_init_args()
    args = report_script().parse_args([*shlex.split(p.report_flags({}, write=True)), "--metrics", "m.json"])
    assert args.data_args == huge_init_args()


def test_the_records_of_thousands_of_runs_reach_the_report(tmp_path, monkeypatch):
    """The report's --metrics lists every run: 40 topologies of 100 repeats are 4,000 paths."""
    monkeypatch.chdir(tmp_path)
    p = plan(default_config())
    paths = [p.layout.metrics(f"{n}x8", r) for n in range(1, 41) for r in range(100)]
    flags = p.report_flags({}, write=True, metrics=paths, rule="partial_report")
    assert len(flags) < MAX_ARG_STRLEN // 32 and "args/partial_report.json" in flags
    assert report_script().parse_args(shlex.split(flags)).metrics == paths
    short = p.report_flags({}, write=False, metrics=paths[:3])
    assert argsfile.FILE_FLAG not in short and report_script().parse_args(shlex.split(short)).metrics == paths[:3]


def test_a_setting_changed_changes_the_param_and_the_log_flags_do_not():
    """The param Snakemake records reruns the job when any setting changes, and only then."""
    base = plan(default_config())
    settings = base.run_settings("1x1", 0)
    assert plan(default_config()).run_settings("1x1", 0) == settings
    assert plan(default_config(seed=5)).run_settings("1x1", 0) != settings
    other_metric = default_config()
    other_metric["accuracy"]["metric"] = "val_loss"
    assert plan(other_metric).run_settings("1x1", 0) == settings
    assert plan(other_metric).run_flags("1x1", 0, write=False) == base.run_flags("1x1", 0, write=False)
    assert plan(other_metric).log_flags("1x1", 0) != base.log_flags("1x1", 0)


def test_snakemake_records_the_settings_as_earlier_versions_passed_them():
    """The recorded param keeps the `--flag value` text the command line held before the args
    file, so an upgrade retrains no finished run."""
    spec = plan(dashed_config()).spec("1x2", 0)
    expected = [word for arg in spec.argv(rerun=True) for word in arg.split("=", 1)]
    assert shlex.split(spec.recorded()) == expected and "-neg_loss" not in expected


def test_settings_that_fit_stay_on_the_command_line_where_a_dry_run_shows_them(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    p = plan(default_config())
    flags = p.run_flags("1x2", 0, write=True)
    assert argsfile.FILE_FLAG not in flags and "--num-nodes=1 --devices-per-node=2 " in flags
    assert not (tmp_path / "results").exists()
    assert argsfile.FILE_FLAG in plan(huge_config()).run_flags("1x2", 0, write=False)


def test_a_dry_run_writes_no_file_and_an_unchanged_one_is_not_rewritten(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    p = plan(huge_config())
    p.run_flags("1x1", 0, write=False)
    p.report_flags({}, write=False)
    assert not (tmp_path / "results").exists()
    p.run_flags("1x1", 0, write=True)
    path = tmp_path / p.layout.run_args("1x1", 0)
    before = os.stat(path)
    p.run_flags("1x1", 0, write=True)
    assert os.stat(path).st_ino == before.st_ino and os.stat(path).st_mtime_ns == before.st_mtime_ns


@pytest.mark.parametrize("damage, said", [
    (lambda path: path.write_text(path.read_text().replace('"--max-epochs=', '"--max-epochs=1')),
     "but the job was started with"),
    (lambda path: path.write_text("{oops"), "not valid JSON"),
    (lambda path: path.write_text('{"argv": [1]}'), 'expected {"argv": [flags as text]}'),
    (lambda path: path.unlink(), "cannot read this job's settings"),
])
def test_a_changed_or_damaged_args_file_is_refused_in_one_line(tmp_path, monkeypatch, capsys, damage, said):
    monkeypatch.chdir(tmp_path)
    p = plan(huge_config())
    flags = shlex.split(p.run_flags("1x1", 0, write=True))
    path = tmp_path / p.layout.run_args("1x1", 0)
    damage(path)
    with pytest.raises(SystemExit) as exited:
        runspec.parse(flags)
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert exited.value.code == 2 and said in line and p.layout.run_args("1x1", 0) in line


def test_an_args_file_that_is_a_fifo_is_refused_not_waited_on(tmp_path):
    path = tmp_path / "args.json"
    os.mkfifo(path)
    outcome = []

    def read():
        try:
            argsfile.read(path, "0" * 64)
        except ValueError as err:
            outcome.append(str(err))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout=10)  # a state wait: the read ends (refused) or hangs on the FIFO
    assert not reader.is_alive(), "reading a FIFO hung"
    assert outcome and "a FIFO, not a regular file" in outcome[0]


def test_one_of_the_pair_alone_is_refused():
    with pytest.raises(ValueError, match="come together"):
        argsfile.expand(["--args-file=x.json", "--seed=1"])
    assert argsfile.expand(["--seed=1"]) == ["--seed=1"]
