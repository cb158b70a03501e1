"""Lightning's own per-batch synchronisation in DDP, done as Lightning does it, for the probe.

Lightning 2.6 (pytorch_lightning/loops/training_epoch_loop.py, advance ->
_broadcast_sigterm_tensor) broadcasts a one-element SIGTERM flag from rank 0 and reads it
back with .item() before every training batch when the world size is above one: a collective
and a host sync per batch that a one-device run does not pay (upstream issue #21487; pull
request #21640 proposes doing it every n steps). The probe times synchronised blocks with and
without this call, so the breakdown names its cost instead of hiding it in framework overhead.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def sigterm_broadcast(device: torch.device) -> None:
    """One batch's SIGTERM broadcast: the flag is 0 here (no rank received SIGTERM)."""
    flag = torch.tensor([0], device=device)
    dist.broadcast(flag, src=0)
    flag.item()
