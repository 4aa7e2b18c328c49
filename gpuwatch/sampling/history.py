"""A bounded history of GPU samples, in ring buffers allocated once.

Per sample it keeps two times and, per GPU, memory used, utilization,
temperature and power: 16 bytes plus 11 bytes per GPU. The buffers are sized
for the whole retention when the history is made and never grow, so 24 hours
at 1 s on 8 GPUs is 86,400 x 104 bytes = 9.0 MB, whatever happens.

The two times: the Unix time the snapshot was taken, for display, and the
monotonic clock's, by which samples are ordered and selected, so that a
wall clock stepped back or forth never mixes them up or changes how many
"the last 2 s" holds. A value outside what its column can hold, or than any
GPU reports (a temperature of 4294967295, a utilization of 300), is stored
as missing: one absurd sensor never stops the history, nor hides the others.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left

from gpuwatch.gpu_history import GpuSeries
from gpuwatch.models import Snapshot

_MIB = 1 << 20
# What a missing value is stored as, per column (array typecodes: I uint32, B uint8, h int16).
_NO_MEMORY, _NO_UTILIZATION, _NO_TEMPERATURE = 0xFFFF_FFFF, 0xFF, -0x8000
# The values a column takes as real; anything else is stored as missing.
_MEMORY_MIB = range(_NO_MEMORY)
_UTILIZATION_PCT = range(101)
_TEMPERATURE_C = range(-100, 301)
_POWER_W = (0.0, 100_000.0)
BYTES_PER_SAMPLE = 8 + 8
BYTES_PER_GPU_SAMPLE = 4 + 1 + 2 + 4


def history_bytes(samples: int, gpus: int) -> int:
    """The memory a history of `samples` samples of `gpus` GPUs takes."""
    return samples * (BYTES_PER_SAMPLE + gpus * BYTES_PER_GPU_SAMPLE)


class History:
    """The last `capacity` samples of `gpu_count` GPUs. Not thread-safe: guard it."""

    def __init__(self, capacity: int, gpu_count: int) -> None:
        if capacity < 1:
            raise ValueError("a history holds at least one sample")
        self.capacity = capacity
        self.gpu_count = gpu_count
        self._times = array("d", [0.0]) * capacity
        self._monotonic_s = array("d", [0.0]) * capacity
        size = capacity * gpu_count
        self._memory_mib = array("I", [_NO_MEMORY]) * size
        self._utilization = array("B", [_NO_UTILIZATION]) * size
        self._temperature = array("h", [_NO_TEMPERATURE]) * size
        self._power_w = array("f", [math.nan]) * size
        self._uuids: list[str | None] = [None] * gpu_count
        self._indices = list(range(gpu_count))
        self._next = 0  # the slot the next sample goes to
        self._count = 0

    @property
    def nbytes(self) -> int:
        """Bytes held by the buffers."""
        columns = (
            self._times,
            self._monotonic_s,
            self._memory_mib,
            self._utilization,
            self._temperature,
            self._power_w,
        )
        return sum(column.itemsize * len(column) for column in columns)

    def __len__(self) -> int:
        return self._count

    def append(self, snapshot: Snapshot, monotonic_s: float) -> None:
        """Adds `snapshot`, taken at `monotonic_s` (`time.monotonic()`, never less than the
        last sample's); its GPUs go to columns in their order in the snapshot."""
        slot = self._next
        self._times[slot] = snapshot.taken_at
        self._monotonic_s[slot] = monotonic_s
        for column, gpu in enumerate(snapshot.gpus[: self.gpu_count]):
            cell = slot * self.gpu_count + column
            used = gpu.memory_used_bytes
            used_mib = used // _MIB if isinstance(used, int) else None
            self._memory_mib[cell] = _within(used_mib, _MEMORY_MIB, _NO_MEMORY)
            self._utilization[cell] = _within(
                gpu.utilization_pct, _UTILIZATION_PCT, _NO_UTILIZATION
            )
            self._temperature[cell] = _within(gpu.temperature_c, _TEMPERATURE_C, _NO_TEMPERATURE)
            self._power_w[cell] = _watts(gpu.power_w)
            self._indices[column] = gpu.index
            if gpu.uuid is not None:
                self._uuids[column] = gpu.uuid
        self._next = (slot + 1) % self.capacity
        self._count = min(self._count + 1, self.capacity)

    def resized(self, capacity: int) -> History:
        """A history of `capacity` samples that starts with the most recent of these."""
        fresh = History(capacity, self.gpu_count)
        kept = self.window(-math.inf, capacity)
        samples, cells = len(kept.times), len(kept.times) * self.gpu_count
        fresh._times[:samples] = kept.times
        fresh._monotonic_s[:samples] = kept.monotonic_s
        fresh._memory_mib[:cells] = kept.memory_mib
        fresh._utilization[:cells] = kept.utilization
        fresh._temperature[:cells] = kept.temperature
        fresh._power_w[:cells] = kept.power_w
        fresh._next, fresh._count = samples % capacity, samples
        fresh._uuids = list(self._uuids)
        fresh._indices = list(self._indices)
        return fresh

    def since(self, start: float) -> list[GpuSeries]:
        """Each GPU's samples taken at or after `start` (on the monotonic clock)."""
        return self.window(start, self.capacity).series()

    def window(self, start: float, limit: int) -> Window:
        """A copy of the samples taken at or after `start` (on the monotonic clock), the
        newest `limit` at most.

        Copying is a few slices of the buffers, so a caller can hold a lock for it
        and turn the copy into series after letting go.
        """
        oldest = (self._next - self._count) % self.capacity
        first = bisect_left(
            range(self._count),
            start,
            key=lambda i: self._monotonic_s[(oldest + i) % self.capacity],
        )
        first = max(first, self._count - limit)
        window = Window(
            list(self._indices),
            list(self._uuids),
            truncated=first > 0
            and self._monotonic_s[(oldest + first - 1) % self.capacity] >= start,
        )
        begin = (oldest + first) % self.capacity
        end = begin + (self._count - first)
        for low, high in ((begin, min(end, self.capacity)), (0, max(0, end - self.capacity))):
            if low < high:
                window.extend(self, low, high)
        return window


class Window:
    """Samples copied out of a `History`, to be turned into per-GPU series."""

    def __init__(self, indices: list[int], uuids: list[str | None], *, truncated: bool) -> None:
        self.gpu_count = len(indices)
        self.indices = indices
        self.uuids = uuids
        self.truncated = truncated
        """True when older samples matched too but were left out (the `limit`)."""
        self.times = array("d")
        self.monotonic_s = array("d")
        self.memory_mib = array("I")
        self.utilization = array("B")
        self.temperature = array("h")
        self.power_w = array("f")

    def extend(self, history: History, low: int, high: int) -> None:
        """Appends the samples in `history`'s slots low..high-1."""
        cells = slice(low * self.gpu_count, high * self.gpu_count)
        self.times.extend(history._times[low:high])
        self.monotonic_s.extend(history._monotonic_s[low:high])
        self.memory_mib.extend(history._memory_mib[cells])
        self.utilization.extend(history._utilization[cells])
        self.temperature.extend(history._temperature[cells])
        self.power_w.extend(history._power_w[cells])

    def series(self) -> list[GpuSeries]:
        g = self.gpu_count
        return [
            GpuSeries(
                index=self.indices[index],
                uuid=self.uuids[index],
                taken_at=list(self.times),
                memory_used_bytes=[
                    _missing(v, _NO_MEMORY, _MIB) for v in self.memory_mib[index::g]
                ],
                utilization_pct=[_missing(v, _NO_UTILIZATION) for v in self.utilization[index::g]],
                temperature_c=[_missing(v, _NO_TEMPERATURE) for v in self.temperature[index::g]],
                power_w=[None if math.isnan(p) else round(p, 1) for p in self.power_w[index::g]],
            )
            for index in range(g)
        ]


def _within(value: object, valid: range, missing: int) -> int:
    return value if isinstance(value, int) and value in valid else missing


def _watts(value: object) -> float:
    low, high = _POWER_W
    if isinstance(value, int | float) and low <= value <= high:
        return float(value)
    return math.nan


def _missing(value: int, missing: int, scale: int = 1) -> int | None:
    return None if value == missing else value * scale
