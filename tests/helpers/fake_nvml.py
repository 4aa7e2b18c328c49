"""A fake NVML driver behind the real `pynvml` module, for tests and call-count benchmarks.

`FakeNvml.install(monkeypatch)` replaces the pynvml functions gpuwatch uses
with ones that answer from `FakeGpu`s, raise pynvml's real `NVMLError_*`
classes, and count every call. Process lists follow NVML's size protocol on
real ctypes buffers, so the backend's buffer handling is exercised as it is on
a driver.
"""

from __future__ import annotations

import ctypes
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

MIB = 1 << 20
PROCESS_VERSIONS = ("v3", "v2", "v1")
NO_INSTANCE = 0xFFFF_FFFF


@dataclass
class FakeMig:
    """A MIG device of a MIG-enabled `FakeGpu`; its processes are listed on the GPU."""

    uuid: str
    profile: str = "1g.10gb"
    gpu_instance_id: int = 7
    compute_instance_id: int = 0
    total: int = 9984 * MIB
    used: int = 0
    gpu: FakeGpu | None = None
    gone: bool = False


@dataclass
class FakeGpu:
    name: str = "NVIDIA H100 80GB HBM3"
    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    pci_bus_id: str = "00000000:18:00.0"
    total: int = 81559 * MIB
    used: int = 1024 * MIB
    reserved: int = 579 * MIB
    free: int | None = None
    """What the driver says is free, when not total - used - reserved (a faulty driver)."""
    utilization: int = 50
    memory_utilization: int = 30
    temperature: int = 60
    power_mw: int = 300_000
    power_limit_mw: int = 700_000
    fan: int = 40
    sm_clock: int = 1980
    pstate: int = 0
    compute: list[tuple[int, int]] = field(default_factory=list)
    graphics: list[tuple[int, int]] = field(default_factory=list)
    mps: list[tuple[int, int]] = field(default_factory=list)
    unsupported: set[str] = field(default_factory=set)
    failing: set[str] = field(default_factory=set)
    lost: bool = False
    mig_mode: int | None = None
    """1 = MIG enabled (utilization then reads NOT_SUPPORTED), 0 = disabled, None = no MIG."""
    migs: list[FakeMig] = field(default_factory=list)
    minor_number: int | None = None
    """N of /dev/nvidiaN; `None`: the driver does not report it (NOT_SUPPORTED)."""
    instances: dict[int, tuple[int, int]] = field(default_factory=dict)
    """pid -> (GPU instance id, compute instance id), for processes in MIG devices."""


@dataclass
class FakeNvml:
    gpus: list[FakeGpu]
    driver_version: str = "580.95.05"
    cuda_version: int = 13000
    memory_v2: bool = True
    process_versions: tuple[str, ...] = PROCESS_VERSIONS
    init_error: type[pynvml.NVMLError] | None = None
    calls: Counter[str] = field(default_factory=Counter)

    def install(self, monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
        for name, function in self._functions().items():
            monkeypatch.setattr(pynvml, name, self._counted(name, function))
        monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer", self._function_pointer)
        # The library "loads": whether the driver answers is up to `init_error`.
        monkeypatch.setattr("gpuwatch.backends.driver.nvml_library_loads", lambda: True)
        return self

    @property
    def total_calls(self) -> int:
        return sum(self.calls.values())

    def _counted(self, name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            return function(*args, **kwargs)

        return counted

    def _functions(self) -> dict[str, Callable[..., Any]]:
        return {
            "nvmlInit": self._init,
            "nvmlShutdown": lambda: None,
            "nvmlDeviceGetCount": lambda: len(self.gpus),
            "nvmlDeviceGetHandleByIndex": self._handle,
            "nvmlSystemGetDriverVersion": lambda: self.driver_version,
            "nvmlSystemGetCudaDriverVersion": lambda: self.cuda_version,
            "nvmlDeviceGetUUID": _getter("uuid", lambda g: g.uuid),
            "nvmlDeviceGetName": _getter(
                "name", lambda g: g.name if isinstance(g, FakeGpu) else _mig_name(g)
            ),
            "nvmlDeviceGetPciInfo_v3": _getter(
                "pci", lambda g: SimpleNamespace(busId=g.pci_bus_id.encode())
            ),
            "nvmlDeviceGetMemoryInfo": self._memory,
            "nvmlDeviceGetUtilizationRates": _getter("utilization", _utilization),
            "nvmlDeviceGetMigMode": _getter("mig", _mig_mode),
            "nvmlDeviceGetMaxMigDeviceCount": _getter("mig", lambda g: 7 if g.mig_mode else 0),
            "nvmlDeviceGetMigDeviceHandleByIndex": _getter("mig", _mig_handle),
            "nvmlDeviceGetGpuInstanceId": _getter("mig", lambda m: m.gpu_instance_id),
            "nvmlDeviceGetComputeInstanceId": _getter("mig", lambda m: m.compute_instance_id),
            "nvmlDeviceGetTemperature": _getter("temperature", lambda g, _sensor: g.temperature),
            "nvmlDeviceGetPowerUsage": _getter("power", lambda g: g.power_mw),
            "nvmlDeviceGetEnforcedPowerLimit": _getter("power_limit", lambda g: g.power_limit_mw),
            "nvmlDeviceGetFanSpeed": _getter("fan", lambda g: g.fan),
            "nvmlDeviceGetClockInfo": _getter("clock", lambda g, _type: g.sm_clock),
            "nvmlDeviceGetPerformanceState": _getter("pstate", lambda g: g.pstate),
            "nvmlDeviceGetMinorNumber": _getter("minor number", _minor_number),
        }

    def _init(self) -> None:
        if self.init_error is not None:
            raise self.init_error()

    def _handle(self, index: int) -> FakeGpu:
        gpu = self.gpus[index]
        if gpu.lost:
            raise pynvml.NVMLError_GpuIsLost()
        return gpu

    def _memory(self, gpu: FakeGpu | FakeMig, version: int | None = None) -> SimpleNamespace:
        _check(gpu, "memory")
        if isinstance(gpu, FakeMig):
            free = gpu.total - gpu.used
            return SimpleNamespace(total=gpu.total, used=gpu.used, free=free, reserved=0)
        free = gpu.total - gpu.used - gpu.reserved if gpu.free is None else gpu.free
        if version is None:  # v1 counts the reservation as used
            return SimpleNamespace(total=gpu.total, used=gpu.used + gpu.reserved, free=free)
        if not self.memory_v2:
            raise pynvml.NVMLError_FunctionNotFound()
        return SimpleNamespace(total=gpu.total, used=gpu.used, free=free, reserved=gpu.reserved)

    def _function_pointer(self, symbol: str) -> Callable[..., int]:
        if symbol == "nvmlDeviceGetProcessUtilization":  # tested over ../shared/fakenvml
            self.calls[symbol] += 1
            raise pynvml.NVMLError_NotSupported()
        kind = "mps" if "MPS" in symbol else "compute" if "Compute" in symbol else "graphics"
        version = symbol.rsplit("_", 1)[1] if symbol.endswith(("_v2", "_v3")) else "v1"
        if version not in self.process_versions:
            raise pynvml.NVMLError_FunctionNotFound()
        entry_size = 16 if version == "v1" else 24

        def running_processes(gpu: FakeGpu, count_ref: Any, buffer: Any) -> int:
            self.calls[symbol] += 1
            if gpu.lost:
                return pynvml.NVML_ERROR_GPU_IS_LOST
            if {"processes", f"{kind} processes"} & gpu.unsupported:
                return pynvml.NVML_ERROR_NOT_SUPPORTED
            listed = getattr(gpu, kind)
            count = count_ref._obj
            if buffer is None or count.value < len(listed):
                count.value = len(listed)
                return pynvml.NVML_ERROR_INSUFFICIENT_SIZE if listed else pynvml.NVML_SUCCESS
            assert ctypes.sizeof(buffer._type_) == entry_size, f"{symbol}: wrong struct layout"
            for slot, (pid, used) in zip(buffer, listed, strict=False):
                slot.pid, slot.usedGpuMemory = pid, used
                if version != "v1":
                    instance = gpu.instances.get(pid, (NO_INSTANCE, NO_INSTANCE))
                    slot.gpuInstanceId, slot.computeInstanceId = instance
            count.value = len(listed)
            return pynvml.NVML_SUCCESS

        return running_processes


def _check(gpu: FakeGpu | FakeMig, name: str) -> None:
    if isinstance(gpu, FakeMig):
        if gpu.gone:
            raise pynvml.NVMLError_InvalidArgument()
        assert gpu.gpu is not None
        gpu = gpu.gpu
    if gpu.lost:
        raise pynvml.NVMLError_GpuIsLost()
    if name in gpu.unsupported:
        raise pynvml.NVMLError_NotSupported()
    if name in gpu.failing:
        raise pynvml.NVMLError_Unknown()


def _utilization(gpu: FakeGpu) -> SimpleNamespace:
    if gpu.mig_mode:
        raise pynvml.NVMLError_NotSupported()  # as drivers do on a MIG-enabled GPU
    return SimpleNamespace(gpu=gpu.utilization, memory=gpu.memory_utilization)


def _mig_mode(gpu: FakeGpu) -> list[int]:
    if gpu.mig_mode is None:
        raise pynvml.NVMLError_NotSupported()
    return [gpu.mig_mode, gpu.mig_mode]


def _mig_handle(gpu: FakeGpu, index: int) -> FakeMig:
    present = [mig for mig in gpu.migs if not mig.gone]
    if index >= 7:
        raise pynvml.NVMLError_InvalidArgument()
    if not gpu.mig_mode or index >= len(present):
        raise pynvml.NVMLError_NotFound()
    present[index].gpu = gpu
    return present[index]


def _mig_name(mig: FakeMig) -> str:
    assert mig.gpu is not None
    return f"{mig.gpu.name} MIG {mig.profile}"


def _minor_number(gpu: FakeGpu) -> int:
    if gpu.minor_number is None:
        raise pynvml.NVMLError_NotSupported()
    return gpu.minor_number


def _getter(name: str, read: Callable[..., Any]) -> Callable[..., Any]:
    def getter(gpu: FakeGpu, *args: Any) -> Any:
        _check(gpu, name)
        return read(gpu, *args)

    return getter


def eight_gpu_node() -> FakeNvml:
    """8 GPUs and 40 processes, as on the benchmark node: 5 per GPU, one C+G on GPU 5."""
    gpus = []
    for index in range(8):
        compute = [(1000 + 10 * index + n, (512 + n) * MIB) for n in range(5)]
        graphics = [compute[0]] if index == 5 else []
        gpus.append(
            FakeGpu(
                uuid=f"GPU-{index:08d}-0000-0000-0000-000000000000",
                pci_bus_id=f"00000000:{0x18 + index:02X}:00.0",
                compute=compute,
                graphics=graphics,
                unsupported={"fan"},
            )
        )
    return FakeNvml(gpus)


def mig_gpu(index: int, profiles: tuple[str, ...], **values: Any) -> FakeGpu:
    """An A100 in MIG mode with one MIG device per profile; `values` override FakeGpu fields."""
    gpu = FakeGpu(
        name="NVIDIA A100-SXM4-80GB",
        uuid=f"GPU-{index:08d}-0000-0000-0000-00000000a100",
        pci_bus_id=f"00000000:{0x07 + index:02X}:00.0",
        mig_mode=1,
        unsupported={"fan"},
        **values,
    )
    gib = {"1g.10gb": 9984, "2g.20gb": 19968, "3g.40gb": 39936, "7g.80gb": 81152}
    gpu.migs = [
        FakeMig(
            uuid=f"MIG-{index:08d}-0000-0000-0000-{number:012d}",
            profile=profile,
            gpu_instance_id=number + 1,
            total=gib[profile] * MIB,
            gpu=gpu,
        )
        for number, profile in enumerate(profiles)
    ]
    return gpu
