"""One GPU's history, as the daemon serves it and the sampler keeps it: part of the data
model, in a module of its own because a one-shot command (`status`, `pick`) never reads
history and should not pay to define it.
"""

from __future__ import annotations

import msgspec


class GpuSeries(msgspec.Struct, frozen=True):
    """One GPU's history, oldest first; `None` where the GPU did not report a value."""

    index: int
    uuid: str | None
    taken_at: list[float]
    """Unix times, for display: select and order by the monotonic clock, never by these."""
    memory_used_bytes: list[int | None]
    utilization_pct: list[int | None]
    temperature_c: list[int | None]
    power_w: list[float | None]
