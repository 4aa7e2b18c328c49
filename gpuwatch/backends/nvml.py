"""The NVML backend: the driver's libnvidia-ml.so.1, through the official bindings.

This is the only module of gpuwatch that imports `pynvml` (the `nvidia-ml-py`
distribution), and it is imported only when an NVML backend is opened.

Driver calls are what watching a GPU costs, so a sample makes as few as it can:
- a GPU's identity (uuid, name, PCI bus id) is read once;
- a field the GPU reports as not supported is not asked for again;
- a process list is read in one call, into a buffer sized from the last count,
  where pynvml's wrappers make two (a size probe, then the fill).
A full sample of a GPU costs 10 calls, 11 with a fan: memory, utilization,
temperature, power, power limit, SM clock, P-state, fan, and the compute, graphics
and MPS client processes (one fewer where the driver does not support MPS). A
selection sample costs 2: memory and utilization.

MIG costs nothing on GPUs without it: a GPU whose utilization reads is not in
MIG mode (the driver reports no utilization for a MIG-enabled GPU), so the MIG
mode is asked only of GPUs whose utilization is not reported. A MIG-enabled GPU
then costs, per sample, its MIG mode, one handle lookup per MIG device plus the
one that finds no more, and each device's UUID (handles are reused when the GPU
is reconfigured) and memory; a device's name and instance ids are read once per
UUID. Processes are placed in their MIG device by the instance ids the driver
puts in the GPU's process list, at no extra call.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import msgspec
import pynvml

from gpuwatch.backends.base import Backend, SampleScope
from gpuwatch.backends.mig_changes import MigChanges
from gpuwatch.errors import BackendError, DriverNotFoundError, NoGpuError
from gpuwatch.hostinfo import HostProcess, HostProcessTable
from gpuwatch.models import GpuSample, MigDevice, ProcessKind, ProcessUsage, Snapshot

T = TypeVar("T")


# The GPU as a whole is gone: none of its other fields is worth asking for.
_GPU_GONE = (pynvml.NVMLError_GpuIsLost, pynvml.NVMLError_ResetRequired)
# "This GPU or driver does not report that": the field is None, and is not asked for again.
_NOT_REPORTED = (
    pynvml.NVMLError_NotSupported,
    pynvml.NVMLError_FunctionNotFound,
    pynvml.NVMLError_NoPermission,
)
# A versioned call this driver does not know: use the older version from now on.
_VERSION_UNKNOWN = (
    pynvml.NVMLError_FunctionNotFound,
    pynvml.NVMLError_ArgumentVersionMismatch,
    pynvml.NVMLError_NotSupported,
)
_VALUE_NOT_AVAILABLE = 0xFFFF_FFFF_FFFF_FFFF
_PSTATE_UNKNOWN = 32
_NO_INSTANCE = 0xFFFF_FFFF  # a process's instance ids on a GPU without MIG
_MAX_PROCESS_LIST_TRIES = 4

# Newest layout first. The unversioned (v1) symbols take a struct that current
# bindings no longer declare; `_ProcessInfoV1` stands in for it.
_PROCESS_SYMBOLS = {
    ProcessKind.COMPUTE: (
        "nvmlDeviceGetComputeRunningProcesses_v3",
        "nvmlDeviceGetComputeRunningProcesses_v2",
        "nvmlDeviceGetComputeRunningProcesses",
    ),
    ProcessKind.GRAPHICS: (
        "nvmlDeviceGetGraphicsRunningProcesses_v3",
        "nvmlDeviceGetGraphicsRunningProcesses_v2",
        "nvmlDeviceGetGraphicsRunningProcesses",
    ),
    ProcessKind.MPS: (
        "nvmlDeviceGetMPSComputeRunningProcesses_v3",
        "nvmlDeviceGetMPSComputeRunningProcesses_v2",
        "nvmlDeviceGetMPSComputeRunningProcesses",
    ),
}


# One process's use of one GPU, before the host is asked about it:
# (pid, GPU, bytes, kind, MIG device UUID, SM utilization %).
_Used = tuple[int, "_Gpu", "int | None", ProcessKind, "str | None", "int | None"]
# A process list entry: (pid, bytes, GPU instance id, compute instance id).
_Listed = tuple[int, "int | None", "int | None", "int | None"]


class _ProcessInfoV1(ctypes.Structure):
    _fields_ = (("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong))


class _Gpu(msgspec.Struct):
    """What is remembered about one GPU between samples."""

    index: int
    handle: Any = None
    uuid: str | None = None
    name: str | None = None
    pci_bus_id: str | None = None
    minor_number: int | None = None
    not_reported: set[str] = msgspec.field(default_factory=set)
    process_capacity: int = 64
    mig_slots: int | None = None
    """How many MIG devices the GPU can hold (asked once)."""
    mig_names: dict[str, tuple[str | None, int | None, int | None]] = msgspec.field(
        default_factory=dict
    )
    """Name, GPU and compute instance ids of each MIG device seen, by UUID."""
    sm_samples_seen_us: int = 0
    """The driver's time stamp of the newest per-process utilization sample read."""


class _Fields(msgspec.Struct):
    """Reads one GPU's fields: 'not reported' becomes None, other faults a note in `faults`."""

    gpu: _Gpu
    faults: list[str] = msgspec.field(default_factory=list)

    def read(self, name: str, getter: Callable[..., T], *args: Any) -> T | None:
        if name in self.gpu.not_reported:
            return None
        try:
            return getter(*args)
        except _GPU_GONE:
            raise
        except _NOT_REPORTED:
            self.gpu.not_reported.add(name)
        except pynvml.NVMLError as error:
            self.faults.append(f"{name}: {error}")
        return None


class NvmlBackend(Backend):
    """Reads the GPUs of this machine through NVML."""

    name = "nvml"

    def __init__(self) -> None:
        with _init_errors():
            pynvml.nvmlInit()
        try:
            count = pynvml.nvmlDeviceGetCount()
        except pynvml.NVMLError as error:
            self._shutdown()
            raise BackendError(f"NVML could not count the GPUs: {error}") from error
        if count == 0:
            self._shutdown()
            raise NoGpuError("the NVIDIA driver is loaded but reports no GPU")
        self._open = True
        self._gpus = [_Gpu(index) for index in range(count)]
        self._memory_v2 = True
        self._process_symbols = {kind: list(names) for kind, names in _PROCESS_SYMBOLS.items()}
        self._versions: tuple[str | None, str | None] | None = None
        self._hosts: HostProcessTable | None = None
        self._mig_changes = MigChanges()

    def sample(self, scope: SampleScope = SampleScope.FULL) -> Snapshot:
        taken_at = time.time()
        full = scope is SampleScope.FULL
        gpus: list[GpuSample] = []
        used_by: list[list[_Used]] = []
        mig_devices: list[MigDevice] = []
        for gpu in self._gpus:
            sample, processes, migs = self._sample_gpu(gpu, full, taken_at)
            gpus.append(sample)
            used_by.append(processes)
            mig_devices.extend(migs)
        driver_version, cuda_version = self._driver_versions() if full else (None, None)
        return Snapshot(
            taken_at=taken_at,
            hostname=os.uname().nodename,
            driver_version=driver_version,
            cuda_driver_version=cuda_version,
            gpus=tuple(gpus),
            processes=self._with_host_details(used_by) if full else _bare(used_by),
            mig_devices=tuple(mig_devices),
        )

    def close(self) -> None:
        if getattr(self, "_open", False):
            self._open = False
            if self._hosts is not None:
                self._hosts.close()
            self._shutdown()

    def _sample_gpu(
        self, gpu: _Gpu, full: bool, now: float
    ) -> tuple[GpuSample, list[_Used], list[MigDevice]]:
        fields = _Fields(gpu)
        try:
            handle = self._handle(gpu, full)
            memory = fields.read("memory", self._memory_info, handle) or (None,) * 4
            utilization = fields.read("utilization", pynvml.nvmlDeviceGetUtilizationRates, handle)
            mig_enabled = False if utilization is not None else _mig_mode(fields, handle)
            migs: list[MigDevice] = []
            if mig_enabled:
                migs, complete = self._mig_devices(fields, gpu, handle)
                # A partial list says nothing of the devices missing from it.
                mig_enabled = True if complete else None
            if mig_enabled is not None:
                fields.faults.extend(self._mig_changes.notes(gpu.index, migs, now))
                _forget_names(gpu, migs)
            metrics = self._full_metrics(fields, handle) if full else {}
            processes = self._processes(fields, gpu, handle, migs, full)
        except pynvml.NVMLError as error:
            gpu.handle = None  # asked for afresh next time, so a GPU that comes back is seen
            error_text = self._mig_changes.lost_with(gpu.index, str(error))
            return self._identity(gpu, error=error_text), [], []
        return (
            self._identity(
                gpu,
                memory_total_bytes=memory[0],
                memory_used_bytes=memory[1],
                memory_free_bytes=memory[2],
                memory_reserved_bytes=memory[3],
                utilization_pct=utilization.gpu if utilization else None,
                memory_utilization_pct=utilization.memory if utilization else None,
                error="; ".join(fields.faults) or None,
                mig_enabled=mig_enabled,
                **metrics,
            ),
            processes,
            migs,
        )

    @staticmethod
    def _identity(gpu: _Gpu, **values: Any) -> GpuSample:
        return GpuSample(
            index=gpu.index,
            uuid=gpu.uuid,
            name=gpu.name,
            pci_bus_id=gpu.pci_bus_id,
            minor_number=gpu.minor_number,
            **values,
        )

    @staticmethod
    def _handle(gpu: _Gpu, full: bool) -> Any:
        if gpu.handle is None:
            gpu.handle = pynvml.nvmlDeviceGetHandleByIndex(gpu.index)
        # Each part of the identity on its own: a GPU that cannot tell its UUID (lost, or
        # needing a reset) may still tell its PCI bus id, which names it in alerts.
        if gpu.uuid is None:
            gpu.uuid = _told(pynvml.nvmlDeviceGetUUID, gpu.handle)
        if full and gpu.pci_bus_id is None:
            pci = _told(pynvml.nvmlDeviceGetPciInfo_v3, gpu.handle)
            gpu.pci_bus_id = _text(pci.busId) if pci is not None else None
        # Its name and minor number in every scope (asked once): Slurm names a GPU by its
        # device file and its type by its name, and a choice must know which jobs hold it.
        if gpu.name is None:
            gpu.name = _told(pynvml.nvmlDeviceGetName, gpu.handle)
        if gpu.minor_number is None and "minor number" not in gpu.not_reported:
            gpu.minor_number = _minor_number(gpu)
        return gpu.handle

    def _mig_devices(self, fields: _Fields, gpu: _Gpu, handle: Any) -> tuple[list[MigDevice], bool]:
        """The GPU's MIG devices, and whether the list is complete."""
        if gpu.mig_slots is None:
            gpu.mig_slots = fields.read(
                "MIG device count", pynvml.nvmlDeviceGetMaxMigDeviceCount, handle
            )
        count = gpu.mig_slots
        devices: list[MigDevice] = []
        for index in range(count or 0):
            try:
                mig_handle = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, index)
            except pynvml.NVMLError_NotFound:
                break  # MIG device indices are dense: as nvidia-smi and nvitop, stop at a gap
            except _GPU_GONE:
                raise
            except pynvml.NVMLError as error:
                fields.faults.append(f"MIG device {gpu.index}:{index}: {error}")
                return devices, False
            if (device := self._mig_device(gpu, index, mig_handle)) is not None:
                devices.append(device)
        # A device whose UUID could not be read might be any of those seen before.
        return devices, count is not None and all(device.uuid for device in devices)

    def _mig_device(self, gpu: _Gpu, index: int, handle: Any) -> MigDevice | None:
        """One MIG device; `None` when it went away while being read."""
        uuid = None
        try:
            uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
            if uuid not in gpu.mig_names:
                gpu.mig_names[uuid] = (
                    _text(pynvml.nvmlDeviceGetName(handle)),
                    pynvml.nvmlDeviceGetGpuInstanceId(handle),
                    pynvml.nvmlDeviceGetComputeInstanceId(handle),
                )
            total, used, free, _ = self._memory_info(handle)
        except _GPU_GONE:
            raise
        except pynvml.NVMLError_InvalidArgument:
            return None  # destroyed between the lookup and now
        except pynvml.NVMLError as error:
            return MigDevice(gpu.index, index, uuid, error=str(error))
        name, gpu_instance, compute_instance = gpu.mig_names[uuid]
        return MigDevice(
            gpu_index=gpu.index,
            index=index,
            uuid=uuid,
            name=name,
            profile=_profile(name),
            gpu_instance_id=gpu_instance,
            compute_instance_id=compute_instance,
            memory_total_bytes=total,
            memory_used_bytes=used,
            memory_free_bytes=free,
        )

    def _memory_info(self, handle: Any) -> tuple[int, int | None, int | None, int | None]:
        if self._memory_v2:
            try:
                info = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
            except _VERSION_UNKNOWN:
                self._memory_v2 = False
            else:
                return _believable(info.total, info.used, info.free, info.reserved)
        # v1 counts the driver's reservation in `used`, and cannot report it apart.
        info = pynvml.nvmlDeviceGetMemoryInfo(handle)
        return _believable(info.total, info.used, info.free, None)

    @staticmethod
    def _full_metrics(fields: _Fields, handle: Any) -> dict[str, Any]:
        pstate = fields.read("pstate", pynvml.nvmlDeviceGetPerformanceState, handle)
        return {
            "temperature_c": fields.read(
                "temperature", pynvml.nvmlDeviceGetTemperature, handle, pynvml.NVML_TEMPERATURE_GPU
            ),
            "power_w": _watts(fields.read("power", pynvml.nvmlDeviceGetPowerUsage, handle)),
            "power_limit_w": _watts(
                fields.read("power limit", pynvml.nvmlDeviceGetEnforcedPowerLimit, handle)
            ),
            "fan_pct": fields.read("fan", pynvml.nvmlDeviceGetFanSpeed, handle),
            "sm_clock_mhz": fields.read(
                "SM clock", pynvml.nvmlDeviceGetClockInfo, handle, pynvml.NVML_CLOCK_SM
            ),
            "performance_state": None if pstate == _PSTATE_UNKNOWN else pstate,
        }

    def _processes(
        self, fields: _Fields, gpu: _Gpu, handle: Any, migs: list[MigDevice], full: bool
    ) -> list[_Used]:
        kinds: dict[int, ProcessKind] = {}
        memory: dict[int, int | None] = {}
        where: dict[int, str | None] = {}
        by_instance = {(m.gpu_instance_id, m.compute_instance_id): m.uuid for m in migs}
        for kind in _PROCESS_SYMBOLS:
            # A driver without MPS answers "not supported" once, and is not asked again.
            listed = fields.read(f"{kind} processes", self._process_list, gpu, kind, handle)
            for pid, used_bytes, gpu_instance, compute_instance in listed or ():
                kinds[pid] = _both(kinds[pid], kind) if pid in kinds else kind
                memory[pid] = used_bytes if memory.get(pid) is None else memory[pid]
                where[pid] = where.get(pid) or by_instance.get((gpu_instance, compute_instance))
        # Once per full sample (choosing GPUs does not weigh it), and only while there are
        # processes; a GPU that does not report it (MIG enabled, older drivers) is not asked again.
        wanted = full and kinds
        sm = fields.read("process utilization", _sm_util_by_pid, gpu, handle) if wanted else None
        return [
            (pid, gpu, memory[pid], kinds[pid], where[pid], None if sm is None else sm.get(pid, 0))
            for pid in kinds
        ]

    def _process_list(self, gpu: _Gpu, kind: ProcessKind, handle: Any) -> list[_Listed]:
        symbols = self._process_symbols[kind]
        while symbols:
            try:
                return _read_process_list(symbols[0], handle, gpu)
            except pynvml.NVMLError_FunctionNotFound:
                symbols.pop(0)
        raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)

    def _with_host_details(self, used_by: list[list[_Used]]) -> tuple[ProcessUsage, ...]:
        used = [entry for listed in used_by for entry in listed]
        if not used:
            return ()
        if self._hosts is None:
            self._hosts = HostProcessTable()
        details = self._hosts.lookup({pid for pid, *_ in used})
        return tuple(_process_usage(entry, details.get(entry[0])) for entry in used)

    def _driver_versions(self) -> tuple[str | None, str | None]:
        if self._versions is None:
            try:
                driver = _text(pynvml.nvmlSystemGetDriverVersion())
            except pynvml.NVMLError:
                driver = None
            try:
                cuda = pynvml.nvmlSystemGetCudaDriverVersion()
                cuda_version = f"{cuda // 1000}.{cuda % 1000 // 10}"
            except pynvml.NVMLError:
                cuda_version = None
            self._versions = (driver, cuda_version)
        return self._versions

    @staticmethod
    def _shutdown() -> None:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()


def _bare(used_by: list[list[_Used]]) -> tuple[ProcessUsage, ...]:
    """The processes as the driver lists them, without the host's details."""
    return tuple(_process_usage(entry, None) for listed in used_by for entry in listed)


def _read_process_list(symbol: str, handle: Any, gpu: _Gpu) -> list[_Listed]:
    function = pynvml._nvmlGetFunctionPointer(symbol)
    layout = _ProcessInfoV1 if symbol.endswith("Processes") else pynvml.c_nvmlProcessInfo_v2_t
    for _ in range(_MAX_PROCESS_LIST_TRIES):
        count = ctypes.c_uint(gpu.process_capacity)
        buffer = (layout * gpu.process_capacity)()
        result = function(handle, ctypes.byref(count), buffer)
        if result != pynvml.NVML_ERROR_INSUFFICIENT_SIZE:
            break
        # More processes than room: `count` now says how many; leave room for newcomers.
        gpu.process_capacity = count.value * 2
    if result != pynvml.NVML_SUCCESS:
        raise pynvml.NVMLError(result)
    return [
        (
            info.pid,
            None if info.usedGpuMemory == _VALUE_NOT_AVAILABLE else info.usedGpuMemory,
            _instance_id(info, "gpuInstanceId"),
            _instance_id(info, "computeInstanceId"),
        )
        for info in buffer[: count.value]
    ]


def _sm_util_by_pid(gpu: _Gpu, handle: Any) -> dict[int, int]:
    """Each process's SM utilization in its newest driver sample since the previous read.

    The driver samples only processes that used the GPU: one without a sample left the
    SMs idle meanwhile (0%), and a GPU with none answers NOT_FOUND, as nvitop reads it.
    """
    # One call into a buffer sized like the process lists', not the bindings' two.
    function = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetProcessUtilization")
    since = ctypes.c_ulonglong(gpu.sm_samples_seen_us)
    for _ in range(_MAX_PROCESS_LIST_TRIES):
        count = ctypes.c_uint(gpu.process_capacity)
        buffer = (pynvml.c_nvmlProcessUtilizationSample_t * gpu.process_capacity)()
        result = function(handle, buffer, ctypes.byref(count), since)
        if result != pynvml.NVML_ERROR_INSUFFICIENT_SIZE:
            break
        gpu.process_capacity = count.value * 2
    if result == pynvml.NVML_ERROR_NOT_FOUND:
        return {}
    if result != pynvml.NVML_SUCCESS:
        raise pynvml.NVMLError(result)
    samples = buffer[: count.value]
    newest: dict[int, Any] = {}
    for sample in samples:
        if sample.pid not in newest or sample.timeStamp >= newest[sample.pid].timeStamp:
            newest[sample.pid] = sample
    gpu.sm_samples_seen_us = max([gpu.sm_samples_seen_us, *(s.timeStamp for s in samples)])
    return {pid: min(100, int(sample.smUtil)) for pid, sample in newest.items()}


def _believable(
    total: int, used: int, free: int, reserved: int | None
) -> tuple[int, int | None, int | None, int | None]:
    """The memory figures, with used and free unknown (`None`) when either is above the
    total: a driver has reported free as 2**64 - 20GiB (an unsigned wrap-around), which
    must never read as the emptiest GPU."""
    if not (0 <= used <= total and 0 <= free <= total):
        return total, None, None, reserved
    return total, used, free, reserved


def _both(listed: ProcessKind, also: ProcessKind) -> ProcessKind:
    """The kind of a process found in two lists: compute and graphics make one process using
    the GPU both ways; otherwise the first list's kind stands."""
    if {listed, also} == {ProcessKind.COMPUTE, ProcessKind.GRAPHICS}:
        return ProcessKind.COMPUTE_GRAPHICS
    return listed


def _instance_id(info: Any, name: str) -> int | None:
    """A MIG instance id from a process list entry; the v1 layout has none."""
    value = getattr(info, name, _NO_INSTANCE)
    return None if value == _NO_INSTANCE else int(value)


def _process_usage(used: _Used, host: HostProcess | None) -> ProcessUsage:
    pid, gpu, memory_used_bytes, kind, mig_uuid, sm_util_pct = used
    if host is None:
        return ProcessUsage(
            pid,
            gpu.index,
            gpu.uuid,
            memory_used_bytes,
            kind,
            mig_uuid=mig_uuid,
            sm_util_pct=sm_util_pct,
        )
    return ProcessUsage(
        pid=pid,
        gpu_index=gpu.index,
        gpu_uuid=gpu.uuid,
        memory_used_bytes=memory_used_bytes,
        kind=kind,
        user=host.user,
        command=host.command,
        cpu_pct=host.cpu_pct,
        rss_bytes=host.rss_bytes,
        started_at=host.started_at,
        mig_uuid=mig_uuid,
        sm_util_pct=sm_util_pct,
    )


def _mig_mode(fields: _Fields, handle: Any) -> bool | None:
    """Whether the GPU is in MIG mode (asked only of GPUs whose utilization is not reported)."""
    mode = fields.read("MIG mode", pynvml.nvmlDeviceGetMigMode, handle)
    if mode is None:
        return None
    if mode[0] != pynvml.NVML_DEVICE_MIG_ENABLE:
        # Out of MIG mode (again): utilization may read now, so ask for it next time.
        fields.gpu.not_reported.discard("utilization")
        return False
    return True


def _profile(name: str | None) -> str | None:
    """`1g.10gb` from `NVIDIA A100-SXM4-80GB MIG 1g.10gb`, the form drivers name MIG devices."""
    if name is None or " MIG " not in name:
        return None
    return name.rsplit(" MIG ", 1)[1].strip() or None


def _forget_names(gpu: _Gpu, devices: list[MigDevice]) -> None:
    """Drops what was remembered of MIG devices that are gone."""
    for uuid in set(gpu.mig_names) - {device.uuid for device in devices}:
        del gpu.mig_names[uuid]


def _watts(milliwatts: int | None) -> float | None:
    return None if milliwatts is None else milliwatts / 1000


def _told(read: Any, handle: Any) -> Any:
    """What `read` tells of the GPU, or `None` when the driver cannot tell."""
    try:
        return read(handle)
    except pynvml.NVMLError:
        return None


def _minor_number(gpu: _Gpu) -> int | None:
    """N of `/dev/nvidiaN`; a driver that does not report it is not asked again."""
    try:
        return int(pynvml.nvmlDeviceGetMinorNumber(gpu.handle))
    except _NOT_REPORTED:
        gpu.not_reported.add("minor number")
    except pynvml.NVMLError:
        pass
    return None


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


@contextmanager
def _init_errors() -> Iterator[None]:
    """Turns NVML's start-up failures into one clear gpuwatch error."""
    try:
        yield
    except pynvml.NVMLError_LibraryNotFound as error:
        raise DriverNotFoundError(
            "NVIDIA driver not found (libnvidia-ml.so.1 could not be loaded)"
        ) from error
    except pynvml.NVMLError_DriverNotLoaded as error:
        raise DriverNotFoundError(
            "NVIDIA driver not loaded (libnvidia-ml.so.1 is there, the kernel module is not)"
        ) from error
    except pynvml.NVMLError_NoPermission as error:
        raise DriverNotFoundError(
            "no permission to use the NVIDIA driver: check access to /dev/nvidia*"
        ) from error
    except pynvml.NVMLError as error:
        raise BackendError(f"NVML failed to start: {error}") from error
