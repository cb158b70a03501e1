"""`make status` on a real local workflow started with overrides: what it planned, while a run
trains, after it is killed, and the lock its killed snakemake leaves behind (tests/unit/status/test_status.py
has the rest)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time

import psutil
import pytest

from helpers.status import run_status
from helpers.workflow import SNAKEMAKE, tiny_config
from ddpscale.core.record import last_progress
from ddpscale.plan import planfile


# -- a real local workflow, watched, then killed ----------------------------------------------

def kill_everything_in(path) -> None:
    """SIGKILL the processes this test started there (snakemake, its job, the ranks)."""
    for proc in psutil.process_iter(["cwd"]):
        if proc.info["cwd"] == str(path) and proc.pid != os.getpid():
            try:
                proc.send_signal(signal.SIGKILL)
            except psutil.Error:
                pass


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_local_run_while_it_trains_then_killed(workspace):
    epochs = 6
    # started with overrides: another experiment, and one topology of config/config.yaml left out
    config = tiny_config(topologies=["1x1", "1x2", "2x1"], max_epochs=epochs)
    config["dataset"]["samples"] = 40000  # about a second an epoch: the run is still training when sampled
    workspace.write_config(config)
    overrides = ["--config", "experiment=watched", "topologies=[1x1, 1x2]"]
    results = workspace.path / "results/watched"
    logs = {t: results / f"logs/train/{t}/r0.log" for t in ("1x1", "1x2")}
    proc = subprocess.Popen([*SNAKEMAKE, "--profile", "profiles/local", "scaling", *overrides], cwd=workspace.path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline, first = time.monotonic() + 200, None
        while first is None and time.monotonic() < deadline and proc.poll() is None:
            first = next((t for t, log in logs.items() if log.exists() and last_progress(log.read_text())), None)
            time.sleep(0.2)
        assert first is not None, "no epoch finished"
        live = run_status(workspace.path, "--config", "experiment=watched")
        unnamed = run_status(workspace.path)
        print(live.stdout)
        line_read = last_progress(logs[first].read_text())
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
        kill_everything_in(workspace.path)
    other = ({"1x1", "1x2"} - {first}).pop()
    assert live.returncode == 0, live.stderr
    # what the run planned, with its overrides and what the local site resolved, written when the jobs started
    assert json.loads((results / "plan.json").read_text()) == planfile.written(
        "watched", "full", "1x1", {"baseline": ["1x1"], "single_node": ["1x2"], "multi_node": []}, 1)
    assert live.stdout.splitlines()[1] == ("experiment watched: as its workflow planned it "
                                           "(results/watched/plan.json): measure full, 2 topologies, 1 repeat each")
    assert [line.split()[0] for line in live.stdout.splitlines() if re.match(r"^\d+x\d+ ", line)] == ["1x1", "1x2"], \
        "only the planned topologies, not config/config.yaml's 2x1"
    # the experiment not named: config/config.yaml's, never run, and the one that was
    assert unnamed.returncode == 0 and unnamed.stdout.splitlines()[1].startswith(
        "experiment spiralmlp: not planned yet: no results/spiralmlp/plan.json"), unnamed.stdout
    assert unnamed.stdout.splitlines()[1].endswith("planned here: watched (pick one with --config experiment=NAME)")
    assert f"snakemake: running here (pid {proc.pid})" in live.stdout
    running = re.search(rf"^{first} +r0 +running +epoch (\d+)/(\d+), elapsed (\d+):(\d\d), ~\d+:\d\d left, "
                        r"([\d.]+) samples/s last epoch$", live.stdout, re.M)
    assert running, live.stdout
    epoch, max_epochs, minutes, seconds, throughput = running.groups()
    assert 1 <= int(epoch) < epochs and int(max_epochs) == epochs
    shown = [p for p in map(last_progress, logs[first].read_text().splitlines()) if p and p.epoch == int(epoch)]
    assert shown and float(throughput) == pytest.approx(shown[0].throughput, abs=0.051)
    assert int(minutes) * 60 + int(seconds) >= shown[0].fit_s - 1
    assert re.search(rf"^{other} +r0 +not started$", live.stdout, re.M), "the local profile trains one at a time"
    assert line_read.epoch >= int(epoch)

    # killed: the run failed (its log's last line), and the lock stays behind
    assert os.listdir(workspace.path / ".snakemake/locks"), "a killed snakemake leaves its lock"
    after = run_status(workspace.path, "--config", "experiment=watched").stdout
    print(after)
    last = [line.strip() for line in logs[first].read_text().splitlines() if line.strip()][-1]
    assert re.search(rf"^{first} +r0 +failed +{re.escape(last[:100])}", after, re.M), after
    assert "snakemake: not running here" in after
    fix = re.search(r"Stale Snakemake lock: .* rerun stops with 'Directory cannot be locked': fix with "
                    r"(\.venv/bin/snakemake --profile profiles/<name> --unlock) \(<name>: ([\w, -]+)\)$", after, re.M)
    assert fix and "local" in fix.group(2).split(", "), after
    # what the line says is so: the same run again refuses, the named fix lifts it
    refused = workspace.snakemake("scaling", *overrides, timeout=120)  # the same outputs: a lock holds them
    assert refused.returncode != 0 and "Directory cannot be locked" in refused.stderr + refused.stdout
    unlock = fix.group(1).replace(".venv/bin/snakemake", SNAKEMAKE[0]).replace("<name>", "local").split()
    assert subprocess.run(unlock, cwd=workspace.path, capture_output=True, timeout=120).returncode == 0
    assert not list((workspace.path / ".snakemake").glob("locks/*"))
    assert "lock" not in run_status(workspace.path, "--config", "experiment=watched").stdout
