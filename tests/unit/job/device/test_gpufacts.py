"""GPU facts of a training run: peak memory and NVML utilisation in steady training
(ddpscale.job.device.gpu, ddpscale.job.callbacks.GpuFacts)."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from ddpscale.job.device import gpu


TORCH_UUID = "6f6e2c4a-1b2c-3d4e-5f60-718293a4b5c6"  # as str(get_device_properties().uuid) prints it


def test_gpu_summary_over_ranks():
    ranks = [{"peak_memory_mb": 100.0, "utilization": [50, 70]},
             {"peak_memory_mb": 250.5, "utilization": [90]}]
    # each rank's mean (60, 90), then the mean over ranks; samples counted over ranks
    assert gpu.summarize(ranks) == {"gpu_peak_memory_mb": 250.5, "gpu_utilization_pct": 75.0,
                                         "gpu_utilization_samples": 3, "gpu_utilization_reason": None}
    no_samples = [{"peak_memory_mb": 10.0, "utilization": [], "reason": "NVML could not read GPU x"}]
    assert gpu.summarize(no_samples) == {"gpu_peak_memory_mb": 10.0, "gpu_utilization_pct": None,
                                              "gpu_utilization_samples": 0,
                                              "gpu_utilization_reason": "NVML could not read GPU x"}
    too_short = gpu.summarize([{"peak_memory_mb": 10.0, "utilization": [], "reason": None}])
    assert too_short["gpu_utilization_reason"] == gpu.NO_STEADY_READING
    assert gpu.peak_memory_mb("cpu") is None


# -- NVML, faked: this machine has no GPU --------------------------------------------------

class FakeNvml(types.ModuleType):
    """pynvml as far as ddpscale uses it; a GPU looked up by index fails the test."""

    class NVMLError(Exception):
        pass

    def __init__(self, known_uuids=("GPU-" + TORCH_UUID,)):
        super().__init__("pynvml")
        self.known = set(known_uuids)
        self.looked_up: list[str] = []
        self.value = 0  # what the next utilisation reading returns

    def nvmlInit(self):
        pass

    def nvmlDeviceGetHandleByUUID(self, uuid):
        self.looked_up.append(uuid)
        if uuid not in self.known:
            raise self.NVMLError("Not Found")
        return ("handle", uuid)

    def nvmlDeviceGetHandleByIndex(self, index):
        raise AssertionError("a GPU looked up by index: CUDA's and NVML's orders can differ")

    def nvmlDeviceGetUtilizationRates(self, handle):
        return types.SimpleNamespace(gpu=self.value, memory=0)


@pytest.fixture
def nvml(monkeypatch):
    fake = FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    return fake


def test_nvml_names_the_gpu_by_its_uuid(nvml):
    read, reason = gpu.open_utilization(TORCH_UUID)
    assert reason is None and nvml.looked_up == ["GPU-" + TORCH_UUID]
    nvml.value = 87
    assert read() == 87
    assert gpu.nvml_uuid("GPU-" + TORCH_UUID) == "GPU-" + TORCH_UUID
    assert gpu.nvml_uuid("MIG-abc") == "MIG-abc"


def test_without_nvml_utilisation_is_unknown_with_the_reason(nvml, monkeypatch):
    read, reason = gpu.open_utilization("0000-unknown")
    assert read is None and "NVML could not read GPU GPU-0000-unknown" in reason and "Not Found" in reason
    assert gpu.open_utilization(None)[1] == "the placement check recorded no GPU UUID for this rank"
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    read, reason = gpu.open_utilization(TORCH_UUID)
    assert read is None and "nvidia-ml-py" in reason
    sampler = gpu.UtilizationSampler(read, reason).start()
    assert sampler.stop() == [] and sampler.reason == reason


class FakeMigNvml(FakeNvml):
    """NVML on a MIG-enabled GPU: no utilisation for a MIG instance, nor for the GPU in MIG mode."""
    NVML_DEVICE_MIG_ENABLE = 1

    def __init__(self, known_uuids, mig_mode=0):
        super().__init__(known_uuids)
        self.mig_mode = mig_mode

    def nvmlDeviceGetMigMode(self, handle):
        return [self.mig_mode, self.mig_mode]

    def nvmlDeviceGetUtilizationRates(self, handle):
        if handle[1].startswith("MIG-") or self.mig_mode:
            raise self.NVMLError("Not Supported")
        return super().nvmlDeviceGetUtilizationRates(handle)


def test_a_mig_instance_is_named_mig_and_its_missing_utilisation_said_plainly(monkeypatch):
    # torch prints a MIG instance's UUID bare too; NVML knows it only as MIG-<uuid>
    assert gpu.nvml_uuid(TORCH_UUID, mig=True) == "MIG-" + TORCH_UUID
    assert gpu.nvml_uuid("MIG-" + TORCH_UUID) == "MIG-" + TORCH_UUID
    nvml = FakeMigNvml(known_uuids=("MIG-" + TORCH_UUID,))
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    read, reason = gpu.open_utilization(TORCH_UUID)
    assert nvml.looked_up == ["GPU-" + TORCH_UUID, "MIG-" + TORCH_UUID]
    assert read is None and reason.startswith("n/a because MIG instances do not report utilisation")
    assert "could not read" not in reason and "MIG-" + TORCH_UUID in reason


def test_a_gpu_in_mig_mode_says_mig_and_another_failure_says_what_failed(monkeypatch):
    nvml = FakeMigNvml(known_uuids=("GPU-" + TORCH_UUID,), mig_mode=1)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    read, reason = gpu.open_utilization(TORCH_UUID)
    assert read is None and reason.startswith(gpu.MIG_NO_UTILIZATION)
    nvml.mig_mode = 0

    def lost(handle):
        raise nvml.NVMLError("GPU is lost")
    monkeypatch.setattr(nvml, "nvmlDeviceGetUtilizationRates", lost)
    read, reason = gpu.open_utilization(TORCH_UUID)
    assert read is None and reason == f"NVML could not read GPU GPU-{TORCH_UUID}: GPU is lost"


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_a_reading_counts_only_when_its_whole_period_was_training():
    clock, values = Clock(), iter([11, 22, 33, 44, 55])
    sampler = gpu.UtilizationSampler(lambda: next(values), period_s=1.0, clock=clock)
    sampler.tick()  # window closed
    sampler.open()
    clock.now += 0.5
    sampler.tick()  # its period began before the window opened
    clock.now += 1.0
    sampler.tick()  # 33: a whole period of training
    sampler.close()
    clock.now += 1.0
    sampler.tick()  # closed (validation, a checkpoint)
    sampler.open()
    sampler.open()  # reopening an open window keeps its start
    clock.now += 1.0
    sampler.tick()
    assert sampler.samples == [33, 55]


def test_a_failing_reading_stops_sampling_with_the_reason():
    def broken():
        raise RuntimeError("GPU is lost")
    sampler = gpu.UtilizationSampler(broken)
    assert sampler.tick() is False and "GPU is lost" in sampler.reason


# -- the callback's window over a run, hooks driven as Lightning calls them -----------------

class ManualSampler(gpu.UtilizationSampler):
    """The real sampler on a clock the test moves, with no thread: the test takes each reading."""
    last = None

    def __init__(self, read, reason=None):
        super().__init__(read, reason, clock=CLOCK)
        ManualSampler.last = self

    def start(self):
        return self


CLOCK = Clock()


def test_gpu_facts_sample_steady_training_only(nvml, monkeypatch):
    from ddpscale.job.callbacks import GpuFacts

    monkeypatch.setattr(gpu, "UtilizationSampler", ManualSampler)
    placement = types.SimpleNamespace(own={"gpu_uuid": TORCH_UUID, "cuda_visible_devices": "3,1"})
    trainer = types.SimpleNamespace(strategy=types.SimpleNamespace(root_device=torch.device("cuda", 1)),
                                    current_epoch=0)
    facts = GpuFacts(placement, warmup_epochs=1)
    facts.on_fit_start(trainer, None)
    sampler = ManualSampler.last
    assert nvml.looked_up[-1] == "GPU-" + TORCH_UUID  # by UUID, not CUDA index 1 or "1" of CUDA_VISIBLE_DEVICES

    def phase(value, seconds=1.5):
        nvml.value = value
        CLOCK.now += seconds
        sampler.tick()

    for epoch in (0, 1, 2):
        trainer.current_epoch = epoch
        for batch in range(3):
            facts.on_train_batch_start(trainer, None, None, batch)
            phase(5 if epoch == 0 else 90)  # epoch 0 is the warm-up: compilation, a cold cache
        facts.on_validation_start(trainer, None)
        phase(2)  # validation
        facts.on_save_checkpoint(trainer, None, {})
        phase(0, 10.0)  # a slow checkpoint write at validation end
        facts.on_train_epoch_end(trainer, None)
        phase(1)  # between epochs
    monkeypatch.setattr(gpu, "peak_memory_mb", lambda device: 123.0)
    facts.on_fit_end(trainer, None)
    assert facts.record == {"gpu_peak_memory_mb": 123.0, "gpu_utilization_pct": 90.0,
                            "gpu_utilization_samples": 6, "gpu_utilization_reason": None}


def test_the_placement_check_keeps_this_ranks_record_for_gpu_facts():
    from ddpscale.job.launch.ranks import PlacementCheck

    check = PlacementCheck("cpu", 1)
    trainer = types.SimpleNamespace(global_rank=0, node_rank=0, local_rank=0,
                                    strategy=types.SimpleNamespace(root_device=torch.device("cpu")))
    check.setup(trainer, None, "fit")
    assert check.own == check.records[0] and "gpu_uuid" in check.own


def test_the_devices_table_gives_the_reason_utilisation_is_unknown():
    from ddpscale.report.render.html_tables import _utilisation

    assert _utilisation(41.6, None) == "42%"
    assert _utilisation(None, "nvidia-ml-py <pynvml> is not installed") == (
        '<span title="nvidia-ml-py &lt;pynvml&gt; is not installed">n/a</span>')
    assert _utilisation(float("nan"), float("nan")) == "n/a"  # a CPU run, or one from before the reason


def test_in_throughput_mode_the_steady_windows_are_sampled(nvml, monkeypatch):
    """A throughput run stops inside its first epoch, which full mode's rule leaves out as
    warm-up: the first H100 run's transformer had utilisation n/a in both its runs."""
    from ddpscale.job.callbacks import GpuFacts

    monkeypatch.setattr(gpu, "UtilizationSampler", ManualSampler)
    placement = types.SimpleNamespace(own={"gpu_uuid": TORCH_UUID})
    trainer = types.SimpleNamespace(strategy=types.SimpleNamespace(root_device=torch.device("cuda", 0)),
                                    current_epoch=0)
    windows = types.SimpleNamespace(steady_since=lambda: None)
    facts = GpuFacts(placement, warmup_epochs=1, windows=windows)
    facts.on_fit_start(trainer, None)
    sampler = ManualSampler.last
    # two warm-up windows, then steady ones; the reading 0.5 s into the first steady window
    # covers a second, half of it warm-up, so it is left out
    for batch, (value, seconds) in enumerate([(5, 1.5), (5, 1.5), (40, 0.5), (90, 1.5), (90, 1.5)]):
        if batch == 2:
            windows.steady_since = lambda start=CLOCK.now: start
        facts.on_train_batch_start(trainer, None, None, batch)
        nvml.value = value
        CLOCK.now += seconds
        sampler.tick()
    facts.on_validation_start(trainer, None)
    monkeypatch.setattr(gpu, "peak_memory_mb", lambda device: 1.0)
    facts.on_fit_end(trainer, None)
    assert facts.record["gpu_utilization_pct"] == 90.0 and facts.record["gpu_utilization_samples"] == 2


def test_in_throughput_mode_without_a_steady_window_utilisation_says_why(nvml, monkeypatch):
    from ddpscale.job.callbacks import GpuFacts

    monkeypatch.setattr(gpu, "UtilizationSampler", ManualSampler)
    trainer = types.SimpleNamespace(strategy=types.SimpleNamespace(root_device=torch.device("cuda", 0)),
                                    current_epoch=0)
    facts = GpuFacts(types.SimpleNamespace(own={"gpu_uuid": TORCH_UUID}), warmup_epochs=1,
                     windows=types.SimpleNamespace(steady_since=lambda: None))
    facts.on_fit_start(trainer, None)
    facts.on_train_batch_start(trainer, None, None, 0)
    CLOCK.now += 1.5
    ManualSampler.last.tick()
    monkeypatch.setattr(gpu, "peak_memory_mb", lambda device: 1.0)
    facts.on_fit_end(trainer, None)
    assert facts.record["gpu_utilization_pct"] is None
    assert facts.record["gpu_utilization_reason"] == gpu.NO_STEADY_WINDOW_READING
