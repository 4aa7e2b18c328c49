"""Bounded series for the graphs, and how long each GPU has been idle.

Every buffer has a fixed capacity chosen up front, and series of processes
that are gone are dropped, so memory stays flat however long the screen runs.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence

import msgspec

IDLE_UTILIZATION_PCT = 1
"""A GPU at or below this utilization counts as idle."""


class Series:
    """The last `capacity` (time, value) points; `None` values are gaps."""

    __slots__ = ("_times", "_values")

    def __init__(self, capacity: int) -> None:
        self._times: deque[float] = deque(maxlen=capacity)
        self._values: deque[float | None] = deque(maxlen=capacity)

    def __len__(self) -> int:
        return len(self._times)

    def add(self, taken_at: float, value: float | None) -> None:
        if self._times and taken_at <= self._times[-1]:
            return  # a sample already held (history and the first frames overlap)
        self._times.append(taken_at)
        self._values.append(value)

    def latest(self, count: int) -> list[float | None]:
        """The newest `count` values, oldest first."""
        values = list(self._values)
        return values[-count:] if count > 0 else []

    def buckets(self, start: float, end: float, width: int) -> list[float | None]:
        """The mean value in each of `width` equal slices of [start, end); `None` if empty."""
        if width <= 0 or end <= start:
            return []
        sums = [0.0] * width
        counts = [0] * width
        scale = width / (end - start)
        for taken_at, value in zip(self._times, self._values, strict=True):
            if value is None or taken_at < start or taken_at >= end:
                continue
            slot = int((taken_at - start) * scale)
            sums[slot] += value
            counts[slot] += 1
        return [total / count if count else None for total, count in zip(sums, counts, strict=True)]


class IdleClock:
    """How long a GPU's utilization has stayed at or below `IDLE_UTILIZATION_PCT`.

    Only two numbers are kept, whatever the run time: when the current idle
    stretch began, and when observation began (an idle stretch that began then
    may be older still: it is reported as "at least").
    """

    __slots__ = ("first_seen", "idle_since")

    def __init__(self) -> None:
        self.first_seen: float | None = None
        self.idle_since: float | None = None

    def observe(self, taken_at: float, utilization_pct: float | None) -> None:
        if self.first_seen is None:
            self.first_seen = taken_at
        if utilization_pct is None:
            return  # unknown: neither starts nor ends an idle stretch
        if utilization_pct > IDLE_UTILIZATION_PCT:
            self.idle_since = None
        elif self.idle_since is None:
            self.idle_since = taken_at

    def idle_for(self, now: float, *, since: float | None = None) -> Idle | None:
        """The idle stretch up to `now`, counted from `since` at the earliest (a process's
        start: it cannot have idled before it existed); `None` while busy."""
        if self.idle_since is None:
            return None
        start = self.idle_since
        at_least = start == self.first_seen
        if since is not None and since > start:
            start, at_least = since, False
        return Idle(max(0.0, now - start), at_least)


class Idle(msgspec.Struct, frozen=True):
    """An idle stretch: `seconds` long, or longer when `at_least` (it began before we looked)."""

    seconds: float
    at_least: bool = False


class GpuTrend:
    """One GPU's memory fraction and utilization over time, for its graphs."""

    __slots__ = ("idle", "memory", "utilization")

    def __init__(self, capacity: int) -> None:
        self.memory = Series(capacity)
        self.utilization = Series(capacity)
        self.idle = IdleClock()

    def add(
        self, taken_at: float, memory_fraction: float | None, utilization_pct: float | None
    ) -> None:
        self.memory.add(taken_at, memory_fraction)
        self.utilization.add(taken_at, None if utilization_pct is None else utilization_pct / 100)
        self.idle.observe(taken_at, utilization_pct)

    def add_history(
        self,
        times: Sequence[float],
        memory_used_bytes: Sequence[int | None],
        utilization_pct: Sequence[int | None],
        memory_total_bytes: int | None,
    ) -> None:
        """Samples from before the screen opened, oldest first."""
        for taken_at, used, busy in zip(times, memory_used_bytes, utilization_pct, strict=True):
            fraction = (
                used / memory_total_bytes if used is not None and memory_total_bytes else None
            )
            self.add(taken_at, fraction, busy)


class ProcessTrend:
    """One process's GPU memory and CPU use over its last `capacity` samples."""

    __slots__ = ("cpu_pct", "memory_bytes")

    def __init__(self, capacity: int) -> None:
        self.memory_bytes = Series(capacity)
        self.cpu_pct = Series(capacity)


class ProcessTrends:
    """`ProcessTrend`s keyed by row; keys not seen in the latest frame are dropped."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._trends: dict[str, ProcessTrend] = {}

    def __len__(self) -> int:
        return len(self._trends)

    def get(self, key: str) -> ProcessTrend | None:
        return self._trends.get(key)

    def update(
        self, taken_at: float, samples: Iterable[tuple[str, int | None, float | None]]
    ) -> None:
        """Adds (key, GPU memory, CPU %) for every live process of one source."""
        for key, memory_bytes, cpu_pct in samples:
            trend = self._trends.get(key)
            if trend is None:
                trend = self._trends[key] = ProcessTrend(self.capacity)
            trend.memory_bytes.add(taken_at, memory_bytes)
            trend.cpu_pct.add(taken_at, cpu_pct)

    def keep_only(self, keys: set[str], prefix: str) -> None:
        """Forgets the processes of source `prefix` that are not in `keys`."""
        for key in [k for k in self._trends if k.startswith(prefix) and k not in keys]:
            del self._trends[key]
