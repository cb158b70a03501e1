"""report.html as a reader sees it: opened in headless Chromium (tests/helpers/browser.py), checked for
the verdict first, then the tables, then every plot actually decoded, and screenshotted; and the
first screen (issue 33): the answer, its plot and the decision table inside 1280 x 900, every
section folding open and shut, the printed PDF holding every section, no two plot labels on top
of each other; each figure linking its SVG and PDF beside the page; and the page printed on A4
and on US Letter with every column of the decision and scaling tables on the paper.

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

from helpers import browser, system_tools
from helpers.training import clean_distributed_env
from helpers.workflow import ROOT, Workspace, tiny_config

from . import report_sample

# on one xdist worker: each worker would run the module's fixture (real training) again; the
# timeout may include installing chromium
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("report-browser"), pytest.mark.timeout(900)]
ARTIFACT = ROOT / "results/test-artifacts/report-screenshot.png"  # results/ is git-ignored


@pytest.fixture(scope="module")
def chromium():
    return system_tools.require(browser.CHROMIUM, "chromium")


@pytest.fixture(scope="module")
def pdftotext():
    return system_tools.require(browser.PDFTOTEXT, "poppler-utils")


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


@pytest.fixture(scope="module")
def sample_html(chromium, tmp_path_factory):
    """A cluster-like report from made-up records (tests/workflow/report_sample.py): seconds, not minutes."""
    return report_sample.build(tmp_path_factory.mktemp("sample")) / "report.html"


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


VIEWPORT = (1280, 900)


def first_screen_problems(layout: dict) -> list[str]:
    """The answer, the speedup plot and the decision table must be inside the first 1280 x 900."""
    problems = []
    for name, where in layout["first"].items():
        if where is None:
            problems.append(f"no {name} on the page")
        elif where["bottom"] > VIEWPORT[1] or where["height"] <= 0:
            problems.append(f"the {name} ends at {where['bottom']:.0f} px, below the first {VIEWPORT[1]} px")
    return problems


def section_problems(layout: dict) -> list[str]:
    """Every section starts closed with its one-line summary showing, opens on a click and closes on another."""
    problems = [] if layout["sections"] else ["no <details class=section>"]
    for s in layout["sections"]:
        name = s["heading"] or s["id"]
        if s["wasOpen"]:
            problems.append(f"{name} is open before anyone opened it")
        if not s["line"] and s["id"] not in ("earlier",):
            problems.append(f"{name} has no one-line summary")
        if not (s["openAfterClick"] and s["opened"] > s["closed"] + 20):
            problems.append(f"{name} did not open on a click ({s['closed']:.0f} -> {s['opened']:.0f} px)")
        if not (s["closedAgain"] and abs(s["reclosed"] - s["closed"]) < 1):
            problems.append(f"{name} did not close again ({s['reclosed']:.0f} px, closed {s['closed']:.0f} px)")
    return problems


def link_problems(layout: dict) -> list[str]:
    """A figure's link to how it is computed must reach an anchor of the page, and following it
    must open the folded section that anchor is in."""
    problems = []
    for link in layout["links"]:
        name = f"{link['figure']!r} -> {link['href']}"
        if not link["exists"]:
            problems.append(f"{name}: no such anchor")
        elif link["folded"] and not (link["opened"] and not link["wasOpen"]):
            problems.append(f"{name}: following it left its section folded")
    return problems


def file_problems(layout: dict, folder) -> list[str]:
    """Each figure's SVG and PDF must be linked by a name relative to the page, naming a file in
    the page's folder."""
    problems = []
    for line in layout["files"]:
        kinds = sorted(link["text"] for link in line["links"])
        if kinds != ["PDF", "SVG"]:
            problems.append(f"{line['figure']!r} links {kinds}, not its SVG and PDF")
        for link in line["links"]:
            if not (folder / link["href"]).is_file():
                problems.append(f"{line['figure']!r} -> {link['href']}: no such file beside the page")
    return problems


def overlapping_labels(texts: list[dict], slack: float = 0.5) -> list[tuple[str, str]]:
    """Pairs of words in a plot whose boxes overlap (by more than `slack` px each way)."""
    pairs = []
    for i, a in enumerate(texts):
        for b in texts[i + 1:]:
            if (min(a["right"], b["right"]) - max(a["left"], b["left"]) > slack
                    and min(a["bottom"], b["bottom"]) - max(a["top"], b["top"]) > slack):
                pairs.append((a["text"], b["text"]))
    return pairs


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
    layout = browser.rendered_layout(report_html, open_all=True)
    assert layout_problems(layout) == []
    assert first_screen_problems(browser.rendered_layout(report_html)) == []


# --- the first screen and the folding sections, on a generated page and the sample report -----

def test_checks_reject_a_first_screen_pushed_down_and_a_section_that_will_not_fold(chromium, tmp_path):
    page = tmp_path / "late.html"
    page.write_text('<html><body><div style="height:1000px">metadata</div><p id="answer">Use 1x2</p>'
                    '<figure id="overview"><svg width="400" height="300"><text x="10" y="20">a</text>'
                    '<text x="12" y="22">b</text></svg></figure><div id="decide"><table><tr><td>1</td></tr>'
                    '</table></div><details class="section" open><summary><h2>Cost</h2></summary><p>x</p>'
                    '</details><section class="section"></section></body></html>')
    layout = browser.rendered_layout(page)
    assert any("below the first 900 px" in p for p in first_screen_problems(layout))
    assert any("open before anyone opened it" in p for p in section_problems(layout))
    assert any("no one-line summary" in p for p in section_problems(layout))
    assert overlapping_labels(layout["plotTexts"]) == [("a", "b")]


def test_sample_report_answers_on_the_first_screen_and_folds_every_section(sample_html):
    layout = browser.rendered_layout(sample_html)
    assert first_screen_problems(layout) == []
    assert section_problems(layout) == []
    assert [s["id"] for s in layout["sections"]][:2] == ["scaling", "cost"]
    assert layout["sections"][-1]["id"] == "methods"
    assert layout_problems(browser.rendered_layout(sample_html, open_all=True)) == []


def test_link_check_sees_a_missing_anchor_and_a_missing_file(chromium, tmp_path):
    page = tmp_path / "links.html"
    (tmp_path / "b.svg").write_text("<svg/>")
    page.write_text('<html><body><figure id="a"><figcaption><a href="#nowhere">How</a></figcaption></figure>'
                    '<figure id="b"><figcaption><a href="#m">How</a><span class="files"><a href="b.svg">SVG</a> '
                    '<a href="b.pdf">PDF</a></span></figcaption></figure><details '
                    'class="section"><summary><h2>M</h2></summary><h3 id="m">m</h3></details></body></html>')
    layout = browser.rendered_layout(page)
    assert link_problems(layout) == ["'a' -> #nowhere: no such anchor"]
    assert file_problems(layout, tmp_path) == ["'b' -> b.pdf: no such file beside the page"]


def test_every_plot_links_to_its_methods_and_the_link_opens_them(sample_html):
    layout = browser.rendered_layout(sample_html)
    assert link_problems(layout) == []
    # the overview and every plot of the sections, each to the methods, folded until followed
    links = layout["links"]
    assert len(links) == 1 + len(layout["images"]) and {link["href"] for link in links} == {"#methods-contents"}
    assert all(link["folded"] and link["opened"] for link in links)
    # and each to its SVG and PDF, files beside the page
    assert len(layout["files"]) == 1 + len(layout["images"])
    assert file_problems(layout, sample_html.parent) == []


def test_sample_report_plot_labels_do_not_overlap(sample_html):
    texts = browser.rendered_layout(sample_html)["plotTexts"]
    assert len(texts) > 20  # ticks, axis titles, legend and a label per point: words, not outlines
    assert {"1x1", "1x2", "2x4"} <= {t["text"] for t in texts}
    assert overlapping_labels(texts) == []


def test_printed_report_holds_every_section(sample_html, tmp_path):
    sections = browser.rendered_layout(sample_html)["sections"]
    assert len(sections) >= 8  # scaling detail, cost, projection, breakdown, prediction, all-reduce, devices, methods
    outline = browser.pdf_outline(sample_html, tmp_path / "report.pdf")
    for s in sections:
        assert s["heading"] in outline
        for inner in s["inner"]:  # a heading inside the section: printed only where the section printed open
            assert inner in outline, (s["id"], inner)
    assert sum(len(s["inner"]) for s in sections) >= len(sections)


def test_pdf_check_sees_a_folded_section(chromium, tmp_path):
    page = tmp_path / "folded.html"
    page.write_text("<html><body><h1>t</h1><details><summary><h2>Cost</h2></summary><h3>Cost: method</h3>"
                    "</details></body></html>")
    outline = browser.pdf_outline(page, tmp_path / "folded.pdf")
    assert "Cost" in outline and "Cost: method" not in outline


# --- printed on paper ---------------------------------------------------------------------

# The tables a reader prints for a paper or a proposal: each must keep every column on the paper.
PRINTED = {"decision": "#decide table", "scaling": "details#scaling table"}
PAPERS = {"A4": (595.3, 841.9), "letter": (612.0, 792.0)}  # points


def test_printed_tables_keep_every_column_on_a4_and_on_letter(sample_html, pdftotext, tmp_path):
    for paper, size in PAPERS.items():
        printed = browser.printed_columns(sample_html, tmp_path / f"{paper}.pdf", paper, PRINTED)
        assert printed["paper"] == pytest.approx(size, abs=1), paper  # the paper asked for
        assert browser.print_problems(printed) == [], paper
        assert [t["columns"] for t in printed["tables"].values()] == [7, 14]
        left, right = printed["printable"]
        print(paper, f"printable {right - left:.0f} pt:",  # shown with -s, for the record
              ", ".join(f"{name} {t['width']:.0f} pt" for name, t in printed["tables"].items()))


def test_print_check_sees_a_table_wider_than_the_paper(sample_html, pdftotext, tmp_path):
    page = tmp_path / "wide.html"
    page.write_text(sample_html.read_text().replace("</style>", "details#scaling table{min-width:600mm}</style>", 1))
    problems = browser.print_problems(browser.printed_columns(page, tmp_path / "wide.pdf", "A4", PRINTED))
    assert any(p.startswith("the page printed at") for p in problems), problems
    assert any(p.startswith("scaling: column(s)") and p.endswith("not on the paper") for p in problems), problems
    assert not any(p.startswith("decision") for p in problems), problems  # shrunk, but all of it there


def test_report_screenshot(report_html, tmp_path):
    png = browser.screenshot(report_html, tmp_path / "report-screenshot.png")
    ARTIFACT.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(png, ARTIFACT)  # for a person to look at; the test reads its own copy
    assert screenshot_problems(png, 1280) == []
