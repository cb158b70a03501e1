"""What every rank of a run reports, gathered on every rank.

Light at import (torch.distributed is imported when called), like the rest of cluster/.
"""

from __future__ import annotations


def gather(value) -> list:
    """Every rank's value, in rank order (collective: all ranks must call it), or this rank's
    alone when there is no process group (one rank)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return [value]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out
