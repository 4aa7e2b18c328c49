"""The data model: what one look at a machine's GPUs returns.

Every value carries its unit in its name. `None` always means "this GPU, driver
or process does not report it" (a passively cooled GPU has no `fan_pct`, a
process in another PID namespace has no `user`); it never means zero.
Times are Unix timestamps in seconds.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from dataclasses import dataclass

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing at run time
if TYPE_CHECKING:
    from typing import Any


class ProcessKind(enum.StrEnum):
    """Which of the driver's process lists a process appears in."""

    COMPUTE = "compute"
    GRAPHICS = "graphics"
    COMPUTE_GRAPHICS = "compute+graphics"
    MPS = "mps"
    """A client of the CUDA Multi-Process Service: its work runs in the MPS server's context."""


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One GPU at one moment.

    `index` is the NVML index (PCI bus order, as nvidia-smi shows it), which is
    not necessarily the CUDA ordinal. `error` says why the GPU could not be read
    (lost, reset required, ...); its other metrics are then `None`.
    """

    index: int
    uuid: str | None
    name: str | None
    pci_bus_id: str | None
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None
    memory_free_bytes: int | None = None
    memory_reserved_bytes: int | None = None
    utilization_pct: int | None = None
    memory_utilization_pct: int | None = None
    temperature_c: int | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    fan_pct: int | None = None
    sm_clock_mhz: int | None = None
    performance_state: int | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        """True when the GPU could be read."""
        return self.error is None


@dataclass(frozen=True, slots=True)
class ProcessUsage:
    """One process's use of one GPU.

    The host fields (`user`, `command`, `cpu_pct`, `rss_bytes`, `started_at`)
    are `None` when the pid is not visible from here: another PID namespace, a
    process that has exited, or access denied. `cpu_pct` is in percent of one
    core: averaged over the process's lifetime the first time it is seen (as
    `ps` shows it), then over the interval since the previous sample (as `top`).
    """

    pid: int
    gpu_index: int
    gpu_uuid: str | None
    memory_used_bytes: int | None
    kind: ProcessKind
    user: str | None = None
    command: str | None = None
    cpu_pct: float | None = None
    rss_bytes: int | None = None
    started_at: float | None = None


@dataclass(frozen=True, slots=True)
class Lease:
    """A GPU held by a process, so that no other job is given it.

    `mem_bytes` is the memory the holder declared (`--mem`): the GPU may then
    be shared with other jobs while their declarations fit. `None` means the
    lease is exclusive.
    """

    gpu_uuid: str
    gpu_index: int
    pid: int
    user: str
    """The owner of the lease file, not what the file says."""
    command: str
    started_at: float
    mem_bytes: int | None = None
    lease_id: str = ""
    """Names the lease among all others (its file in the lease directory)."""

    @property
    def exclusive(self) -> bool:
        """True when no other job may share the GPU."""
        return self.mem_bytes is None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict whose keys are the field names."""
        return dataclasses.asdict(self)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """All GPUs of one machine and the processes using them, at `taken_at`."""

    taken_at: float
    hostname: str
    driver_version: str | None
    cuda_driver_version: str | None
    gpus: tuple[GpuSample, ...]
    processes: tuple[ProcessUsage, ...]

    def processes_on(self, gpu_index: int) -> tuple[ProcessUsage, ...]:
        """The processes using the GPU with this NVML index."""
        return tuple(p for p in self.processes if p.gpu_index == gpu_index)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict whose keys are the field names; bytes stay integers."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Snapshot:
        """The inverse of `to_dict` (for snapshots that crossed a process boundary)."""
        gpus = tuple(GpuSample(**gpu) for gpu in data["gpus"])
        processes = tuple(
            ProcessUsage(**{**proc, "kind": ProcessKind(proc["kind"])})
            for proc in data["processes"]
        )
        return cls(
            taken_at=data["taken_at"],
            hostname=data["hostname"],
            driver_version=data["driver_version"],
            cuda_driver_version=data["cuda_driver_version"],
            gpus=gpus,
            processes=processes,
        )
