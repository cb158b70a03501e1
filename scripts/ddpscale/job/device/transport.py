"""Record the network each rank's collectives used: the transport NCCL chose
(read from its own log, which this module turns on before the process group forms) or the
interface gloo bound to. The parsing is ddpscale.core.transport; this is the I/O.

NCCL says what it chose only at NCCL_DEBUG=INFO. Its log goes to a file per rank under the run's
folder (<run dir>/nccl/<host>.<pid>.log, NCCL's own %h.%p), so the job log stays short; a user
who set NCCL_DEBUG or NCCL_DEBUG_FILE keeps their logging, and the transport is then not known.
"""
from __future__ import annotations

import os
import socket
from pathlib import Path

from ddpscale.core.transport import gloo_interface, parse_nccl_log

NCCL_DIR = "nccl"


def nccl_debug_env(run_dir: str, environ) -> dict[str, str]:
    """The variables to set so NCCL logs its transport to a file, or {} where the user set NCCL's logging."""
    if "NCCL_DEBUG" in environ or "NCCL_DEBUG_FILE" in environ:
        return {}
    wanted = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_FILE": str(Path(run_dir, NCCL_DIR, "%h.%p.log"))}
    if "NCCL_DEBUG_SUBSYS" not in environ:
        wanted["NCCL_DEBUG_SUBSYS"] = "INIT,NET"  # the transport lines, not every collective
    return wanted


def prepare(metrics_path: str, world_size: int, accelerator: str) -> None:
    """Turn on NCCL's transport log for this rank; before the process group forms (NCCL reads its
    variables when it first initialises). One rank has no group, a CPU run no NCCL."""
    if world_size < 2 or accelerator == "cpu":
        return
    run_dir = str(Path(metrics_path).parent)
    wanted = nccl_debug_env(run_dir, os.environ)
    if wanted:
        Path(run_dir, NCCL_DIR).mkdir(parents=True, exist_ok=True)  # NCCL does not create it
        os.environ.update(wanted)


def nccl_log_path(run_dir: str) -> Path:
    """This rank's log as NCCL names it: %h is the host name up to its first dot, %p the pid."""
    host = socket.gethostname().split(".")[0].replace("%", "-").replace("/", "-")
    return Path(run_dir, NCCL_DIR, f"{host}.{os.getpid()}.log")


def _gloo_entry() -> dict:
    try:
        import psutil  # installed with Snakemake; read only here
        interfaces = {name: [(a.address, a.netmask) for a in addrs if a.family in (socket.AF_INET, socket.AF_INET6)]
                      for name, addrs in psutil.net_if_addrs().items()}
    except ImportError:
        interfaces = {}
    try:
        resolved = [info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None)]
    except OSError:
        resolved = []
    return {"transport": "TCP", "interface": gloo_interface(os.environ.get("GLOO_SOCKET_IFNAME"),
                                                           list(dict.fromkeys(resolved)), interfaces)}


def rank_entry(backend: str | None, run_dir: str) -> dict:
    """This rank's {rank, host, backend, transport, interface}."""
    import torch.distributed as dist

    entry = {"rank": dist.get_rank() if dist.is_available() and dist.is_initialized() else 0,
             "host": socket.gethostname(), "backend": backend}
    if backend == "gloo":
        return {**entry, **_gloo_entry()}
    if backend == "nccl":
        path = nccl_log_path(run_dir)
        if not path.exists():
            ours = os.environ.get("NCCL_DEBUG_FILE") == str(Path(run_dir, NCCL_DIR, "%h.%p.log"))
            why = f"no NCCL log at {path}" if ours else "NCCL_DEBUG or NCCL_DEBUG_FILE set by the user"
            return {**entry, "transport": None, "interface": None, "network": None, "why_unknown": why}
        parsed = parse_nccl_log(path.read_text(errors="replace"))
        return {**entry, **parsed, "log": str(path)}
    return {**entry, "transport": None, "interface": None}


def section(backend: str | None, transports: list[dict] | None, site_interconnect: str) -> dict:
    """The record's transport section (ddpscale.core.record.SECTIONS): the process group's backend
    (None on one rank), each rank's transport (gather) and what the site says its interconnect is."""
    return {"backend": backend, "transport": transports, "site_interconnect": site_interconnect}


def gather(backend: str | None, metrics_path: str) -> list[dict] | None:
    """Every rank's entry, in rank order, on every rank (a collective: all ranks call it); None for one rank."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return None
    mine = rank_entry(backend, str(Path(metrics_path).parent))
    entries = [None] * dist.get_world_size()
    dist.all_gather_object(entries, mine)
    return entries
