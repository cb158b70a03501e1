"""Open an HTML page in headless Chromium: what it really decoded and laid out, and a screenshot.

Reading report.html as text cannot tell a corrupt data: URI from a good one, nor whether the
sections come out in the order the reader sees them; a real browser can. Debian's `chromium`
is used as a plain command (no driver, no Python package), one process per call.
"""

from __future__ import annotations

import html
import json
import os
import re
import subprocess
import tempfile
from pathlib import Path

from helpers import system_tools

# Required by the spec: no sandbox (we run as root in containers), no GPU, no phoning home.
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
# Virtual time runs ahead while the page is idle, so this costs no wall time; it only makes
# sure every data: image is decoded and the load handler has run before the dump or capture.
VIRTUAL_TIME_MS = 10_000
TIMEOUT_S = 120
MAX_HEIGHT = 16_000  # Chromium refuses or tiles far taller captures; a report is well below


class BrowserFailed(RuntimeError):
    """Chromium ran but did not produce what was asked; carries the tail of its stderr."""


CHROMIUM = ("chromium", "chromium-browser")  # Debian's name, and Ubuntu's


def chromium_binary() -> str:
    return system_tools.ensure(CHROMIUM, "chromium")


def _chromium(*args: str, width: int, height: int) -> subprocess.CompletedProcess:
    # A fresh profile per call: concurrent runs (pytest-xdist, two terminals) share nothing.
    with tempfile.TemporaryDirectory(prefix="ddpscale-chromium-") as profile:
        cmd = [chromium_binary(), *FLAGS, f"--user-data-dir={profile}",
               f"--virtual-time-budget={VIRTUAL_TIME_MS}", f"--window-size={width},{height}",
               "--force-device-scale-factor=1", "--hide-scrollbars", *args]
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired as exc:
            raise BrowserFailed(f"chromium did not finish in {TIMEOUT_S} s: {' '.join(cmd)}") from exc


def _fail(what: str, result: subprocess.CompletedProcess) -> BrowserFailed:
    # Chromium's stderr is mostly D-Bus noise in containers; the cause is at the end.
    return BrowserFailed(f"chromium {what} (rc {result.returncode}):\n{result.stderr[-3000:]}")


# Measures after window load, i.e. after every <img> has loaded or failed. Positions are
# document coordinates (scroll added) so "above" means above on the page, not in the viewport.
PROBE = """<script>
window.addEventListener("load", () => {
  const box = el => { const r = el.getBoundingClientRect();
    return {top: r.top + window.scrollY, height: r.height, width: r.width}; };
  // Each folding section, closed as the page opens, then opened and closed again by a click on
  // its summary, as a reader does: its height each time, and its inner headings (h3).
  const sections = [...document.querySelectorAll("details.section")].map(d => {
    const summary = d.querySelector("summary"), closed = box(d).height, wasOpen = d.open;
    summary.click(); const opened = box(d).height, openAfterClick = d.open;
    summary.click(); const reclosed = box(d).height;
    return {id: d.id, heading: (d.querySelector("summary h2") || {}).innerText || "",
            line: (d.querySelector("summary .line") || {}).innerText || "", wasOpen, openAfterClick,
            closedAgain: !d.open, closed, opened, reclosed, summaryHeight: box(summary).height,
            inner: [...d.querySelectorAll(":scope > h3")].map(h => h.textContent.trim())};
  });
  // Where the first screen's parts are before anything is opened: the viewport is the first 900 px.
  const first = {};
  for (const [name, sel] of Object.entries({answer: "#answer", plot: "#overview svg",
                                             decision: "#decide table"})) {
    const el = document.querySelector(sel); first[name] = el ? {...box(el), bottom: box(el).top + box(el).height} : null;
  }
  // Every word of the overview plot: its box on the page, to find labels drawn over each other.
  const plotTexts = [...document.querySelectorAll("#overview svg text")].map(t => {
    const r = t.getBoundingClientRect();
    return {text: t.textContent, left: r.left, right: r.right, top: r.top, bottom: r.bottom}; });
  // Every link from a figure to an anchor of the page, followed as a reader clicks it: whether
  // its target exists and whether the folded section around it opened (the report has no
  // script; the browser opens a <details> around a link's target). Folded again after.
  const links = [...document.querySelectorAll("figure a[href^='#']")].map(a => {
    const href = a.getAttribute("href"), target = document.getElementById(href.slice(1));
    const fold = target && target.closest("details"), wasOpen = fold ? fold.open : null;
    a.click();
    const opened = fold ? fold.open : null;
    if (fold) fold.open = false;
    return {href, figure: (a.closest("figure").querySelector("img,svg") || {}).getAttribute?.("alt") || a.closest("figure").id,
            exists: !!target, folded: !!fold, wasOpen, opened};
  });
  // Each figure's line of files for papers (SVG, PDF): what it links, relative to the page.
  const files = [...document.querySelectorAll("figure .files")].map(line => {
    const fig = line.closest("figure");
    return {figure: (fig.querySelector("img") || {}).alt || fig.id,
            links: [...line.querySelectorAll("a")].map(a => ({text: a.textContent, href: a.getAttribute("href")}))};
  });
  window.scrollTo(0, 0);
  if (OPEN_ALL) document.querySelectorAll("details").forEach(d => { d.open = true; });
  const verdict = document.querySelector("#verdict");
  // The heading a table belongs to: its <caption>, else the last heading before it in document order.
  let heading = null; const tables = [];
  for (const el of document.querySelectorAll("h1,h2,h3,h4,h5,h6,table")) {
    if (el.tagName !== "TABLE") { heading = el; continue; }
    const cap = el.querySelector("caption"), h = cap || heading;
    tables.push({...box(el), rows: el.rows.length, heading: h ? h.innerText.trim() : "",
                 heading_tag: h ? h.tagName.toLowerCase() : ""});
  }
  const images = [...document.images].map(img => { const fig = img.closest("figure");
    const cap = fig && fig.querySelector("figcaption");
    return {...box(img), alt: img.alt, complete: img.complete, naturalWidth: img.naturalWidth,
            naturalHeight: img.naturalHeight, caption: cap ? cap.innerText.trim() : ""}; });
  const out = document.createElement("pre");
  out.id = "ddpscale-layout";
  out.textContent = JSON.stringify({
    verdict: verdict ? {exists: true, ...box(verdict), text: verdict.innerText.trim()} : {exists: false},
    tables, images, sections, first, plotTexts, links, files, scrollHeight: document.documentElement.scrollHeight});
  document.body.appendChild(out);
});
</script>"""
LAYOUT = re.compile(r'<pre id="ddpscale-layout">(.*?)</pre>', re.S)


def rendered_layout(page: Path, width: int = 1280, open_all: bool = False) -> dict:
    """What Chromium laid out for `page` at this window width (see PROBE for the keys); open_all:
    tables, images and the verdict measured with every <details> open (sections are measured
    closed, opened and closed again either way).

    The probe goes into a temporary copy (same folder, so relative links still resolve);
    the page under test itself carries no script."""
    text = Path(page).read_text()
    at = text.lower().rfind("</body>")
    probe = PROBE.replace("OPEN_ALL", "true" if open_all else "false")
    probed = text[:at] + probe + text[at:] if at >= 0 else text + probe
    with tempfile.NamedTemporaryFile("w", suffix=".html", dir=Path(page).parent,
                                     prefix=".probe-", delete=False) as copy:
        copy.write(probed)
    try:
        result = _chromium("--dump-dom", Path(copy.name).resolve().as_uri(), width=width, height=900)
    finally:
        os.unlink(copy.name)
    found = LAYOUT.search(result.stdout)
    if result.returncode != 0 or not found:
        raise _fail("wrote no layout (page never fired load, or the dump failed)", result)
    return json.loads(html.unescape(found.group(1)))  # the dump escapes &, <, > in text


OUTLINE_TITLE = re.compile(rb"/Title\s*(\((?:[^()\\]|\\.)*\)|<[0-9A-Fa-f\s]*>)")


def pdf_outline(page: Path, pdf: Path) -> list[str]:
    """Print `page` to a PDF as a reader's print dialog would (print stylesheet applied) and return
    its outline: Chromium makes one entry per heading that was printed, so a heading inside a
    section that printed folded is missing. Skia writes the outline uncompressed: no PDF library."""
    pdf = Path(pdf).resolve()
    pdf.unlink(missing_ok=True)
    result = _chromium("--no-pdf-header-footer", "--generate-pdf-document-outline", f"--print-to-pdf={pdf}",
                       Path(page).resolve().as_uri(), width=1280, height=900)
    if result.returncode != 0 or not pdf.is_file():
        raise _fail(f"wrote no PDF to {pdf}", result)
    titles = []
    for raw in OUTLINE_TITLE.findall(pdf.read_bytes()):
        if raw.startswith(b"<"):  # UTF-16BE hex with a byte-order mark
            titles.append(bytes.fromhex(raw[1:-1].decode()).decode("utf-16"))
        else:
            titles.append(re.sub(rb"\\(.)", rb"\1", raw[1:-1]).decode("latin-1"))
    return [t.strip() for t in titles]


def page_height(layout: dict, cap: int = MAX_HEIGHT) -> int:
    return min(int(layout["scrollHeight"]), cap)


def screenshot(page: Path, png: Path, width: int = 1280, height: int | None = None) -> Path:
    """A PNG of `page`; height None means the whole page (as measured by the probe, capped)."""
    if height is None:
        height = page_height(rendered_layout(page, width))
    png = Path(png).resolve()
    png.unlink(missing_ok=True)  # a stale file must not pass for a fresh capture
    result = _chromium(f"--screenshot={png}", Path(page).resolve().as_uri(), width=width, height=height)
    if result.returncode != 0 or not png.is_file() or png.stat().st_size == 0:
        raise _fail(f"wrote no screenshot to {png}", result)
    return png


# --- printing on paper -----------------------------------------------------------------------

PDFTOTEXT = ("pdftotext",)  # poppler-utils: the words of a PDF with their boxes

# In a copy of the page: the paper (Chromium's command line has no paper size; CSS @page size
# sets it), and, for every header cell of the tables asked for, a word at its left and one at its
# right edge (absolutely placed, so the table lays out as without them; left ones at the cell's
# top, right ones at its bottom, so two neighbours never print as one word). Two rulers from the
# page's top left: one as wide as the initial containing block, which in print is the printable
# width, and one 400 CSS px wide, which prints 300 pt wide unless Chromium shrank the page to fit
# something wider than the paper. Each table's column count goes beside them.
PRINT_MARKS = """<style>@page{size:PAPER}
.ddpscale-mark{position:absolute;font:5px/1 monospace;color:#000;white-space:nowrap;margin:0;padding:0}
</style><script>
window.addEventListener("load", () => {
  const word = (box, text, where) => { const m = document.createElement("span");
    m.className = "ddpscale-mark"; m.style.cssText = where; m.textContent = text; box.appendChild(m); };
  const ruler = (where, name) => { const d = document.createElement("div");
    d.style.cssText = "position:absolute;height:0;margin:0;padding:0;border:0;" + where;
    document.body.appendChild(d); word(d, name + "l", "left:0;top:0"); word(d, name + "r", "right:0;top:0"); };
  ruler("left:0;right:0;top:0", "qxqpage"); ruler("left:0;width:400px;top:7px", "qxqruler");
  SELECTORS.forEach((selector, t) => {
    const table = document.querySelector(selector), cells = table ? [...table.rows[0].cells] : [];
    word(document.body, `qxq${t}n${cells.length}`, `left:440px;top:${7 + 6 * t}px`);
    cells.forEach((cell, c) => { cell.style.position = "relative";
      word(cell, `qxq${t}c${c}l`, "left:0;top:0"); word(cell, `qxq${t}c${c}r`, "right:0;bottom:0"); });
  });
});
</script>"""
PDF_WORD = re.compile(r'<word xMin="([\d.]+)" yMin="[\d.]+" xMax="([\d.]+)" yMax="[\d.]+">(qxq\w+)</word>')
RULER_PT = 300.0  # 400 CSS px at 96 px per inch


def printed_columns(page: Path, pdf: Path, paper: str, tables: dict[str, str]) -> dict:
    """Print `page` on `paper` ("A4", "letter": a CSS page size) as a reader's print dialog would
    and say where each column of `tables` ({name: CSS selector}) landed, in points: {"paper":
    (width, height), "printable": (left, right), "scale": 1.0 unless Chromium shrank the page,
    "tables": {name: {"columns": count, "edges": [(left, right) or None per column],
    "outside": [columns printed beyond the printable width], "width": pt}}}. A column printed
    off the paper has no words in the PDF: its edges are None."""
    names = list(tables)
    marks = PRINT_MARKS.replace("PAPER", paper).replace("SELECTORS", json.dumps([tables[n] for n in names]))
    text = Path(page).read_text()
    at = text.lower().rfind("</body>")
    with tempfile.NamedTemporaryFile("w", suffix=".html", dir=Path(page).parent,
                                     prefix=".print-", delete=False) as copy:
        copy.write(text[:at] + marks + text[at:] if at >= 0 else text + marks)
    pdf = Path(pdf).resolve()
    pdf.unlink(missing_ok=True)
    try:
        result = _chromium("--no-pdf-header-footer", f"--print-to-pdf={pdf}", Path(copy.name).resolve().as_uri(),
                           width=1280, height=900)
    finally:
        os.unlink(copy.name)
    if result.returncode != 0 or not pdf.is_file():
        raise _fail(f"wrote no PDF to {pdf}", result)
    words = subprocess.run([system_tools.ensure(PDFTOTEXT, "poppler-utils"), "-bbox", str(pdf), "-"],
                           capture_output=True, text=True, check=True, timeout=TIMEOUT_S).stdout
    size = re.search(r'<page width="([\d.]+)" height="([\d.]+)"', words)
    found: dict[str, list[tuple[float, float]]] = {}
    for left, right, name in PDF_WORD.findall(words):
        found.setdefault(name, []).append((float(left), float(right)))
    printable = (found["qxqpagel"][0][0], found["qxqpager"][0][1])
    out = {"paper": (float(size[1]), float(size[2])), "printable": printable,
           "scale": (found["qxqrulerr"][0][1] - found["qxqrulerl"][0][0]) / RULER_PT, "tables": {}}
    for t, name in enumerate(names):
        count = next((int(k.split("n")[1]) for k in found if k.startswith(f"qxq{t}n")), 0)
        edges, outside = [], []
        for c in range(count):
            lefts, rights = found.get(f"qxq{t}c{c}l", []), found.get(f"qxq{t}c{c}r", [])
            if not (lefts and rights):
                edges.append(None)
                continue
            # the header repeats on every page the table runs onto: each copy counts
            edges.append((min(x for x, _ in lefts), max(x for _, x in rights)))
            if any(x < printable[0] - 0.5 for x, _ in lefts) or any(x > printable[1] + 0.5 for _, x in rights):
                outside.append(c)
        placed = [e for e in edges if e]
        out["tables"][name] = {"columns": count, "edges": edges, "outside": outside,
                               "width": max(r for _, r in placed) - min(x for x, _ in placed) if placed else 0.0}
    return out


def print_problems(printed: dict) -> list[str]:
    """Where a printout loses a table's column or shrinks the page; empty when every column of
    every table is on the paper at the page's own size."""
    problems = []
    if abs(printed["scale"] - 1) > 0.01:
        problems.append(f"the page printed at {printed['scale']:.0%} of its size: something is wider than the paper")
    for name, table in printed["tables"].items():
        if not table["columns"]:
            problems.append(f"{name}: no such table")
        lost = [c + 1 for c, e in enumerate(table["edges"]) if e is None]
        if lost:
            problems.append(f"{name}: column(s) {lost} of {table['columns']} not on the paper")
        if table["outside"]:
            problems.append(f"{name}: column(s) {[c + 1 for c in table['outside']]} of {table['columns']} "
                            "printed beyond the printable width")
    return problems
