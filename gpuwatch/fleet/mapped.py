"""What an exporter's series say of one node, and the range checks every value passes.

Values arrive as floats from a machine someone else runs; each converter returns
`None` for one out of its range, so that a bad reading is unknown, never a number
that placement would trust.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import msgspec

from gpuwatch.fleet_model import GpuJob
from gpuwatch.holders import Holder
from gpuwatch.models import GpuSample, Lease, MigDevice, ProcessUsage
from gpuwatch.units import MAX_SIZE_BYTES

MAX_GPU_INDEX = 1023
MIB = 1 << 20


class Claims(msgspec.Struct, frozen=True):
    """Who a node's series say holds its devices (by `gpuwatch.holders.device_key`), and
    which they say nobody can tell about: judged on its snapshot where the node is made
    (`gpuwatch.holders.holders_on`). Each holder passed `holder_problem` where it was read;
    a device one failed for is unknown."""

    held: Mapping[str, tuple[Holder, ...]] = msgspec.field(default_factory=dict)
    unknown: Mapping[str, str] = msgspec.field(default_factory=dict)
    unknown_why: str | None = None


NO_CLAIMS = Claims()
"""An exporter that tells no holder."""


class Mapped(msgspec.Struct, frozen=True):
    """One node as its exporter's series describe it."""

    gpus: tuple[GpuSample, ...]
    mig_devices: tuple[MigDevice, ...] = ()
    processes: tuple[ProcessUsage, ...] = ()
    leases: tuple[Lease, ...] | None = None
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    data_at: float | None = None
    """When the exporter itself took these values, where it says (gpuwatch's
    `sample_timestamp_seconds`); `None`: as fresh as the read."""
    error: str | None = None
    """Why the node is not up although it answered (its sampling stalled)."""
    lease_waiters: int | None = None
    longest_wait_s: float | None = None
    jobs: tuple[GpuJob, ...] | None = None
    """As `NodeState`'s: `None` where the exporter does not tell."""
    claims: Claims = NO_CLAIMS
    """Who holds its devices, as far as its exporter tells."""
    mig_devices_known: bool = True
    """As `NodeState`'s."""
    simulated: bool = False
    """Its daemon serves a simulated node (`gpuwatch_simulated`): its GPUs are made up."""


class GpuFields(msgspec.Struct):
    """A GPU's fields as they are found, series by series."""

    index: int
    values: dict[str, object] = msgspec.field(default_factory=dict)

    def build(self) -> GpuSample:
        values = {"uuid": None, "name": None, "pci_bus_id": None, **self.values}
        if values.get("memory_used_bytes") == 0 and values.get("memory_free_bytes") == 0:
            # No GPU has no memory: figures of nothing at all are unknown, not a full GPU.
            values["memory_used_bytes"] = values["memory_free_bytes"] = None
        return GpuSample(index=self.index, **values)  # type: ignore[arg-type]


def on_mig_gpus(
    gpus: Sequence[GpuSample], mig_devices: Sequence[MigDevice]
) -> tuple[MigDevice, ...]:
    """The MIG devices of GPUs the node has and says are in MIG mode: a MIG device an
    exporter tells of a GPU it does not show, or of one not split (MIG mode off or not
    told), cannot be believed, and is never offered."""
    split = {gpu.index for gpu in gpus if gpu.mig_enabled is True}
    return tuple(device for device in mig_devices if device.gpu_index in split)


def index_of(text: str | None) -> int | None:
    """A GPU index label (`"3"`), or `None` unless it is a small whole number."""
    if text is None or not (text.isdigit() and text.isascii() and len(text) <= 4):
        return None
    index = int(text)
    return index if index <= MAX_GPU_INDEX else None


def label(text: str | None, most: int = 256) -> str | None:
    """A label's text, `None` when empty; cut to `most` characters."""
    return text[:most] if text else None


def whole_bytes(value: float, unit: int = 1) -> int | None:
    """Bytes from `value` in units of `unit` bytes (MiB for DCGM)."""
    total = value * unit
    return int(total) if 0 <= total <= MAX_SIZE_BYTES else None


def percent(value: float) -> int | None:
    return round(value) if 0 <= value <= 100 else None


def percent_of_ratio(value: float) -> int | None:
    return round(value * 100) if 0 <= value <= 1 else None


def celsius(value: float) -> int | None:
    return round(value) if -100 <= value <= 1000 else None


def watts(value: float) -> float | None:
    return value if 0 <= value <= 100_000 else None


def megahertz_of_hertz(value: float) -> int | None:
    return round(value / 1e6) if 0 <= value <= 1e11 else None


def megahertz(value: float) -> int | None:
    return round(value) if 0 <= value <= 100_000 else None


def small_whole(value: float, most: int) -> int | None:
    return int(value) if value.is_integer() and 0 <= value <= most else None


def flag(value: float) -> bool | None:
    return True if value == 1 else False if value == 0 else None
