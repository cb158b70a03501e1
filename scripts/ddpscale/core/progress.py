"""The one progress line rank 0 writes to its log per finished epoch, and its reader.

Both sides live here so the line `make status` parses is the line training writes. Light on
purpose (no torch): the status command imports it on a login node.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

PREFIX = "ddpscale progress:"
_LINE = re.compile(
    rf"^{re.escape(PREFIX)} epoch (?P<epoch>\d+)/(?P<max_epochs>\d+) in (?P<epoch_s>[\d.]+) s, "
    r"(?P<throughput>[\d.]+) samples/s; attempt (?P<attempt>\d+) fit (?P<fit_s>[\d.]+) s; at (?P<at>[\d.]+)$"
)


@dataclass(frozen=True)
class Progress:
    epoch: int  # epochs finished, counting those of earlier attempts (1-based)
    max_epochs: int
    epoch_s: float  # the last epoch's wall time (train + validation)
    throughput: float  # the last epoch's samples per second over all ranks
    attempt: int
    fit_s: float  # this attempt's time in fit when the line was written
    at: float  # Unix time the line was written


def line(p: Progress) -> str:
    return (f"{PREFIX} epoch {p.epoch}/{p.max_epochs} in {p.epoch_s:.3f} s, {p.throughput:.1f} samples/s; "
            f"attempt {p.attempt} fit {p.fit_s:.1f} s; at {p.at:.1f}")


def last(log_text: str) -> Progress | None:
    """The last progress line of a log, or None before the first epoch ends."""
    for text in reversed(log_text.splitlines()):
        match = _LINE.match(text.strip())
        if match:
            g = match.groupdict()
            return Progress(int(g["epoch"]), int(g["max_epochs"]), float(g["epoch_s"]), float(g["throughput"]),
                            int(g["attempt"]), float(g["fit_s"]), float(g["at"]))
    return None
