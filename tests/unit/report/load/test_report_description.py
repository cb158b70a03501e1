"""Snakemake's own report (`snakemake --report`): its description (workflow/report/workflow.rst,
rendered as Snakemake renders it, Jinja2 then docutils) says what ran, CPU processes or GPUs,
from the config, and points to report.html, which holds the verdict."""
import re

import pytest
import yaml
from docutils.core import publish_parts
from jinja2 import Environment

from helpers.workflow import ROOT

RST = ROOT / "workflow/report/workflow.rst"


def description(**config) -> str:
    """The description's text as Snakemake's report shows it (its Environment settings)."""
    class Snakemake:
        pass

    Snakemake.config = {**yaml.safe_load((ROOT / "config/config.yaml").read_text()), **config}
    text = Environment(trim_blocks=True, lstrip_blocks=True).from_string(RST.read_text()).render(snakemake=Snakemake)
    html = publish_parts(text, writer_name="html", settings_overrides={"report_level": 5})["html_body"]
    assert "system-message" not in html, html
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", html))


@pytest.mark.parametrize("accelerator", ["cpu", "gpu", "auto"])
def test_description_points_to_report_html(accelerator):
    text = description(accelerator=accelerator, topologies=["1x1", "2x4"], baseline="1x1")
    assert "Read report.html first: the verdict" in text
    assert "topologies 1x1, 2x4 against the baseline 1x1" in text


def test_description_says_what_ran():
    assert "Each device was a GPU (accelerator: gpu)." in description(accelerator="gpu")
    assert "CPU" not in description(accelerator="gpu")
    assert "Each device was a CPU process standing in for a GPU" in description(accelerator="cpu")
    auto = description(accelerator="auto")
    assert "a GPU where there were enough for every topology, else a CPU process" in auto
    assert "report.html names the devices the runs used" in auto

