"""Local launcher: start one process per simulated device, M simulated nodes on this host.

Every rank gets the variables Lightning's LightningEnvironment reads (MASTER_ADDR/PORT,
NODE_RANK, LOCAL_RANK, WORLD_SIZE), so Lightning forms the M x N process group without
spawning more processes itself, and node ranks 0..M-1 really occur.

With --gpu-ids each simulated node gets GPUs of its own, as a real node would: node m's ranks
see CUDA_VISIBLE_DEVICES = ids[m*N:(m+1)*N], so local rank k uses cuda:k of its node and no
two ranks share a GPU. Without it CUDA_VISIBLE_DEVICES is inherited unchanged (the workflow
sets it empty for CPU-simulated runs, see ddpscale.plan.site.resources.launch_prefix).
"""

from __future__ import annotations

import ctypes
import datetime as dt
import importlib
import os
import runpy
import signal
import socket
import subprocess
import sys
import time

from ddpscale.job.launch import machinelock

PR_SET_PDEATHSIG = 1


class LaunchError(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rank_env(base: dict, nodes: int, procs_per_node: int, node: int, local: int, port: int,
             gpu_ids: list[str] | None = None) -> dict:
    """The environment of one rank; with gpu_ids, its node's own slice of them."""
    env = dict(base)
    if gpu_ids is not None:
        mine = gpu_ids[node * procs_per_node:(node + 1) * procs_per_node]
        if len(mine) != procs_per_node:
            raise LaunchError(
                f"--gpu-ids gives {len(gpu_ids)} GPU(s) but {nodes} node(s) x {procs_per_node} "
                f"rank(s) need {nodes * procs_per_node}, one each")
        env["CUDA_VISIBLE_DEVICES"] = ",".join(mine)
    env.update({
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "WORLD_SIZE": str(nodes * procs_per_node),
        "NODE_RANK": str(node),
        "LOCAL_RANK": str(local),
        "RANK": str(node * procs_per_node + local),
        "LOCAL_WORLD_SIZE": str(procs_per_node),
        "DDPSCALE_SIMULATED_NODES": str(nodes),
    })
    return env


def _die_with_parent() -> None:
    # If the launcher is SIGKILLed, its ranks must not train on (or hang in a collective).
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def describe_exit(rank: int, code: int) -> str:
    """One line on how a rank ended, from its exit status (negative: the signal that killed it)."""
    if code < 0:
        return f"rank {rank} was killed by signal {-code} ({_signal_name(-code)})"
    if code > 128 and _signal_name(code - 128):
        return f"rank {rank} exited with code {code}: it stopped on {_signal_name(code - 128)}"
    return f"rank {rank} exited with code {code}"


def _signal_name(signum: int) -> str | None:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return None


def parse_gpu_ids(text: str) -> list[str]:
    """'0,1' or 'GPU-ab..,GPU-cd..' -> the ids; an empty entry is an error."""
    ids = [entry.strip() for entry in text.split(",")]
    if not all(ids) or len(set(ids)) != len(ids):
        raise LaunchError(f"--gpu-ids {text!r}: give distinct GPU indices or UUIDs separated by commas")
    return ids


# How long a rank's plain error waits for a peer killed by a signal, to name the cause.
CAUSE_WAIT_S = 2.0


def _failed(codes) -> list[tuple[int, int]]:
    """(rank, exit code) of every rank that has ended badly (negative: killed by that signal)."""
    return [(rank, code) for rank, code in enumerate(codes) if code not in (None, 0)]


def _cause(failed: list[tuple[int, int]]) -> tuple[int, int]:
    """The rank to blame: one killed by a signal before one that exited with an error (a
    peer's error is the lost connection to the killed rank), else the lowest rank."""
    return min(failed, key=lambda item: item[1] >= 0)


def run(nodes: int, procs_per_node: int, command: list[str], poll_s: float = 0.05,
        gpu_ids: list[str] | None = None) -> int:
    if nodes * procs_per_node > 1 and os.environ.get("SLURM_JOB_ID"):
        raise LaunchError(
            "a multi-rank topology reached the local launcher inside a SLURM job: the profile's "
            "set-resources train lacks site_launcher: srun, so the ranks would all run "
            "in one task on one node. If you passed --set-resources on the command line, it "
            "replaced the profile's entries: repeat the site_* entries there"
        )
    if os.environ.get("SLURM_JOB_ID"):  # an allocation's cores are its own: SLURM keeps jobs apart
        return _run_ranks(nodes, procs_per_node, command, poll_s, gpu_ids)
    holder = machinelock.holder_line(f"topology {nodes}x{procs_per_node}", os.getpid(), os.getcwd(),
                                     dt.datetime.now(dt.timezone.utc))
    with machinelock.held(machinelock.lock_path(os.environ), holder, _say):
        return _run_ranks(nodes, procs_per_node, command, poll_s, gpu_ids)


def _say(line: str) -> None:
    print(f"ddpscale launch: {line}", file=sys.stderr, flush=True)


def _run_ranks(nodes: int, procs_per_node: int, command: list[str], poll_s: float,
               gpu_ids: list[str] | None) -> int:
    port = free_port()
    envs = [rank_env(os.environ, nodes, procs_per_node, node, local, port, gpu_ids)
            for node in range(nodes) for local in range(procs_per_node)]
    if _same_python_script(command):
        procs = _fork_ranks(command[1:], envs)
    else:
        procs = [subprocess.Popen(command, env=env, preexec_fn=_die_with_parent) for env in envs]

    def forward(signum, _frame):
        print(f"ddpscale launch: received {_signal_name(signum)}; passing it to every rank",
              file=sys.stderr, flush=True)
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signum)

    # SIGUSR1 is the time-limit warning a cluster profile asks for (ddpscale.job.resume.signals)
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
        signal.signal(signum, forward)
    failed = 0
    while any(proc.poll() is None for proc in procs):
        bad = _failed(proc.poll() for proc in procs)
        if bad:
            # One rank died: the others would wait in their next collective until its timeout.
            # A rank killed by a signal is the cause, but a peer's error (its collective lost
            # the connection) can be reaped first: a SIGKILLed process closes its sockets
            # before it becomes a zombie, and on a loaded machine that gap outlasted the peer's
            # exit. So a plain error waits briefly for a killed peer before it is blamed.
            deadline = time.monotonic() + CAUSE_WAIT_S
            while all(code >= 0 for _, code in bad) and time.monotonic() < deadline:
                time.sleep(poll_s)
                bad = _failed(proc.poll() for proc in procs)
            rank, failed = _cause(bad)
            print(f"ddpscale launch: {describe_exit(rank, failed)}; stopping the other ranks",
                  file=sys.stderr, flush=True)
            _stop(procs)
            break
        time.sleep(poll_s)
    codes = [proc.wait() for proc in procs]
    if failed:
        return failed
    # every rank ended between two polls (a peer's error follows a kill within milliseconds)
    bad = _failed(codes)
    rank, code = _cause(bad) if bad else (0, 0)
    if code:
        print(f"ddpscale launch: {describe_exit(rank, code)}", file=sys.stderr, flush=True)
    return code


# Importing torch + Lightning costs ~5 s of CPU per process here; with 4 ranks on 2 cores
# that was 13 s of a 22 s run. Importing once and forking each rank keeps one process per
# simulated device. Safe because nothing has started a thread, a CUDA context or a process
# group before the fork.
PRELOAD = ("torch", "pytorch_lightning")


def _same_python_script(command: list[str]) -> bool:
    return (len(command) >= 2 and command[1].endswith(".py")
            and os.path.realpath(command[0]) == os.path.realpath(sys.executable)
            and os.environ.get("DDPSCALE_NO_FORK") != "1")


class _Forked:
    """The part of Popen's interface that run() uses, for a forked rank."""

    def __init__(self, pid: int):
        self.pid, self.returncode = pid, None

    def poll(self):
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout=None):
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout)
            time.sleep(0.02)
        return self.returncode

    def send_signal(self, signum):
        if self.poll() is None:
            os.kill(self.pid, signum)

    def terminate(self):
        self.send_signal(signal.SIGTERM)

    def kill(self):
        self.send_signal(signal.SIGKILL)


def _fork_ranks(argv: list[str], envs: list[dict]) -> list[_Forked]:
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    sys.stdout.flush()
    sys.stderr.flush()
    procs = []
    for env in envs:
        pid = os.fork()
        if pid == 0:
            _run_rank(argv, env)  # never returns
        procs.append(_Forked(pid))
    return procs


def _run_rank(argv: list[str], env: dict) -> None:
    code = 1
    try:
        _die_with_parent()
        os.environ.clear()
        os.environ.update(env)
        sys.argv = list(argv)
        sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
        runpy.run_path(argv[0], run_name="__main__")
        code = 0
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _stop(procs, grace_s: float = 5.0) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + grace_s
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, required=True, help="simulated nodes (M)")
    parser.add_argument("--procs-per-node", type=int, required=True, help="processes per node (N)")
    parser.add_argument("--gpu-ids", default=None,
                        help="GPUs to hand out, comma-separated (indices or UUIDs): node m's ranks see "
                             "ids[m*N:(m+1)*N] as CUDA_VISIBLE_DEVICES; absent: inherit it unchanged")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command every rank runs")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command or args.nodes < 1 or args.procs_per_node < 1:
        parser.error("need --nodes >= 1, --procs-per-node >= 1 and a command after --")
    try:
        gpu_ids = None if args.gpu_ids is None else parse_gpu_ids(args.gpu_ids)
        code = run(args.nodes, args.procs_per_node, command, gpu_ids=gpu_ids)
    except LaunchError as err:
        print(f"ddpscale launch: {err}", file=sys.stderr)
        return 2
    return code if code >= 0 else 128 - code
