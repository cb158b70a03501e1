"""The report says what it measured (report.load.description): in its head and on every scaling.tsv row."""

from __future__ import annotations

import pandas as pd

from helpers.records import make_run
from ddpscale.report.load import description

SPIRAL = {"generator": "spiral", "samples": 10000, "noise": 0.2, "seed": 1234, "split": [0.7, 0.15, 0.15]}


def test_the_description_reads_the_runs_and_the_workflow():
    runs = pd.DataFrame([make_run("1x1", model_parameters=3234, scaling="strong", effective_batch=64,
                                  batch_per_device=64, precision="32-true", max_epochs=3, compile="none"),
                         make_run("1x2", model_parameters=3234, scaling="strong", effective_batch=64,
                                  batch_per_device=32, precision="32-true", max_epochs=3, compile="none")])
    runs["model_class"], runs["data_class"] = "pkg.models.SpiralMLP", "pkg.data.SpiralDataModule"
    text = description.describe(runs, "spiralmlp", "config/config.yaml + my.yaml", SPIRAL, {"resident": True})
    assert text == {
        "experiment": "spiralmlp", "model_class": "pkg.models.SpiralMLP", "model_parameters": "3234",
        "data_class": "pkg.data.SpiralDataModule",
        "dataset": "spiral (generated): 10000 samples, noise 0.2, seed 1234, split 0.7/0.15/0.15",
        "config_files": "config/config.yaml + my.yaml", "max_epochs": "3", "batch_scaling": "strong",
        "batch_size": "64", "precision": "32-true", "compile": "none", "optimizers": "Adam",
        "trainer_settings": "ddpscale's", "module_callbacks": "none", "ddp": "torch's defaults",
        "loggers": "CSVLogger"}
    assert description.headline(text) == "spiralmlp: SpiralMLP (3,234 parameters) on SpiralDataModule"
    table = description.with_columns(pd.DataFrame({"topology": ["1x1", "1x2"], "speedup": [1.0, 1.8]}), text)
    assert list(table.columns) == ["topology", *description.COLUMNS, "speedup"]
    assert table["model_parameters"].tolist() == ["3234", "3234"]


def test_weak_scaling_names_the_batch_per_device_and_strong_with_accumulation_the_step_batch():
    weak = pd.DataFrame([make_run("1x2", scaling="weak", batch_per_device=32, effective_batch=64)])
    assert description.describe(weak)["batch_size"] == "32"
    strong = pd.DataFrame([make_run("1x2", scaling="strong", batch_per_device=16, effective_batch=128,
                                    accumulate_grad_batches=4)])
    assert description.describe(strong)["batch_size"] == "32"


def test_a_data_module_with_its_own_data_is_named_with_its_arguments():
    text = description.dataset_text({"generator": "none"}, {"vocab_size": 256, "seq_len": 64},
                                 "ddpscale.workloads.markov_datamodule.MarkovTokens")
    assert text == "the data module's own (MarkovTokens: vocab_size 256, seq_len 64)"


def test_the_optimizer_and_further_trainer_settings_are_named():
    runs = pd.DataFrame([make_run("1x1", optimizers=["AdamW"], trainer_settings={"gradient_clip_val": 0.5}),
                         make_run("1x2", optimizers=["AdamW"], trainer_settings={"gradient_clip_val": 0.5})])
    text = description.describe(runs)
    assert text["optimizers"] == "AdamW" and text["trainer_settings"] == "gradient_clip_val 0.5"
    plain = description.describe(pd.DataFrame([make_run("1x1", optimizers=["SGD"], trainer_settings={})]))
    assert plain["trainer_settings"] == "ddpscale's"


def test_the_ddp_settings_are_named_where_they_are_not_torch_s():
    """A 1-device run records the settings unused; the report names the settings, not that."""
    ddp = {"find_unused_parameters": True, "static_graph": False, "gradient_as_bucket_view": False,
           "bucket_cap_mb": 50, "comm_hook": "bf16_compress", "comm_bytes_per_element": 2}
    runs = pd.DataFrame([make_run("1x1", ddp={**ddp, "used": False}), make_run("1x2", ddp={**ddp, "used": True})])
    assert description.describe(runs)["ddp"] == "find_unused_parameters true, bucket_cap_mb 50, comm_hook bf16_compress"
    plain = {k: v for k, v in ddp.items() if k == "comm_bytes_per_element"}
    assert description.describe(pd.DataFrame([make_run("1x2", ddp=plain)]))["ddp"] == "torch's defaults"
    assert description.LABELS["ddp"] == "DDP settings"


def test_the_rendered_report_names_every_setting_that_changes_what_a_step_is():
    """Accumulation, clipping, sync BN, precision and DDP's settings: a reader comparing two reports
    must see each on the page, accumulation too (a config key of ddpscale's, not a CLI argument)."""
    import re

    from ddpscale.report.render import html as report_html
    from ddpscale.report import reportdata

    step = {"trainer_settings": {"gradient_clip_val": 0.5, "sync_batchnorm": True}, "precision": "bf16-mixed",
            "accumulate_grad_batches": 4, "scaling": "weak", "batch_per_device": 16,
            "ddp": {"find_unused_parameters": True, "static_graph": False, "gradient_as_bucket_view": False,
                    "bucket_cap_mb": None, "comm_hook": "fp16_compress", "comm_bytes_per_element": 2}}
    runs = pd.DataFrame([make_run("1x1", **step, effective_batch=64),
                         make_run("1x2", **step, effective_batch=128, throughput_samples_s=190.0)])
    data = reportdata.build(runs, {}, baseline="1x1", metric="test_acc", tolerance=0.02, threshold=0.8,
                            expected=[], repeats=1, log_tails={})
    page = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", report_html.build_report(data, {})))
    for said in ("Trainer settings accumulate_grad_batches 4, gradient_clip_val 0.5, sync_batchnorm true",
                 "Precision bf16-mixed", "DDP settings find_unused_parameters true, comm_hook fp16_compress"):
        assert said in page, said
    plain = description.describe(pd.DataFrame([make_run("1x1", trainer_settings={})]))
    assert plain["trainer_settings"] == "ddpscale's"  # accumulate_grad_batches 1 is Lightning's default
