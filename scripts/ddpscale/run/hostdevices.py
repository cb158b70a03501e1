"""What this host offers the local profile: visible GPUs, usable cores, and GPU or CPU.

Pure and light (never imports torch): the workflow decides while it is parsed, before any
job, whether every topology runs on GPUs or every one is simulated by CPU processes. The
local launcher simulates M nodes on this one host, so a topology M x N needs M x N GPUs of
its own here; on CPU one simulated device is one core.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field
from typing import Callable, Mapping, NamedTuple, Sequence

from ddpscale.run.topology import Topology

# How visible_gpus counted, named in the messages so a user knows what to change.
SOURCES = "CUDA_VISIBLE_DEVICES / nvidia-smi -L"
SMI_TIMEOUT_S = 10


class AcceleratorError(ValueError):
    """accelerator: gpu, but this host cannot give every topology its own GPUs."""


class VisibleGpus(NamedTuple):
    count: int
    ids: tuple[str, ...]  # what a launcher can put in CUDA_VISIBLE_DEVICES, one entry per GPU
    source: str  # how they were found, for messages


def run_nvidia_smi() -> str | None:
    """`nvidia-smi -L`'s output, or None when it is missing, fails or hangs."""
    try:
        proc = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=SMI_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout if proc.returncode == 0 else None


def _leading_integer(entry: str) -> int | None:
    """CUDA reads an index like strtoul: the leading digits ('1gpu' is 1); None if there are none."""
    digits = ""
    for char in entry:
        if not char.isdigit():
            break
        digits += char
    return int(digits) if digits else None


def parse_cuda_visible_devices(value: str) -> tuple[str, ...]:
    """The GPUs a CUDA_VISIBLE_DEVICES value exposes, as CUDA (and torch) read it.

    Indices: enumeration stops at the first entry that is not a non-negative index ("-1",
    "NoDevFiles", ""). UUIDs ("GPU-...", "MIG-..."): the list is of the kind of its first
    entry and stops at the first entry of another kind. A repeated entry exposes nothing.
    """
    entries = [entry.strip() for entry in value.split(",")]
    ids: list[str] = []
    prefix = next((p for p in ("GPU-", "MIG-") if entries[0].startswith(p)), None)
    for entry in entries:
        if prefix is not None:
            if not entry.startswith(prefix):
                break
            ident = entry
        else:
            index = _leading_integer(entry)
            if index is None:
                break
            ident = str(index)
        if ident in ids:
            return ()
        ids.append(ident)
    return tuple(ids)


def visible_gpus(environ: Mapping[str, str] | None = None,
                 run_smi: Callable[[], str | None] = run_nvidia_smi) -> VisibleGpus:
    """How many GPUs this process may use, and the ids a launcher can hand out.

    CUDA_VISIBLE_DEVICES decides when it is set (even to nothing); else every `GPU n:` line
    of `nvidia-smi -L` is one GPU, numbered 0..n-1. No nvidia-smi (or a failing one): none.
    """
    environ = os.environ if environ is None else environ
    if "CUDA_VISIBLE_DEVICES" in environ:
        value = environ["CUDA_VISIBLE_DEVICES"]
        ids = parse_cuda_visible_devices(value)
        return VisibleGpus(len(ids), ids, f'CUDA_VISIBLE_DEVICES="{value}"')
    listing = run_smi()
    if listing is None:
        return VisibleGpus(0, (), "CUDA_VISIBLE_DEVICES unset, nvidia-smi -L missing or failed")
    count = sum(1 for line in listing.splitlines() if line.startswith("GPU "))
    return VisibleGpus(count, tuple(str(i) for i in range(count)), "nvidia-smi -L")


# The least memory one CPU-simulated rank takes of its own: a forked spiral-MLP rank held
# 130 MB private (Private_Dirty + Private_Clean of /proc/PID/smaps_rollup) while training here;
# a user's model only adds to it. A topology whose ranks need more than the host's memory
# cannot run, however long it waits, and 99999x8 would start 800,000 processes.
RANK_MEMORY_MB = 100


def host_memory_mb() -> int:
    """This host's physical memory in MB (what every simulated rank shares)."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 1_000_000


def unholdable(topologies: Sequence[Topology], memory_mb: int) -> list[Topology]:
    """The topologies whose CPU-simulated ranks cannot fit in this host's memory together."""
    return [t for t in topologies if t.world_size * RANK_MEMORY_MB > memory_mb]


def unholdable_message(topo: Topology, memory_mb: int, where: str) -> str:
    most = max(1, memory_mb // RANK_MEMORY_MB)
    return (
        f"{where}: '{topo.name}' runs {topo.world_size:,} processes on this machine (the local profile "
        f"simulates each device as one), which need at least {topo.world_size * RANK_MEMORY_MB / 1000:,.0f} GB "
        f"of memory; this machine has {memory_mb / 1000:,.0f} GB. Use at most {most:,} devices in all "
        "here, or run it with a cluster profile"
    )


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask, which cgroups and taskset narrow)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


@dataclass(frozen=True)
class Decision:
    accelerator: str  # "gpu" or "cpu": every topology of the workflow runs on it
    note: str | None = None  # one line for the user: why every topology is CPU-simulated
    oversubscribed: list[str] = field(default_factory=list)  # topologies with more ranks than cores
    # CPU threads of one rank. A simulated device is one core, so adding devices adds hardware.
    # A GPU rank gets its GPU's share of the cores, the same in every topology, as a cluster's
    # cpus-per-gpu: one thread starved the GPU's feeding against a plain loop using every core.
    threads: int = 1


def _gpus(count: int) -> str:
    return f"{count} GPU" + ("" if count == 1 else "s")


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:]


def _too_large(topologies: Sequence[Topology], gpus: int) -> list[Topology]:
    return [t for t in topologies if t.world_size > gpus]


def choose_accelerator(requested: str, topologies: Sequence[Topology], gpus: int, cores: int,
                       source: str = SOURCES, where: str = "config/config.yaml") -> Decision:
    """GPU or CPU for every topology of a local workflow (a report never mixes the two).

    auto: GPUs only when every topology's M x N ranks get a GPU each, else CPU with a note.
    gpu: too few GPUs is an AcceleratorError naming the topology, the count and the fix.
    cpu: always CPU. On CPU, topologies with more ranks than usable cores are oversubscribed.
    """
    if requested not in ("auto", "gpu", "cpu"):
        raise AcceleratorError(f"{where}: accelerator is {requested!r}; use auto, gpu or cpu")
    too_large = _too_large(topologies, gpus)
    needs = ", ".join(f"{t.name} ({_gpus(t.world_size)})" for t in too_large)
    if requested == "gpu" and too_large:
        have = f"this machine has {_gpus(gpus)}" if gpus else "no GPU was found"
        fixes = ["set accelerator: auto or cpu to simulate them with CPU processes",
                 "use a machine with more GPUs"]
        if gpus:
            fixes.insert(0, f"remove the topologies larger than {gpus} device{'' if gpus == 1 else 's'}")
        raise AcceleratorError(
            f"{where}: accelerator is gpu but {have} ({source}), too few for {needs}: the local "
            "profile simulates every node on this host, so a topology MxN needs M x N GPUs here. "
            f"{_sentence(', '.join(fixes[:-1]))} or {fixes[-1]}"
        )
    note = None
    if requested == "gpu" or (requested == "auto" and gpus and not too_large):
        return Decision("gpu", threads=max(1, cores // gpus))
    if requested == "auto":
        if not gpus:
            note = f"no GPU found ({source}): every device is simulated by one CPU process"
        else:
            note = (
                f"accelerator auto: this machine has {_gpus(gpus)} ({source}), too few for {needs}, "
                "so every topology runs CPU-simulated; a report never mixes GPU and CPU rows. "
                f"Remove the topologies larger than {gpus} device{'' if gpus == 1 else 's'} "
                "or use a machine with more GPUs"
            )
    oversubscribed = [t.name for t in topologies if t.world_size > cores]
    return Decision("cpu", note, oversubscribed)


def oversubscription_warning(names: Sequence[str], cores: int) -> str:
    """One line for the topologies whose simulated devices outnumber the usable cores."""
    return (
        f"{', '.join(names)}: more simulated devices than the {cores} usable "
        f"core{'' if cores == 1 else 's'} of this machine (os.sched_getaffinity), so their ranks "
        "share cores and measure contention, not scaling (metrics.json: oversubscribed: true). "
        f"Remove the topologies larger than {cores} device{'' if cores == 1 else 's'} or use a "
        "machine with more cores"
    )


def host_oversubscribed(simulated: bool, hosts: Sequence[str], world_size: int, cores: int,
                        one_launcher: bool = True) -> bool:
    """Whether a finished run had more CPU-simulated ranks on its one host than usable cores.

    one_launcher: the ranks shared the launching process's cores (the local launcher), not
    a core set of their own each (srun binds every task to its cpus-per-task).
    """
    return bool(simulated and one_launcher and len(hosts) == 1 and world_size > cores)
