"""The report's figures as a reader sees them, asserted on the drawn matplotlib objects: every
label readable (inside the axes, none printed over another) and no legend hiding a bar."""
import pandas as pd
import pytest

from helpers.records import make_run
from ddpscale.report import reportdata
from ddpscale.report.render import plots

# two topologies of world size 2 (1x2, 2x1) at the same speedup, and one at the largest size
RUNS = [make_run("1x1"), make_run("1x2", throughput_samples_s=180.0),
        make_run("2x1", throughput_samples_s=180.0), make_run("2x2", throughput_samples_s=300.0)]

# three topologies at each of world sizes 4 and 8, at close speedups
MANY = [make_run(t, throughput_samples_s=v) for t, v in [
    ("1x1", 100), ("1x2", 190), ("2x1", 170), ("1x4", 350), ("2x2", 330), ("4x1", 300),
    ("2x4", 600), ("4x2", 640), ("1x8", 700)]]


def drawn(plot, runs=RUNS, monkeypatch=None):
    """The figure plot() would save, laid out and drawn as save() draws it."""
    data = reportdata.build(pd.DataFrame(runs), {}, baseline="1x1", metric="test_acc", tolerance=0.02,
                            threshold=0.8, expected=[], repeats=1, log_tails={})
    made = []
    monkeypatch.setattr(plots, "save", lambda fig, path: made.append(fig))
    plot(data, "unused.png")
    fig = made[0]
    fig.tight_layout()
    fig.canvas.draw()
    return fig, fig.axes[0], fig.canvas.get_renderer()


def overlap(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


@pytest.mark.parametrize("runs", [RUNS, MANY], ids=["2-per-size", "3-per-size"])
def test_speedup_labels_every_topology_apart_and_inside_the_axes(runs, monkeypatch):
    fig, ax, renderer = drawn(plots.plot_speedup, runs, monkeypatch=monkeypatch)
    labels = {t.get_text(): t.get_window_extent(renderer) for t in ax.texts}
    assert set(labels) == {r["topology"] for r in runs}
    frame = ax.get_window_extent(renderer)
    for name, box in labels.items():
        assert frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1, name
    names = sorted(labels)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            assert not overlap(labels[a], labels[b]), (a, b)
    # the two world-size-2 points themselves stand apart, each node count with its own legend entry
    points = {tuple(xy) for line in ax.lines if line.get_linestyle() == "None" for xy in line.get_xydata()}
    assert len({x for x, _ in points}) == len(runs)
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "measured, 1 node" in legend and "measured, 2 nodes" in legend
    for name, box in labels.items():  # nor does a label hide a point
        for x, y in points:
            px, py = ax.transData.transform((x, y))
            assert not (box.x0 < px < box.x1 and box.y0 < py < box.y1), (name, x, y)


def test_efficiency_legend_covers_no_bar_and_stays_in_the_figure(monkeypatch):
    fig, ax, renderer = drawn(plots.plot_efficiency, RUNS, monkeypatch=monkeypatch)
    legend = ax.get_legend().get_window_extent(renderer)
    bars = [p.get_window_extent(renderer) for p in ax.patches]
    assert len(bars) == 4
    assert not any(overlap(legend, bar) for bar in bars)
    assert not any(overlap(legend, t.get_window_extent(renderer)) for t in ax.texts)  # the % labels
    page = fig.bbox
    assert page.x0 <= legend.x0 and legend.x1 <= page.x1 and page.y0 <= legend.y0 and legend.y1 <= page.y1


def test_breakdown_legend_covers_no_bar_or_step_time_and_stays_in_the_figure(monkeypatch):
    # with a fifth term (Lightning's per-step sync) the legend inside the axes hid the step
    # times printed above the bars
    from helpers.records import probe

    data = reportdata.build(pd.DataFrame(RUNS[:3]), {"1x1": probe("1x1", 1, 0.001, 0.006, 0.0, 0.0),
                                                     "1x2": probe("1x2", 2, 0.0005, 0.003, 0.001, 0.001),
                                                     "2x1": probe("2x1", 2, 0.0005, 0.003, 0.002, 0.001)},
                            baseline="1x1", metric="test_acc", tolerance=0.02, threshold=0.8, expected=[],
                            repeats=1, log_tails={})
    made = []
    monkeypatch.setattr(plots, "save", lambda fig, path: made.append(fig))
    plots.plot_breakdown(data, "unused.png")
    fig = made[0]
    fig.tight_layout()
    fig.canvas.draw()
    ax, renderer = fig.axes[0], fig.canvas.get_renderer()
    legend = ax.get_legend().get_window_extent(renderer)
    assert len(ax.get_legend().get_texts()) == 5
    bars = [p.get_window_extent(renderer) for p in ax.patches]
    times = [t.get_window_extent(renderer) for t in ax.texts]
    assert len(bars) == 15 and len(times) == 3
    assert not any(overlap(legend, box) for box in bars + times)
    page = fig.bbox
    assert page.x0 <= legend.x0 and legend.x1 <= page.x1 and page.y0 <= legend.y0 and legend.y1 <= page.y1


def test_svg_and_pdf_keep_words_as_text_and_write_the_same_bytes_twice(monkeypatch):
    """For papers: selectable, searchable words (SVG <text>, PDF TrueType rather than Type 3
    glyphs) and no date or random id, so rebuilding an unchanged report changes no file."""
    fig, _, _ = drawn(plots.plot_speedup, monkeypatch=monkeypatch)
    pdf, svg = plots.pdf(fig), plots.svg(fig)
    assert pdf == plots.pdf(fig) and svg == plots.svg(fig)  # matplotlib's ids were salted afresh each save
    assert b"/FontFile2" in pdf and b"/Type3" not in pdf and b"CreationDate" not in pdf
    assert "<text" in svg and "<dc:date>" not in svg
