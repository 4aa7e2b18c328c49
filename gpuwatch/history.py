"""A bounded history of GPU samples, in ring buffers allocated once.

Per sample it keeps the time and, per GPU, memory used, utilization,
temperature and power: 8 bytes plus 11 bytes per GPU. The buffers are sized
for the whole retention when the history is made and never grow, so 24 hours
at 1 s on 8 GPUs is 86,400 x 96 bytes = 8.3 MB, whatever happens.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left
from dataclasses import dataclass

from gpuwatch.models import Snapshot

_MIB = 1 << 20
# What a missing value is stored as, per column (array typecodes: I uint32, B uint8, h int16).
_NO_MEMORY, _NO_UTILIZATION, _NO_TEMPERATURE = 0xFFFF_FFFF, 0xFF, -0x8000
BYTES_PER_SAMPLE = 8
BYTES_PER_GPU_SAMPLE = 4 + 1 + 2 + 4


def history_bytes(samples: int, gpus: int) -> int:
    """The memory a history of `samples` samples of `gpus` GPUs takes."""
    return samples * (BYTES_PER_SAMPLE + gpus * BYTES_PER_GPU_SAMPLE)


@dataclass(frozen=True, slots=True)
class GpuSeries:
    """One GPU's history, oldest first; `None` where the GPU did not report a value."""

    index: int
    uuid: str | None
    taken_at: list[float]
    memory_used_bytes: list[int | None]
    utilization_pct: list[int | None]
    temperature_c: list[int | None]
    power_w: list[float | None]


class History:
    """The last `capacity` samples of `gpu_count` GPUs. Not thread-safe: guard it."""

    def __init__(self, capacity: int, gpu_count: int) -> None:
        if capacity < 1:
            raise ValueError("a history holds at least one sample")
        self.capacity = capacity
        self.gpu_count = gpu_count
        self._times = array("d", [0.0]) * capacity
        size = capacity * gpu_count
        self._memory_mib = array("I", [_NO_MEMORY]) * size
        self._utilization = array("B", [_NO_UTILIZATION]) * size
        self._temperature = array("h", [_NO_TEMPERATURE]) * size
        self._power_w = array("f", [math.nan]) * size
        self._uuids: list[str | None] = [None] * gpu_count
        self._next = 0  # the slot the next sample goes to
        self._count = 0

    @property
    def nbytes(self) -> int:
        """Bytes held by the buffers."""
        columns = (
            self._times,
            self._memory_mib,
            self._utilization,
            self._temperature,
            self._power_w,
        )
        return sum(column.itemsize * len(column) for column in columns)

    def __len__(self) -> int:
        return self._count

    def append(self, snapshot: Snapshot) -> None:
        slot = self._next
        self._times[slot] = snapshot.taken_at
        for gpu in snapshot.gpus[: self.gpu_count]:
            cell = slot * self.gpu_count + gpu.index
            used = gpu.memory_used_bytes
            self._memory_mib[cell] = (
                _NO_MEMORY if used is None else min(used // _MIB, _NO_MEMORY - 1)
            )
            self._utilization[cell] = _or(gpu.utilization_pct, _NO_UTILIZATION)
            self._temperature[cell] = _or(gpu.temperature_c, _NO_TEMPERATURE)
            self._power_w[cell] = math.nan if gpu.power_w is None else gpu.power_w
            if gpu.uuid is not None:
                self._uuids[gpu.index] = gpu.uuid
        self._next = (slot + 1) % self.capacity
        self._count = min(self._count + 1, self.capacity)

    def resized(self, capacity: int) -> History:
        """A history of `capacity` samples that starts with the most recent of these."""
        fresh = History(capacity, self.gpu_count)
        for slot in self._slots_in_order()[-capacity:]:
            target = fresh._next
            fresh._times[target] = self._times[slot]
            source = slice(slot * self.gpu_count, (slot + 1) * self.gpu_count)
            cells = slice(target * self.gpu_count, (target + 1) * self.gpu_count)
            fresh._memory_mib[cells] = self._memory_mib[source]
            fresh._utilization[cells] = self._utilization[source]
            fresh._temperature[cells] = self._temperature[source]
            fresh._power_w[cells] = self._power_w[source]
            fresh._next = (target + 1) % capacity
            fresh._count += 1
        fresh._uuids = list(self._uuids)
        return fresh

    def since(self, start: float) -> list[GpuSeries]:
        """Each GPU's samples taken at or after `start` (a Unix time)."""
        slots = self._slots_in_order()
        first = bisect_left([self._times[slot] for slot in slots], start)
        chosen = slots[first:]
        times = [self._times[slot] for slot in chosen]
        return [self._series(index, chosen, times) for index in range(self.gpu_count)]

    def _slots_in_order(self) -> list[int]:
        oldest = (self._next - self._count) % self.capacity
        return [(oldest + offset) % self.capacity for offset in range(self._count)]

    def _series(self, index: int, slots: list[int], times: list[float]) -> GpuSeries:
        cells = [slot * self.gpu_count + index for slot in slots]
        return GpuSeries(
            index=index,
            uuid=self._uuids[index],
            taken_at=times,
            memory_used_bytes=[_missing(self._memory_mib[c], _NO_MEMORY, _MIB) for c in cells],
            utilization_pct=[_missing(self._utilization[c], _NO_UTILIZATION) for c in cells],
            temperature_c=[_missing(self._temperature[c], _NO_TEMPERATURE) for c in cells],
            power_w=[
                None if math.isnan(p) else round(p, 1) for p in (self._power_w[c] for c in cells)
            ],
        )


def _or(value: int | None, missing: int) -> int:
    return missing if value is None else value


def _missing(value: int, missing: int, scale: int = 1) -> int | None:
    return None if value == missing else value * scale
