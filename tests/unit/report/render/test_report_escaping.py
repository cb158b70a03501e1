"""report.html is rendered from templates with autoescaping: a value from the data (topology,
host, device, probe failure, file name) is text in every table, the verdict and the methods,
never markup, while the report's own markup (spans, entities) comes through as markup."""
import pandas as pd
import pytest
from jinja2 import UndefinedError
from markupsafe import escape

from helpers.records import make_run, probe
from helpers.report import probed_runs
from ddpscale.report import reportdata
from ddpscale.report.render import html_tables, templating
from ddpscale.report.render import html as report_html

HOSTILE = "<script>alert(1)</script>"
SHOWN = "&lt;script&gt;alert(1)&lt;/script&gt;"


@pytest.fixture(scope="module")
def data():
    runs, probes = probed_runs()
    runs.append({**make_run("2x2", hosts=[HOSTILE, "n1"], device_name=HOSTILE,
                            transport=[{"backend": "gloo", "interface": HOSTILE}],
                            throughput_samples_s=300.0, test_acc=0.5), "topology": HOSTILE})
    runs = [{**r, "repeat": i} for r in runs for i in range(3)]  # three seeds: accuracy is tested
    probes[HOSTILE] = {**probe(HOSTILE, 4, 0.0005, 0.006, 0.001, 0.001), "allreduce": probes["1x2"]["allreduce"]}
    built = reportdata.build(pd.DataFrame(runs), probes, baseline="1x1", metric="test_acc", tolerance=0.02,
                             threshold=0.8, expected=["1x1", "1x2", HOSTILE, "4x4"], repeats=3,
                             log_tails={}, compared_with=HOSTILE)
    earlier = built.finished[["topology", "throughput_samples_s", "efficiency", "fit_time_s"]]
    return reportdata.build(pd.DataFrame(runs), probes, baseline="1x1", metric="test_acc", tolerance=0.02,
                            threshold=0.8, expected=["1x1", "1x2", HOSTILE, "4x4"], repeats=3,
                            log_tails={}, earlier=earlier, compared_with=HOSTILE)


def test_a_hostile_name_is_text_in_every_table(data):
    for make in html_tables.TABLES:
        heading, note, table = make(data)
        shown = f"{escape(note)}{table}"  # as the page template shows them
        assert HOSTILE not in shown and "<script" not in shown, heading
        assert SHOWN in shown, heading


def test_a_hostile_name_is_text_in_the_whole_page(data):
    page = report_html.build_report(data, {"speedup.png": b"\x89PNG"})
    assert "<script" not in page
    assert page.count(SHOWN) >= 10  # tables, verdict (not held, unfinished), methods (hosts, devices)
    # the report's own markup is still markup
    assert '<span class="failed">&#10007; not held (a drop of at least 0.4 &gt; 0.02)</span>' in page
    assert f'{SHOWN}<br><span class="spread">gloo on {SHOWN}</span>' in page  # topology, its network
    assert "<th scope=\"col\" class=\"\">&Delta; vs baseline</th>" in page and "All-reduce (&micro;s)" in page
    assert page.startswith("<!DOCTYPE html>") and page.endswith("</body></html>\n")


def test_templates_escape_by_default_and_refuse_unknown_names():
    table = html_tables._table(["Topology", "n"], [("", [HOSTILE, "1"])])
    assert f'<td class="l">{SHOWN}</td><td class="">1</td>' in table
    with pytest.raises(UndefinedError):
        templating.render("table.html.j2", heads=["Topology", "n"], rows=[])  # text_cols missing
