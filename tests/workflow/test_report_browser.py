"""report.html as a reader sees it: opened in headless Chromium (tests/browser.py), checked for
the verdict first, then the tables, then every plot actually decoded, and screenshotted.

The report contract: <section id="verdict"> (a one-sentence recommendation and the accuracy
verdict), then <section id="tables"> (tables, each under an <h2>/<h3>), then
<section id="plots"> (at least 5 <figure><img alt src="data:image/png..."><figcaption>).
The checks are first run on generated pages, so each is known to be able to fail.
"""

from __future__ import annotations

import base64
import io
import shutil

import matplotlib

matplotlib.use("Agg")
import matplotlib.image
import matplotlib.pyplot as plt
import numpy as np
import pytest

import browser
import system_tools
from conftest import ROOT, Workspace, clean_distributed_env, tiny_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]  # may include installing chromium
ARTIFACT = ROOT / "results/test-artifacts/report-screenshot.png"  # results/ is git-ignored


@pytest.fixture(scope="module")
def chromium():
    return system_tools.require(browser.CHROMIUM, "chromium")


@pytest.fixture(scope="module")
def report_html(chromium, tmp_path_factory):
    """The real local workflow, once for this module, in a throwaway copy of the repository."""
    workspace = Workspace(tmp_path_factory.mktemp("browser") / "ws")
    # 3 repeats: the screenshot then shows the spread and the 95% interval too
    workspace.write_config(tiny_config(topologies=["1x1", "1x2"], repeats=3))
    # conftest's autouse env cleaning is per test and runs after module fixtures: do it here.
    with pytest.MonkeyPatch.context() as env:
        clean_distributed_env(env)
        result = workspace.snakemake(timeout=400)
    assert result.returncode == 0, result.stderr[-4000:]
    return workspace.results / "report/report.html"


def png_uri(seed: int) -> str:
    """A small colourful plot, like the report's, as a data: URI."""
    fig, ax = plt.subplots(figsize=(4, 3), dpi=80)
    for k in range(3):
        ax.plot(np.random.default_rng(seed + k).random(10), lw=2)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def sample_report(order=("verdict", "tables", "plots"), plots: int = 5) -> str:
    """A page with the contract's structure, its sections in the given order."""
    rows = "".join(f"<tr><td>1x{n}</td><td>{n * 0.9:.2f}</td></tr>" for n in (1, 2, 4))
    sections = {
        "verdict": '<section id="verdict"><p>Use 1x2: 1.8x speedup at 90% efficiency; '
                   "accuracy held in all topologies.</p></section>",
        "tables": '<section id="tables">' + "".join(
            f"<h2>Table {t}</h2><table><tr><th>topology</th><th>speedup</th></tr>{rows}</table>"
            for t in range(2)) + "</section>",
        "plots": '<section id="plots">' + "".join(
            f'<figure><img alt="plot {p}" src="{png_uri(p)}"><figcaption>Plot {p}</figcaption></figure>'
            for p in range(plots)) + "</section>",
    }
    body = "".join(sections[name] for name in order)
    return f"<!doctype html><html><head><title>sample</title></head><body><h1>ddpscale</h1>{body}</body></html>"


def layout_problems(layout: dict) -> list[str]:
    """Where the rendered page breaks the report contract; empty when it keeps it."""
    verdict, tables, images = layout["verdict"], layout["tables"], layout["images"]
    if not verdict["exists"]:
        return ["no #verdict element"]
    problems = []
    if "accuracy" not in verdict["text"].lower():
        problems.append(f"#verdict does not state the accuracy verdict: {verdict['text']!r}")
    if not tables:
        problems.append("no <table>")
    for t in tables:
        if t["rows"] < 2 or t["height"] <= 0:
            problems.append(f"table {t['heading']!r} is empty or not rendered: {t}")
        if not t["heading"] or t["heading_tag"] not in ("h2", "h3", "caption"):
            problems.append(f"table without its own h2/h3 heading: {t}")
    if len(images) < 5:
        problems.append(f"{len(images)} images, want at least 5 plots")
    for img in images:
        if not img["complete"] or img["naturalWidth"] <= 0 or img["naturalHeight"] <= 0:
            problems.append(f"image {img['alt']!r} did not decode")
        if img["width"] <= 100:
            problems.append(f"image {img['alt']!r} is {img['width']:.0f} px wide")
        if not img["alt"] or not img["caption"]:
            problems.append(f"image without alt text or figcaption: {img['alt']!r}")
    first_table = min((t["top"] for t in tables), default=float("inf"))
    if verdict["top"] >= first_table or any(verdict["top"] >= img["top"] for img in images):
        problems.append("#verdict is not above the tables and plots")
    if any(img["top"] <= first_table for img in images):
        problems.append("a plot is above the first table")
    return problems


def screenshot_problems(png, width: int) -> list[str]:
    """Whether a capture shows a rendered, colourful page rather than a blank one."""
    pixels = matplotlib.image.imread(png)[..., :3]  # floats in 0..1; drop alpha
    problems = [] if pixels.shape[1] == width else [f"{pixels.shape[1]} px wide, asked {width}"]
    inked = (pixels < 0.9).any(axis=-1).mean()
    rgb = (pixels * 255).astype(np.uint32)  # packed into one int: unique(axis=0) takes seconds
    colours = len(np.unique(rgb[..., 0] << 16 | rgb[..., 1] << 8 | rgb[..., 2]))
    saturated = (pixels.max(axis=-1) - pixels.min(axis=-1) > 0.3).mean()
    if inked < 0.005:
        problems.append(f"blank: only {inked:.2%} of pixels are not white")
    if colours < 200 or saturated < 0.002:
        problems.append(f"no plots: {colours} distinct colours, {saturated:.2%} saturated pixels")
    return problems


# --- the checks themselves, on generated pages ---------------------------------------------

def test_probe_sees_a_corrupt_image(chromium, tmp_path):
    page = tmp_path / "broken.html"
    bad = "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\nnot really").decode()
    page.write_text(f'<html><body><img alt="good" src="{png_uri(0)}"><img alt="bad" src="{bad}"></body></html>')
    images = {img["alt"]: img for img in browser.rendered_layout(page)["images"]}
    assert images["good"]["naturalWidth"] > 0 and images["good"]["complete"]
    assert images["bad"]["naturalWidth"] == 0


def test_checks_accept_a_page_in_contract_order(chromium, tmp_path):
    page = tmp_path / "sample.html"
    page.write_text(sample_report())
    layout = browser.rendered_layout(page)
    assert layout_problems(layout) == []
    png = browser.screenshot(page, tmp_path / "sample.png", height=browser.page_height(layout))
    assert screenshot_problems(png, 1280) == []
    assert matplotlib.image.imread(png).shape[0] == browser.page_height(layout)


@pytest.mark.parametrize("order, plots, expected", [
    (("tables", "plots", "verdict"), 5, "#verdict is not above"),
    (("verdict", "plots", "tables"), 5, "a plot is above the first table"),
    (("verdict", "tables", "plots"), 3, "3 images, want at least 5"),
])
def test_checks_reject_a_page_out_of_contract(chromium, tmp_path, order, plots, expected):
    page = tmp_path / "sample.html"
    page.write_text(sample_report(order, plots))
    assert any(expected in p for p in layout_problems(browser.rendered_layout(page)))


def test_screenshot_check_rejects_a_blank_page(chromium, tmp_path):
    page = tmp_path / "blank.html"
    page.write_text("<html><body><p>.</p></body></html>")
    png = browser.screenshot(page, tmp_path / "blank.png", height=600)
    assert any("blank" in p for p in screenshot_problems(png, 1280))


# --- the real report -----------------------------------------------------------------------

def test_report_renders_verdict_tables_and_every_plot(report_html):
    layout = browser.rendered_layout(report_html)
    assert layout_problems(layout) == []


def test_report_screenshot(report_html, tmp_path):
    png = browser.screenshot(report_html, tmp_path / "report-screenshot.png")
    ARTIFACT.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(png, ARTIFACT)  # for a person to look at; the test reads its own copy
    assert screenshot_problems(png, 1280) == []
