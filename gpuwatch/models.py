"""The data model: what one look at a machine's GPUs returns.

Every value carries its unit in its name. `None` always means "this GPU, driver
or process does not report it" (a passively cooled GPU has no `fan_pct`, a
process in another PID namespace has no `user`); it never means zero.
Times are Unix timestamps in seconds.

Text enters the model here, from drivers, scenario files, other nodes, exporters and
schedulers: each value's text is made printable as it is made (`gpuwatch.text`), so a
GPU name or a driver version can never carry an escape sequence to a screen, a JSON
document or a metric label. Text where text belongs is checked to be text.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

import msgspec

from gpuwatch.text import printable_fields


class ProcessKind(enum.StrEnum):
    """Which of the driver's process lists a process appears in."""

    COMPUTE = "compute"
    GRAPHICS = "graphics"
    COMPUTE_GRAPHICS = "compute+graphics"
    MPS = "mps"
    """A client of the CUDA Multi-Process Service: its work runs in the MPS server's context."""


class GpuSample(msgspec.Struct, frozen=True):
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
    mig_enabled: bool | None = None
    """True when the GPU is split into MIG devices (see `Snapshot.mig_devices`), and is
    then never given out whole; False when it is not; `None` when unknown."""
    minor_number: int | None = None
    """N of the GPU's device file `/dev/nvidiaN`: what Slurm's gres.conf names a GPU by
    (`File=`), never assumed to follow `index`; `None` when the driver does not tell."""

    def __post_init__(self) -> None:
        printable_fields(self, "uuid", "name", "pci_bus_id", "error")

    @property
    def ok(self) -> bool:
        """True when the GPU could be read."""
        return self.error is None


class MigDevice(msgspec.Struct, frozen=True):
    """One MIG (Multi-Instance GPU) device: a slice of a MIG-enabled GPU, what a job is given.

    `gpu_index` is the parent GPU's NVML index and `index` the device's index
    under it (`0:2` in nvidia-smi and in `label`). `profile` is the size, as
    `1g.10gb`: compute slices and memory. The driver reports no utilization,
    temperature or power for a MIG device, so the model has none.
    """

    gpu_index: int
    index: int
    uuid: str | None
    """`MIG-...`: what CUDA_VISIBLE_DEVICES takes."""
    name: str | None = None
    profile: str | None = None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None
    memory_free_bytes: int | None = None
    error: str | None = None

    def __post_init__(self) -> None:
        printable_fields(self, "uuid", "name", "profile", "error")

    @property
    def label(self) -> str:
        """`GPU:MIG` indices, as nvidia-smi and nvitop write them: `0:2`."""
        return f"{self.gpu_index}:{self.index}"


Device = GpuSample | MigDevice
"""What a job can be given: a whole GPU or a MIG device."""


class ProcessUsage(msgspec.Struct, frozen=True):
    """One process's use of one GPU.

    The host fields (`user`, `command`, `cpu_pct`, `rss_bytes`, `started_at`)
    are `None` when the pid is not visible from here: another PID namespace, a
    process that has exited, or access denied. `cpu_pct` is in percent of one
    core: averaged over the process's lifetime the first time it is seen (as
    `ps` shows it), then over the interval since the previous sample (as `top`).
    `command` is the command line quoted as a shell would take it back
    (`python3 -c 'import time; time.sleep(300)'`).
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
    mig_uuid: str | None = None
    """The MIG device it runs in, on a MIG-enabled GPU; `None` elsewhere or when unknown."""
    sm_util_pct: int | None = None
    """Its share of the GPU's SM utilization in the driver's latest sample (nvitop's GPU-SM),
    0 to 100; `None` where the driver does not sample processes (MIG, older GPUs)."""

    def __post_init__(self) -> None:
        printable_fields(self, "gpu_uuid", "user", "command", "mig_uuid")


class Lease(msgspec.Struct, frozen=True):
    """A GPU held by a process, so that no other job is given it.

    `mem_bytes` is the memory the holder declared (`--mem`): the GPU may then
    be shared with other jobs while their declarations fit. `None` means the
    lease is exclusive.
    """

    gpu_uuid: str
    """The GPU's UUID, or a MIG device's (`MIG-...`) for a lease on a MIG device."""
    gpu_index: int
    """The GPU's NVML index; for a MIG device, its parent GPU's."""
    pid: int
    user: str
    """The owner of the lease file, not what the file says."""
    command: str
    started_at: float
    mem_bytes: int | None = None
    lease_id: str = ""
    """Names the lease among all others (its file in the lease directory)."""

    def __post_init__(self) -> None:
        printable_fields(self, "gpu_uuid", "user", "command", "lease_id")

    @property
    def exclusive(self) -> bool:
        """True when no other job may share the GPU."""
        return self.mem_bytes is None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict whose keys are the field names."""
        record: dict[str, Any] = msgspec.to_builtins(self)
        return record


class Snapshot(msgspec.Struct, frozen=True):
    """All GPUs of one machine and the processes using them, at `taken_at`."""

    taken_at: float
    hostname: str
    driver_version: str | None
    cuda_driver_version: str | None
    gpus: tuple[GpuSample, ...]
    processes: tuple[ProcessUsage, ...]
    mig_devices: tuple[MigDevice, ...] = ()
    """The MIG devices of every MIG-enabled GPU, by GPU, then by MIG index."""
    simulated: bool = False
    """True for a simulated node (`--sim`, a scenario file, a `daemon --sim`): its GPUs,
    processes and UUIDs are made up, and every screen says so."""

    def __post_init__(self) -> None:
        printable_fields(self, "hostname", "driver_version", "cuda_driver_version")

    def processes_on(self, gpu_index: int) -> tuple[ProcessUsage, ...]:
        """The processes using the GPU with this NVML index."""
        return tuple(p for p in self.processes if p.gpu_index == gpu_index)

    def mig_devices_of(self, gpu_index: int) -> tuple[MigDevice, ...]:
        """The MIG devices of the GPU with this NVML index (none unless it is MIG-enabled)."""
        return tuple(m for m in self.mig_devices if m.gpu_index == gpu_index)

    def processes_in(self, mig: MigDevice) -> tuple[ProcessUsage, ...]:
        """The processes running in this MIG device."""
        return tuple(p for p in self.processes if mig.uuid and p.mig_uuid == mig.uuid)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict whose keys are the field names; bytes stay integers."""
        record: dict[str, Any] = msgspec.to_builtins(self)
        return record

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Snapshot:
        """The inverse of `to_dict` (for snapshots that crossed a process boundary).

        Keys it does not know are ignored, so that a newer daemon may add fields
        without breaking older clients; a change they could not ignore bumps
        `SNAPSHOT_FORMAT_VERSION` instead.
        """
        gpus = tuple(GpuSample(**_known(GpuSample, gpu)) for gpu in data["gpus"])
        processes = tuple(
            ProcessUsage(**{**_known(ProcessUsage, proc), "kind": ProcessKind(proc["kind"])})
            for proc in data["processes"]
        )
        mig_devices = tuple(
            MigDevice(**_known(MigDevice, mig)) for mig in data.get("mig_devices", ())
        )
        return cls(
            taken_at=data["taken_at"],
            hostname=data["hostname"],
            driver_version=data["driver_version"],
            cuda_driver_version=data["cuda_driver_version"],
            gpus=gpus,
            processes=processes,
            mig_devices=mig_devices,
            simulated=data.get("simulated") is True,
        )


SNAPSHOT_FORMAT_VERSION = 1
"""The version of the snapshot's JSON on the daemon's wire (`format_version`). Adding a
field leaves it as it is (`from_dict` ignores keys it does not know); a change an older
client would misread (a field renamed, removed or with another meaning) increments it."""


def _known(cls: type[Any], data: Mapping[str, Any]) -> dict[str, Any]:
    """The items of `data` that are fields of the dataclass `cls`."""
    names = cls.__struct_fields__
    return {key: value for key, value in data.items() if key in names}
