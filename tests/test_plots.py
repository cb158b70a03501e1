"""The report's figures as a reader sees them, asserted on the drawn matplotlib objects: every
label readable (inside the axes, none printed over another) and no legend hiding a bar."""
import pandas as pd

from ddpscale.report import plots, reportdata
from test_analysis import make_run

# two topologies of world size 2 (1x2, 2x1) at the same speedup, and one at the largest size
RUNS = [make_run("1x1"), make_run("1x2", throughput_samples_s=180.0),
        make_run("2x1", throughput_samples_s=180.0), make_run("2x2", throughput_samples_s=300.0)]


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


def test_speedup_labels_every_topology_apart_and_inside_the_axes(monkeypatch):
    fig, ax, renderer = drawn(plots.plot_speedup, monkeypatch=monkeypatch)
    labels = {t.get_text(): t.get_window_extent(renderer) for t in ax.texts}
    assert set(labels) == {"1x1", "1x2", "2x1", "2x2"}
    frame = ax.get_window_extent(renderer)
    for name, box in labels.items():
        assert frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1, name
    names = sorted(labels)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            assert not overlap(labels[a], labels[b]), (a, b)
    # the two world-size-2 points themselves stand apart, each node count with its own legend entry
    points = {tuple(xy) for line in ax.lines if line.get_linestyle() == "None" for xy in line.get_xydata()}
    assert len({x for x, _ in points}) == 4
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "measured, 1 node" in legend and "measured, 2 nodes" in legend


def test_efficiency_legend_covers_no_bar_and_stays_in_the_figure(monkeypatch):
    fig, ax, renderer = drawn(plots.plot_efficiency, monkeypatch=monkeypatch)
    legend = ax.get_legend().get_window_extent(renderer)
    bars = [p.get_window_extent(renderer) for p in ax.patches]
    assert len(bars) == 4
    assert not any(overlap(legend, bar) for bar in bars)
    assert not any(overlap(legend, t.get_window_extent(renderer)) for t in ax.texts)  # the % labels
    page = fig.bbox
    assert page.x0 <= legend.x0 and legend.x1 <= page.x1 and page.y0 <= legend.y0 and legend.y1 <= page.y1
