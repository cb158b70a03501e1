"""The report is whole or the previous one stays: report.py writes every file aside and moves the
set into place at the end (core/io.staged), the workflow's shell line execs it so the signal that
ends the job ends the report, restore (onerror) never interleaves with a writer, and a full disk
or a read-only folder is one line that leaves the previous report as it was."""
import ast
import errno
import importlib.util
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import pytest
from ddpscale.core.io import STAGING, keep, publish_lock, restore, staged
from helpers.records import make_run
from helpers.report import OUTPUTS, SCRIPT, run_report, write_fixtures
from helpers.workflow import ROOT

RULES = ROOT / "workflow" / "rules" / "report.smk"
RUNS = [make_run(topology, repeat=r, throughput_samples_s=rate) for topology, rate in (("1x1", 100.0), ("1x2", 190.0))
        for r in range(3)]


def wait_for(state, what: str, deadline_s: float = 60.0) -> None:
    """Poll state() until it holds; fail naming what was awaited once the deadline passes."""
    end = time.monotonic() + deadline_s
    while not state():
        if time.monotonic() > end:
            pytest.fail(f"waited {deadline_s} s for {what}")
        time.sleep(0.02)


def previous_report(out: Path) -> dict[Path, bytes]:
    """A stand-in for the previous report: every file of it, each with content of its own."""
    out.mkdir(parents=True, exist_ok=True)
    files = {out / name: f"previous {name}\n".encode() for name in OUTPUTS}
    for path, content in files.items():
        path.write_bytes(content)
    return files


def contents(paths) -> dict[Path, bytes | None]:
    return {path: path.read_bytes() if path.exists() else None for path in paths}


def assert_whole(found: dict, previous: dict) -> None:
    """Every file the previous one, or every file a new one: never some of each, none missing."""
    assert None not in found.values(), [p.name for p, c in found.items() if c is None]
    kept = [p.name for p in found if found[p] == previous[p]]
    assert kept in ([], [p.name for p in previous]), f"a mix: {kept} previous, the rest new"


def assert_one_line(stderr: str, *fragments) -> None:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    assert lines[0].startswith("ddpscale report: cannot write the report into ")
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


# --- the shell line the workflow runs -------------------------------------------------------------

def shell_template(rule: str) -> str:
    """The shell: string of a rule in report.smk, its literals joined as Snakemake joins them."""
    text = RULES.read_text()
    body = text[text.index(f"rule {rule}:"):]
    body = body[body.index("    shell:\n") + len("    shell:\n"):]
    parts = []
    for line in body.splitlines():
        if not line.strip().startswith('"'):
            break
        parts.append(ast.literal_eval(line.strip()))
    return "".join(parts)


@pytest.mark.parametrize("rule", ["report_scaling", "partial_report"])
def test_the_report_job_execs_the_report(rule):
    # without exec, the signal that ends the job (Snakemake's Popen.terminate) ends only the
    # shell, and the report goes on writing, an orphan, over the previous report put back
    assert shell_template(rule).startswith("exec ")


def shell_line(rule: str, metrics, out_dir: Path, log: Path) -> str:
    """The rule's shell line as Snakemake runs it (its bash prefix too), with this test's values;
    a placeholder the test does not know fails here, so a changed rule is noticed."""
    values = {"params.python:q": shlex.quote(sys.executable), "input.script": shlex.quote(str(SCRIPT)),
              # the records travel among the flags (runplan.report_flags)
              "params.flags": shlex.join(["--metrics", *map(str, metrics)]),
              "params.out_dir": shlex.quote(str(out_dir)), "log": shlex.quote(str(log))}
    return "set -euo pipefail; " + re.sub(r"\{([^{}]+)\}", lambda m: values[m.group(1)], shell_template(rule))


def children(pid: int) -> list[int]:
    """Every process below pid (from /proc: this is Linux, as the clusters are)."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        below = parents.get(todo.pop(), [])
        found += below
        todo += below
    return found


def gone(pid: int) -> bool:
    """pid has ended (a zombie has: it runs no more code)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_a_killed_report_job_leaves_a_whole_report_that_nothing_changes_after_restore(tmp_path):
    """As Snakemake runs the job and ends it (Ctrl-C, scancel, a failure elsewhere): keep at its
    start, the job's outputs deleted, the shell started; the shell terminated mid-report, the
    outputs restored (onerror). Once every process of the job has ended, the report is the one
    restore left, and whole."""
    out = tmp_path / "report"
    outputs = [out / name for name in OUTPUTS]
    previous = previous_report(out)
    keep(outputs)
    for path in outputs:
        path.unlink()
    line = shell_line("report_scaling", write_fixtures(tmp_path, RUNS), out, tmp_path / "report.log")
    job = subprocess.Popen(line, shell=True, executable=shutil.which("bash"))
    try:
        wait_for(lambda: any(p.name != ".previous" for p in out.iterdir()), "the report to start writing")
        writers = [job.pid, *children(job.pid)]
        job.terminate()  # what snakemake.shell.terminate does to a job's shell
        restore(outputs)
        restored = contents(outputs)
        wait_for(lambda: all(gone(pid) for pid in writers), "every process of the report job to end")
    finally:
        job.kill()
        job.wait()
    assert contents(outputs) == restored
    assert_whole(restored, previous)
    assert not list(out.glob(f"{STAGING}*"))


# --- staged and restore ---------------------------------------------------------------------------

def test_staged_moves_the_whole_set_at_the_end(tmp_path):
    previous = previous_report(tmp_path)
    with staged(tmp_path) as stage:
        for path in previous:
            (stage / path.name).write_text("new")
            assert path.read_bytes() == previous[path]  # nothing in place before the end
    assert all(path.read_text() == "new" for path in previous)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(OUTPUTS)


def test_staged_leaves_the_folder_as_it_was_on_an_error(tmp_path):
    previous = previous_report(tmp_path)
    with pytest.raises(OSError), staged(tmp_path) as stage:
        (stage / "scaling.tsv").write_text("new")
        raise OSError(errno.ENOSPC, "No space left on device")
    assert contents(previous) == previous
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(OUTPUTS)


def test_a_killed_writer_s_staging_folder_is_cleared_by_the_next(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], check=True, capture_output=True,
                          text=True)
    stale = tmp_path / f"{STAGING}{int(dead.stdout)}"
    stale.mkdir()
    (stale / "report.html").write_text("half")
    with staged(tmp_path) as stage:
        (stage / "report.html").write_text("new")
    assert not stale.exists() and (tmp_path / "report.html").read_text() == "new"


def test_restore_waits_for_a_writer_moving_its_set_into_place(tmp_path):
    previous = previous_report(tmp_path)
    keep(previous)
    (tmp_path / "scaling.tsv").unlink()
    started = threading.Event()

    def restoring():
        started.set()
        restore(previous)

    with publish_lock(tmp_path):
        thread = threading.Thread(target=restoring)
        thread.start()
        started.wait()
        thread.join(0.3)  # bounded: it must still be waiting, whatever the host's speed
        assert thread.is_alive() and not (tmp_path / "scaling.tsv").exists()
        (tmp_path / "scaling.tsv").write_text("new")  # the writer's file, put in place under the lock
    thread.join()
    assert (tmp_path / "scaling.tsv").read_text() == "new"  # kept: not replaced by the old copy


# --- a folder that takes no files -----------------------------------------------------------------

@pytest.fixture
def report_script(monkeypatch):
    """scripts/report.py as a module, its process-wide settings (the SIGTERM handler, warnings)
    put back after the test."""
    spec = importlib.util.spec_from_file_location("report_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(warnings, "showwarning", warnings.showwarning)
    handler = signal.getsignal(signal.SIGTERM)
    yield module
    signal.signal(signal.SIGTERM, handler)


def test_a_full_disk_is_one_line_and_the_previous_report_stays(tmp_path, report_script, monkeypatch, capsys):
    """ENOSPC from the table writer after two tables (test_a_real_full_disk_... fills a real one
    where a small file system can be mounted)."""
    out = tmp_path / "report"
    previous = previous_report(out)
    written = []

    def full(path, table):
        if len(written) == 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        written.append(path)
        path.write_text("new")

    monkeypatch.setattr(report_script.tsv, "write", full)
    code = report_script.main(["--metrics", *map(str, write_fixtures(tmp_path, RUNS)), "--out-dir", str(out)])
    assert code == 2
    assert_one_line(capsys.readouterr().err, str(out), "No space left on device", "free space")
    assert contents(previous) == previous
    assert sorted(p.name for p in out.iterdir()) == sorted(OUTPUTS)


@pytest.fixture
def small_fs(tmp_path):
    """A tmpfs of 256 KiB (the report needs about 700): a real full disk. Mounting needs root
    (CAP_SYS_ADMIN); elsewhere the test skips and the monkeypatched one above stands in."""
    where = tmp_path / "fs"
    where.mkdir()
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(where)],
                              check=False, capture_output=True, text=True)
    except FileNotFoundError:
        pytest.skip("no mount command here")
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip()}): needs root")
    yield where
    subprocess.run(["umount", str(where)], check=True)


def test_a_real_full_disk_is_one_line_and_the_previous_report_stays(tmp_path, small_fs):
    out = small_fs / "report"
    previous = previous_report(out)
    proc = run_report(write_fixtures(tmp_path, RUNS), out)
    assert proc.returncode == 2
    assert_one_line(proc.stderr, str(out), "No space left on device", "free space")
    assert contents(previous) == previous
    assert sorted(p.name for p in out.iterdir()) == sorted(OUTPUTS)


def test_a_read_only_folder_is_one_line_and_the_previous_report_stays(tmp_path, small_fs):
    out = small_fs / "report"
    previous = previous_report(out)
    subprocess.run(["mount", "-o", "remount,ro", str(small_fs)], check=True)
    proc = run_report(write_fixtures(tmp_path, RUNS), out)
    assert proc.returncode == 2
    assert_one_line(proc.stderr, str(out), "Read-only file system", "read-only")
    assert contents(previous) == previous
