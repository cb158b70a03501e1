"""What the report writes cannot attack its reader: a name from a run record, the workflow or a
log (tests/fixtures/adversarial/report_hostile_*) is a spreadsheet formula or a terminal control
sequence, and every TSV, the page, the SVGs and the printed lines show it as text; numbers stay
numbers, and the project reads back the text it wrote (core/io.sheet_cell, report/load/tsv)."""
import csv
import json
import re
import shutil

import pandas as pd
import pytest
from ddpscale.core.io import from_sheet_cell, sheet_cell
from helpers.records import make_run, probe
from helpers.report import run_report, write_fixtures
from helpers.workflow import ROOT
from ddpscale.report.load import earlier, tsv

ADVERSARIAL = ROOT / "tests" / "fixtures" / "adversarial"
HOSTILE = json.loads((ADVERSARIAL / "report_hostile_names.json").read_text())
TOPOLOGY = HOSTILE["topology"]
FORMULA = ("=", "+", "-", "@")
# what no file of the report may hold: C0 controls but tab and newline (a TSV's and a page's
# layout), DEL, C1; a TSV's cells are checked for tab, newline and CR on their own
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")


@pytest.mark.parametrize("text", ["=HYPERLINK(\"http://x\",\"y\")", "@SUM(1)", "+cmd", "-cmd", "-inf", "-1+1",
                                  "'quoted", "=cmd"])
def test_a_cell_a_spreadsheet_would_evaluate_gets_a_quote_that_reading_drops(text):
    cell = sheet_cell(text)
    assert cell == "'" + text
    assert from_sheet_cell(cell) == text


@pytest.mark.parametrize("text, cell", [("\tx", "\\tx"), ("\rx", "\\rx"), ("\x1b[2J", "\\x1b[2J"),
                                        ("\r=cmd", "\\r=cmd"), ("=\x1b", "'=\\x1b")])
def test_a_leading_tab_or_cr_is_escaped_so_nothing_evaluates(text, cell):
    # OWASP lists a leading tab and CR too: escaped, they lead with a backslash
    assert sheet_cell(text) == cell


@pytest.mark.parametrize("text", ["-1.5", "+2e-3", "-0.3", "-.5", "1x2", "ok", "", "failed: =x"])
def test_numbers_and_plain_text_stay_as_they_are(text):
    # a signed number is a value to a spreadsheet, not a formula: a quote would turn it into text
    assert sheet_cell(text) == text
    assert from_sheet_cell(text) == text


def test_control_characters_in_a_cell_are_escaped():
    assert sheet_cell("a\x1b[2J\r\nb\x07\x9b") == "a\\x1b[2J\\r\\nb\\x07\\x9b"


def test_a_table_round_trips_and_numbers_stay_numbers(tmp_path):
    table = pd.DataFrame({"topology": ["=cmd", "'x", "1x1"], "speedup_low": [-0.3, 1.0, -2.5],
                          "note": ["-1.5", "@SUM(1)", None], "n": [1, -2, 3], "ok": [True, False, True]})
    tsv.write(tmp_path / "t.tsv", table)
    rows = list(csv.reader((tmp_path / "t.tsv").open(), delimiter="\t"))
    assert rows[1][:3] == ["'=cmd", "-0.3", "-1.5"] and rows[2][:3] == ["''x", "1.0", "'@SUM(1)"]
    back = tsv.read(tmp_path / "t.tsv")
    assert back["topology"].tolist() == ["=cmd", "'x", "1x1"]
    assert back["speedup_low"].tolist() == [-0.3, 1.0, -2.5] and back["n"].tolist() == [1, -2, 3]
    assert back["note"].tolist()[:2] == ["-1.5", "@SUM(1)"]


def test_an_earlier_table_reads_back_the_names_it_was_written_with(tmp_path):
    """report.compare_with reads a scaling.tsv the report wrote: "=cmd" is "=cmd" again."""
    table = pd.DataFrame({"topology": ["1x1", "=cmd"], "model_class": ["@M", "M"],
                          "throughput_samples_s": [100.0, 190.0], "efficiency": [1.0, -0.25], "fit_time_s": [4.0, 2.0]})
    tsv.write(tmp_path / "scaling.tsv", table)
    assert "'=cmd" in (tmp_path / "scaling.tsv").read_text()
    pd.testing.assert_frame_equal(earlier.read_earlier(tmp_path / "scaling.tsv"), table)


def hostile_runs() -> list[dict]:
    """Three seeds of the baseline and of a topology with a hostile name, every name hostile, each
    topology's first repeat probed (so breakdown.tsv and prediction.tsv have rows)."""
    runs = []
    for name, shape in (("1x1", "1x1"), (TOPOLOGY, "1x2")):
        for repeat in range(3):
            run = {**make_run(shape, repeat=repeat, throughput_samples_s=100.0 if shape == "1x1" else 180.0,
                              **HOSTILE["record"]), "topology": name}
            if repeat == 0:
                world = run["world_size"]
                run["probe"] = probed = probe(name, world, 0.001, 0.006, 0.0 if world == 1 else 0.001, 0.001)
                for size in probed["allreduce"]:  # as the probe's benchmark writes them
                    size["algbw_gbps"] = size["busbw_gbps"] = size["bytes"] / size["time_s"] / 1e9
            runs.append(run)
    return runs


@pytest.fixture(scope="module")
def hostile_report(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("report_hostile")
    logs = tmp / "logs" / "2x2"
    logs.mkdir(parents=True)
    shutil.copy(ADVERSARIAL / "report_hostile_cause.log", logs / "r0.log")
    # the workflow passes its values as --flag=value, so a value may start with a dash or an @
    proc = run_report(write_fixtures(tmp, hostile_runs()), tmp / "report", "--expected", "1x1", TOPOLOGY, "2x2",
                      "--repeats", "3", "--log-dir", str(tmp / "logs"), f"--experiment={HOSTILE['experiment']}",
                      f"--config-files={HOSTILE['config_files']}")
    assert proc.returncode == 0, proc.stderr
    return tmp / "report", proc


def test_every_tsv_cell_is_text_a_spreadsheet_shows(hostile_report):
    out, _ = hostile_report
    names = sorted(path.name for path in out.glob("*.tsv"))
    assert names == ["breakdown.tsv", "prediction.tsv", "projection.tsv", "scaling.tsv", "timetoacc.tsv"]
    for name in names:
        rows = list(csv.reader((out / name).open(newline=""), delimiter="\t"))
        assert len(rows) > 2, name  # the header, the baseline and the hostile topology at least
        for row in rows:
            assert len(row) == len(rows[0]), name  # no name split a row
            for cell in row:
                assert not CONTROL.search(cell) and "\t" not in cell and "\n" not in cell, (name, cell)
                assert not cell.startswith(FORMULA) or NUMBER.fullmatch(cell), (name, cell)
        assert any(row[0] == "'" + TOPOLOGY.replace("\x1b", "\\x1b") for row in rows), name


def test_scaling_tsv_reads_back_the_names(hostile_report):
    out, _ = hostile_report
    table = tsv.read(out / "scaling.tsv").set_index("topology")
    record = HOSTILE["record"]
    shown = TOPOLOGY.replace("\x1b", "\\x1b")
    assert table.loc[shown, "model_class"] == record["model_class"]
    assert table.loc[shown, "device_name"] == record["device_name"]
    assert table.loc["1x1", "experiment"] == "=1+1\\x1b[31m"
    assert table.loc["1x1", "config_files"] == HOSTILE["config_files"]
    assert table.loc["2x2", "status"].startswith("failed: ")
    assert table.loc["1x1", "efficiency"] == 1.0  # numbers are numbers still


def test_the_page_the_figures_and_the_printed_lines_hold_no_control_character(hostile_report):
    out, proc = hostile_report
    texts = {path.name: path.read_text(encoding="utf-8") for path in [out / "report.html", *out.glob("*.svg")]}
    texts["stdout"], texts["stderr"] = proc.stdout, proc.stderr
    for name, text in texts.items():
        assert not CONTROL.search(text), (name, CONTROL.search(text))
    page = texts["report.html"]
    assert "\\x1b[2J" in page and "=HYPERLINK(" in page  # shown, as text
    assert any("\\x1b[2J" in text for name, text in texts.items() if name.endswith(".svg"))  # point labels
