"""The network each run's collectives crossed, as the report says it, and the flag for a
multi-node run whose NCCL fell back to sockets on a site whose facts say InfiniBand.

Reads the per-rank `transport` entries a run records (ddpscale.job.device.transport) and its
`site_interconnect` (the profile's site fact). Pure: no torch.
"""
from __future__ import annotations

import pandas as pd

from ddpscale.core.transport import IB, LOCAL, SOCKET


def _rank_text(entry: dict) -> str:
    """One non-gloo rank's text (run_text joins gloo's interfaces itself)."""
    backend, kind, where = entry.get("backend"), entry.get("transport"), entry.get("interface")
    if backend != "nccl":
        return str(backend or "no backend")
    if kind == IB:
        return f"NCCL over InfiniBand (NET/IB on {where})"
    if kind == SOCKET:
        return f"NCCL over sockets (NET/Socket on {where})"
    if kind == LOCAL:
        return "NCCL within the node (P2P/SHM)"
    if kind:
        return f"NCCL over {kind} ({where})"
    why = entry.get("why_unknown")
    return f"NCCL, transport not recorded{f' ({why})' if why else ''}"


def run_text(transport) -> str | None:
    """'gloo on eth0', 'NCCL over InfiniBand (NET/IB on mlx5_0:1/IB)' for one run's ranks (their
    different texts joined); None for a run that recorded none (one rank has no collectives)."""
    if not isinstance(transport, list) or not transport:
        return None
    entries = [e for e in transport if isinstance(e, dict)]
    ifaces = list(dict.fromkeys(str(e.get("interface")) for e in entries if e.get("backend") == "gloo"))
    texts = [f"gloo on {', '.join(ifaces)}"] if ifaces else []
    texts += [_rank_text(e) for e in entries if e.get("backend") != "gloo"]
    return "; ".join(dict.fromkeys(texts)) or None


def socket_fallback(record: dict) -> str | None:
    """The socket interfaces of a multi-node NCCL run that used sockets on an InfiniBand site, else None."""
    if record["site_interconnect"] != "infiniband" or int(record["num_nodes"]) <= 1:
        return None
    transport = record["transport"]
    if not isinstance(transport, list):
        return None
    on = [str(e.get("interface")) for e in transport
          if isinstance(e, dict) and e.get("backend") == "nccl" and SOCKET in str(e.get("transport") or "").split("+")]
    return ", ".join(dict.fromkeys(on)) if on else None


def fallback_note(runs: pd.DataFrame) -> str | None:
    """'2x4 ran NCCL over sockets (NET/Socket on ib0), not InfiniBand as the site's facts say: ...'."""
    found = {}
    for _, row in runs.iterrows():
        where = socket_fallback(row.to_dict())
        if where:
            found.setdefault(str(row["topology"]), where)
    if not found:
        return None
    runs_text = ", ".join(f"{top} ran NCCL over sockets (NET/Socket on {where})" for top, where in found.items())
    return (f"{runs_text}, not InfiniBand as the site's facts say (site_interconnect): check NCCL_IB_HCA / "
            "NCCL_SOCKET_IFNAME in the profile's site_env, and the run's nccl/ logs; its time measures the "
            "fallback, not the interconnect.")
