"""The run's GPU: a GPU run stops at start without one, every clock waits for it, and its peak
memory and utilisation in steady training are recorded.

A GPU run stops at start when torch sees no CUDA device (require_gpu). With `accelerator:
auto`, Lightning trains on the CPU without a word when the CUDA build of torch cannot start on
a node (its driver too old, no driver, a CPU-only wheel), and the report would show a CPU
benchmark of a GPU cluster. Cluster runs ask for the GPU explicitly (the workflow passes
--accelerator gpu), and this check turns the silent fallback into one line naming torch's
CUDA, the node's driver and the fix, before any process group or data exists. stop_line and
driver_text are pure (unit-tested with the texts torch, nvidia-smi and the kernel module
print); node_facts reads them on the node.

Every timer (the epochs, the windows, the probe) reads its clock after sync_device: CUDA
kernels run asynchronously, so a clock read without it stops before the GPU has finished.

Utilisation is NVML's share of its last sample period (1/6 s to 1 s, by product) in which a
kernel ran. Only readings whose whole period fell inside the training phase of a steady epoch
count: warm-up and compilation, validation, checkpoint writes and the gaps between them are not
the step the verdict judges, and would make a compute-bound model read as overhead-bound.
The GPU is named by its UUID, as the placement check recorded it, never by an index: CUDA's
device order (fastest first unless CUDA_DEVICE_ORDER=PCI_BUS_ID) and NVML's (PCI bus) can
differ, and then an index names another rank's card.
Sampling never stops training: without NVML, or when it fails, utilisation is unknown and the
record says why.
"""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable


# The longest period NVML's utilisation reading can cover: a reading counts only when the
# window had been open at least this long, so no part of it predates training.
NVML_PERIOD_S = 1.0
NO_STEADY_READING = ("no NVML reading fell inside a steady epoch's training (each needs "
                     f"{NVML_PERIOD_S:g} s of training without validation or a checkpoint)")
NO_STEADY_WINDOW_READING = ("no NVML reading fell inside the steady windows' training (each needs "
                            f"{NVML_PERIOD_S:g} s of training without validation or a checkpoint)")


# NVML's reference for nvmlDeviceGetUtilizationRates (docs.nvidia.com/deploy/nvml-api/
# group__nvmlDeviceQueries.html; cuda-python's cuda.bindings.nvml.device_get_utilization_rates
# repeats it): "On MIG-enabled GPUs, querying device utilization rates is not currently supported".
MIG_NO_UTILIZATION = "n/a because MIG instances do not report utilisation (NVML supports no reading for them)"


def nvml_uuid(torch_uuid: str, mig: bool = False) -> str:
    """NVML's name for a GPU from torch's: torch prints the bare 8-4-4-4-12 hex of the UUID
    (for a MIG instance, CUDA gives the instance's own: cuDeviceGetUuid_v2), which
    nvmlDeviceGetHandleByUUID wants prefixed 'GPU-', or 'MIG-' for a MIG instance (drivers
    R470 on); a prefix already there is kept."""
    text = str(torch_uuid).strip()
    if text.startswith(("GPU-", "MIG-")):
        return text
    return f"{'MIG' if mig else 'GPU'}-{text}"


def _handle(pynvml, uuid: str):
    """NVML's handle and name for torch's UUID: a whole GPU's, else a MIG instance's (a bare
    UUID does not say which; the two kinds never share one)."""
    first = nvml_uuid(uuid)
    for name in (first,) if first == str(uuid).strip() else (first, nvml_uuid(uuid, mig=True)):
        try:
            return pynvml.nvmlDeviceGetHandleByUUID(name), name
        except pynvml.NVMLError as err:
            failure = err
    raise failure


def _is_mig(pynvml, handle, name: str) -> bool:
    """A MIG instance, or a whole GPU in MIG mode (whose utilisation NVML does not read either)."""
    if name.startswith("MIG-"):
        return True
    try:
        return pynvml.nvmlDeviceGetMigMode(handle)[0] == pynvml.NVML_DEVICE_MIG_ENABLE
    except Exception:  # not MIG-capable (pre-Ampere), or a library without the call
        return False


def open_utilization(uuid: str | None) -> tuple[Callable[[], int] | None, str | None]:
    """A function that reads this GPU's utilisation percent, or None and the reason why not."""
    if not uuid:
        return None, "the placement check recorded no GPU UUID for this rank"
    try:
        import pynvml
    except ImportError:
        return None, "nvidia-ml-py (pynvml) is not installed"
    name = nvml_uuid(uuid)
    try:
        pynvml.nvmlInit()
        handle, name = _handle(pynvml, uuid)
    except Exception as err:  # NVMLError, or a library that loads but misbehaves
        return None, f"NVML could not read GPU {name}: {err}"
    try:
        # read once here: a GPU that cannot report it says so before training
        pynvml.nvmlDeviceGetUtilizationRates(handle)
    except Exception as err:
        if _is_mig(pynvml, handle, name):
            return None, f"{MIG_NO_UTILIZATION}: {name}, {err}"
        return None, f"NVML could not read GPU {name}: {err}"
    return (lambda: int(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)), None


class UtilizationSampler:
    """Reads utilisation every period_s on a daemon thread, and keeps a reading only when the
    window was open for the whole period before it (open/close follow training's phases)."""

    def __init__(self, read: Callable[[], int] | None, reason: str | None = None,
                 period_s: float = NVML_PERIOD_S, clock: Callable[[], float] = time.monotonic):
        self.read = read
        self.reason = reason  # why there are no readings, when there are none
        self.period_s = period_s
        self.clock = clock
        self.readings: list[tuple[float, int]] = []  # (when read, percent) of the counted readings
        self._open_since: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def open(self) -> None:
        if self._open_since is None:
            self._open_since = self.clock()

    def close(self) -> None:
        self._open_since = None

    def tick(self) -> bool:
        """Take one reading; False once reading has failed (it will not start working)."""
        since = self._open_since
        try:
            value = self.read()
        except Exception as err:
            self.reason = f"NVML stopped answering: {err}"
            return False
        # the reading covers the period before now: it counts if the window opened before that
        # period began and did not close (or close and reopen) while it was read
        now = self.clock()
        if since is not None and self._open_since == since and now - since >= self.period_s:
            self.readings.append((now, value))
        return True

    @property
    def samples(self) -> list[int]:
        return [value for _, value in self.readings]

    def start(self) -> "UtilizationSampler":
        if self.read is not None:
            self._thread = threading.Thread(target=self._run, name="gpu-utilization", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.period_s) and self.tick():
            pass

    def stop(self, since: float | None = None) -> list[int]:
        """End sampling; the readings whose whole period came after `since` (this clock), or all."""
        self.close()
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.period_s + 10.0)
        return [value for at, value in self.readings if since is None or at - self.period_s >= since]


def peak_memory_mb(device) -> float | None:
    """Peak memory allocated by tensors on a CUDA device, in MiB; None on a CPU."""
    import torch

    device = torch.device(device)
    if device.type != "cuda":
        return None
    return torch.cuda.max_memory_allocated(device) / 2**20


def summarize(ranks: list[dict]) -> dict:
    """The metrics-record entries from each rank's {"peak_memory_mb", "utilization" (samples),
    "reason" (why it has none)}."""
    peaks = [r["peak_memory_mb"] for r in ranks if r.get("peak_memory_mb") is not None]
    means = [sum(r["utilization"]) / len(r["utilization"]) for r in ranks if r.get("utilization")]
    reasons = [r["reason"] for r in ranks if not r.get("utilization") and r.get("reason")]
    return {
        "gpu_peak_memory_mb": max(peaks) if peaks else None,
        "gpu_utilization_pct": sum(means) / len(means) if means else None,
        "gpu_utilization_samples": sum(len(r.get("utilization") or []) for r in ranks),
        # None when measured; else the first rank's reason (they usually share it)
        "gpu_utilization_reason": None if means else (reasons[0] if reasons else NO_STEADY_READING),
    }


def section(root_device, readings: dict, hosts: list[str], world_size: int, one_launcher: bool) -> dict:
    """The record's device section (ddpscale.core.record.SECTIONS): what the devices were (each CPU
    process stands in for one GPU, and the report must never call that a GPU result), the cores
    this rank may use (the local launcher's ranks all share the same set), whether CPU ranks
    outnumber the cores they share (they measure contention, not scaling), and the GPU readings
    (readings: the GpuFacts callback's, CPU_RECORD on a CPU run)."""
    import torch

    from ddpscale.run.hostdevices import host_oversubscribed, usable_cores

    if root_device.type == "cuda":
        devices = {"device_kind": "cuda", "device_name": torch.cuda.get_device_name(root_device), "simulated": False}
    else:
        devices = {"device_kind": root_device.type, "device_name": f"{root_device.type}, simulated", "simulated": True}
    cores = usable_cores()
    return {**devices, "usable_cores": cores,
            "oversubscribed": host_oversubscribed(devices["simulated"], hosts, world_size, cores,
                                                  one_launcher=one_launcher), **readings}


CPU_RECORD = {"gpu_peak_memory_mb": None, "gpu_utilization_pct": None, "gpu_utilization_samples": 0,
              "gpu_utilization_reason": None}


PROC_VERSION = Path("/proc/driver/nvidia/version")
NO_DRIVER = "no NVIDIA driver found"


class CudaUnavailable(RuntimeError):
    """The run asked for the GPU and torch sees none; the message says why and what to do."""


def _cuda_of(code: int) -> str:
    """CUDA's version code (11040, as the driver reports it) as '11.4'."""
    return f"{code // 1000}.{code % 1000 // 10}"


def driver_text(init_error: str | None, smi_output: str | None, proc_version: str | None) -> str:
    """What this node's NVIDIA driver is, from the best source there is.

    init_error: torch's CUDA initialisation error ("The NVIDIA driver on your system is too
    old (found version 11040)..."; 11040 is the newest CUDA the driver supports). smi_output:
    `nvidia-smi --query-gpu=driver_version --format=csv,noheader` ("470.223.02"). proc_version:
    /proc/driver/nvidia/version ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  470.223.02 ...").
    """
    version = None
    for line in (smi_output or "").splitlines():
        if re.fullmatch(r"\d+(\.\d+)+", line.strip()):
            version = line.strip()
            break
    if version is None and proc_version:
        found = re.search(r"Kernel Module\s+(\d+(?:\.\d+)+)", proc_version)
        version = found[1] if found else None
    supported = re.search(r"found version (\d+)", init_error or "")
    if version and supported:
        return f"driver {version}, which supports CUDA up to {_cuda_of(int(supported[1]))}"
    if version:
        return f"driver {version}"
    if supported:
        return f"a driver that supports CUDA up to {_cuda_of(int(supported[1]))}"
    if init_error and "no NVIDIA driver" in init_error:
        return NO_DRIVER
    return f"{NO_DRIVER} ({init_error})" if init_error else NO_DRIVER


def stop_line(accelerator: str, device_count: int, torch_version: str, torch_cuda: str | None,
              driver: str, host: str, visible_devices: str | None = None) -> str | None:
    """The one line that stops a GPU run torch cannot give a GPU, or None to go on.

    Only `gpu` is checked: `cpu` trains on the CPU by choice (the local profile's simulation),
    and the workflow never passes `auto` to a cluster run.
    """
    if accelerator != "gpu" or device_count > 0:
        return None
    build = "a CPU-only build of torch" if torch_cuda is None else f"torch built for CUDA {torch_cuda}"
    head = f"accelerator gpu, but torch {torch_version} sees no CUDA device on {host}: {build}, {driver}"
    if visible_devices is not None and not visible_devices.strip():
        fix = ("CUDA_VISIBLE_DEVICES is empty, so this rank was given no GPU: ask for GPUs "
               "(site_gpus_per_node, site_gpu_type in the profile) and do not clear the variable")
    elif torch_cuda is None:
        fix = ("install a CUDA build of torch into the environment the jobs run (pytorch.org lists "
               "one per CUDA version, e.g. pip install torch --index-url https://download.pytorch.org/whl/cu126), "
               "one the node's driver supports")
    elif driver.startswith(NO_DRIVER):
        fix = ("this node has no usable NVIDIA driver: check that the partition has GPUs "
               "(slurm_partition, site_gpu_type in the profile) and that the job asked for them")
    else:
        fix = ("install a torch built for a CUDA the driver supports (pytorch.org lists one per CUDA "
               "version), or load the site's newer CUDA/driver module before the run (module load ...)")
    return f"{head}. Fix: {fix}"


def _run(cmd: list[str]) -> str | None:
    if shutil.which(cmd[0]) is None:
        return None
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def node_facts(torch) -> dict:
    """What stop_line needs, read on this node (torch's CUDA initialised only when it failed)."""
    import os

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    init_error = None
    if count == 0 and torch.version.cuda is not None:
        try:
            torch.cuda.init()  # raises the reason is_available() only warned about
        except Exception as err:  # noqa: BLE001 - whatever torch raises is the reason we report
            init_error = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    proc = PROC_VERSION.read_text(errors="replace") if count == 0 and PROC_VERSION.exists() else None
    smi = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]) if count == 0 else None
    return {"device_count": count, "torch_version": torch.__version__, "torch_cuda": torch.version.cuda,
            "driver": driver_text(init_error, smi, proc), "host": socket.gethostname(),
            "visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}


def require_gpu(accelerator: str) -> None:
    """Raise CudaUnavailable when a GPU run's torch sees no GPU; nothing to do for cpu/auto."""
    if accelerator != "gpu":
        return
    import torch

    line = stop_line(accelerator, **node_facts(torch))
    if line:
        raise CudaUnavailable(line)


def sync_device(device) -> None:
    """Wait for the device's queued work. CUDA kernels run asynchronously, so a clock read
    without this stops before the GPU has finished; on CPU the work is already done. torch is
    imported here, not at the top, so modules of pure arithmetic that use this stay importable
    without it."""
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)
