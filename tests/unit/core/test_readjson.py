"""ddpscale.core.io.read_json_dict: the workflow's own JSON files (the contract cache, plan.json)
read back, and None, never an exception, where the writer has to make the file again."""

from __future__ import annotations

import pytest

from ddpscale.core.io import read_json_dict, write_json_atomic


def test_an_object_written_reads_back(tmp_path):
    write_json_atomic(tmp_path / "plan.json", {"measure": "throughput", "repeats": 3})
    assert read_json_dict(tmp_path / "plan.json") == {"measure": "throughput", "repeats": 3}


@pytest.mark.parametrize("text", [None, '{"measure": "thr', "[1, 2]", ""])
def test_missing_cut_short_or_not_an_object_is_none(tmp_path, text):
    path = tmp_path / "plan.json"
    if text is not None:
        path.write_text(text)
    assert read_json_dict(path) is None


def test_a_folder_in_its_place_is_none(tmp_path):
    (tmp_path / "plan.json").mkdir()
    assert read_json_dict(tmp_path / "plan.json") is None


def test_kept_outputs_are_restored_only_where_missing(tmp_path):
    """Snakemake deletes a job's outputs before it runs: keep() before, restore() after a failure."""
    from ddpscale.core.io import atomic_write, keep, restore

    html, png = tmp_path / "report.html", tmp_path / "speedup.png"
    html.write_text("old page")
    keep([html, png])  # png: none yet, nothing to keep
    atomic_write(html, lambda tmp: tmp.write_text("new page"))  # how the report writes: by rename
    assert (tmp_path / ".previous/report.html").read_text() == "old page"
    assert restore([html, png]) == []  # the new one stands
    html.unlink()  # Snakemake, before the job that then failed
    assert restore([html, png]) == [str(html)] and html.read_text() == "old page"
