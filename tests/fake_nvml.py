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


@dataclass
class FakeGpu:
    name: str = "NVIDIA H100 80GB HBM3"
    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    pci_bus_id: str = "00000000:18:00.0"
    total: int = 81559 * MIB
    used: int = 1024 * MIB
    reserved: int = 579 * MIB
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
        monkeypatch.setattr("gpuwatch.backends._nvml_library_loads", lambda: True)
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
            "nvmlDeviceGetName": _getter("name", lambda g: g.name),
            "nvmlDeviceGetPciInfo_v3": _getter(
                "pci", lambda g: SimpleNamespace(busId=g.pci_bus_id.encode())
            ),
            "nvmlDeviceGetMemoryInfo": self._memory,
            "nvmlDeviceGetUtilizationRates": _getter(
                "utilization",
                lambda g: SimpleNamespace(gpu=g.utilization, memory=g.memory_utilization),
            ),
            "nvmlDeviceGetTemperature": _getter("temperature", lambda g, _sensor: g.temperature),
            "nvmlDeviceGetPowerUsage": _getter("power", lambda g: g.power_mw),
            "nvmlDeviceGetEnforcedPowerLimit": _getter("power_limit", lambda g: g.power_limit_mw),
            "nvmlDeviceGetFanSpeed": _getter("fan", lambda g: g.fan),
            "nvmlDeviceGetClockInfo": _getter("clock", lambda g, _type: g.sm_clock),
            "nvmlDeviceGetPerformanceState": _getter("pstate", lambda g: g.pstate),
        }

    def _init(self) -> None:
        if self.init_error is not None:
            raise self.init_error()

    def _handle(self, index: int) -> FakeGpu:
        gpu = self.gpus[index]
        if gpu.lost:
            raise pynvml.NVMLError_GpuIsLost()
        return gpu

    def _memory(self, gpu: FakeGpu, version: int | None = None) -> SimpleNamespace:
        _check(gpu, "memory")
        free = gpu.total - gpu.used - gpu.reserved
        if version is None:  # v1 counts the reservation as used
            return SimpleNamespace(total=gpu.total, used=gpu.used + gpu.reserved, free=free)
        if not self.memory_v2:
            raise pynvml.NVMLError_FunctionNotFound()
        return SimpleNamespace(total=gpu.total, used=gpu.used, free=free, reserved=gpu.reserved)

    def _function_pointer(self, symbol: str) -> Callable[..., int]:
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
            count.value = len(listed)
            return pynvml.NVML_SUCCESS

        return running_processes


def _check(gpu: FakeGpu, name: str) -> None:
    if gpu.lost:
        raise pynvml.NVMLError_GpuIsLost()
    if name in gpu.unsupported:
        raise pynvml.NVMLError_NotSupported()
    if name in gpu.failing:
        raise pynvml.NVMLError_Unknown()


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
