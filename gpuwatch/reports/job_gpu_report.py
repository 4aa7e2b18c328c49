"""What a job did with each of its GPUs, from the daemon's history: mean and peak
utilisation, peak memory, time idle (the GPU half of Slurm's `seff`). Pure: series in,
figures out, no I/O.

Each sample stands for the time until the next one, but never for more than `gap_s` (three
sampling intervals): a longer silence is a gap in the history (the daemon was down or
restarted), counted as not covered rather than filled in. The figures are the whole GPU's,
as NVML reports them: on a GPU Slurm gave to this job alone, the job's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from gpuwatch.gpu_history import GpuSeries

IDLE_MAX_PCT = 1
"""A sample at or below this utilisation counts as idle."""
GAP_INTERVALS = 3
"""A silence longer than this many sampling intervals is a gap in the history."""


@dataclass(frozen=True, slots=True)
class GpuJobUsage:
    """One GPU over one job's run. Utilisation figures are `None` when no sample in the
    job's time reported one; `covered_s` is how much of `job_s` the history speaks for."""

    index: int
    uuid: str | None
    job_s: float
    covered_s: float
    samples: int
    mean_utilization_pct: float | None
    peak_utilization_pct: int | None
    peak_memory_used_bytes: int | None
    idle_s: float
    starts_late_s: float
    """How long after the job began the history starts (0 when it covers the start)."""
    gaps: int
    """Silences longer than the gap limit inside the job's time, its end included."""

    @property
    def history_short(self) -> bool:
        """The history does not cover the whole job: it starts late or has gaps."""
        return self.starts_late_s > 0 or self.gaps > 0


def gpu_job_usage(
    series: GpuSeries, start_s: float, end_s: float, interval_s: float = 1.0
) -> GpuJobUsage:
    """`series` between the Unix times `start_s` and `end_s` (a job's run), sampled every
    `interval_s` (the daemon's interval)."""
    gap_s = GAP_INTERVALS * max(interval_s, 1e-3)
    inside = [
        i for i, t in enumerate(series.taken_at) if start_s <= t <= end_s and math.isfinite(t)
    ]
    times = [series.taken_at[i] for i in inside]
    weights = _weights(times, end_s, gap_s)
    lead_s = times[0] - start_s if times else end_s - start_s
    lead_covered_s = lead_s if times and lead_s <= gap_s else 0.0
    if weights:  # the first sample stands for the moments before it too
        weights[0] += lead_covered_s
    utilization = [series.utilization_pct[i] for i in inside]
    memory = [m for i in inside if (m := series.memory_used_bytes[i]) is not None]
    known = [(u, w) for u, w in zip(utilization, weights, strict=True) if u is not None]
    return GpuJobUsage(
        index=series.index,
        uuid=series.uuid,
        job_s=end_s - start_s,
        covered_s=sum(weights),
        samples=len(inside),
        mean_utilization_pct=_weighted_mean(known),
        peak_utilization_pct=max((u for u, _ in known), default=None),
        peak_memory_used_bytes=max(memory, default=None),
        idle_s=sum(w for u, w in known if u <= IDLE_MAX_PCT),
        starts_late_s=lead_s if lead_s > 0 and not lead_covered_s else 0.0,
        gaps=_gaps(times, end_s, gap_s),
    )


def _weights(times: Sequence[float], end_s: float, gap_s: float) -> list[float]:
    """The time each sample stands for: until the next (or the job's end), at most `gap_s`."""
    ends = [*times[1:], end_s] if times else []
    return [min(max(after - t, 0.0), gap_s) for t, after in zip(times, ends, strict=True)]


def _gaps(times: Sequence[float], end_s: float, gap_s: float) -> int:
    """Silences longer than `gap_s` between samples, and after the last one."""
    ends = [*times[1:], end_s] if times else []
    return sum(after - t > gap_s for t, after in zip(times, ends, strict=True))


def _weighted_mean(values: Sequence[tuple[int, float]]) -> float | None:
    """The time-weighted mean; the plain mean when the samples stand for no time (one
    sample at the job's very end)."""
    if not values:
        return None
    total_s = sum(w for _, w in values)
    if total_s <= 0:
        return sum(u for u, _ in values) / len(values)
    return sum(u * w for u, w in values) / total_s


def about(seconds: float) -> str:
    """A span for people, rounded: `45s`, `58 min`, `3h 02m`, `2d 04h`."""
    seconds = max(0.0, seconds)
    if seconds < 90:
        return f"{seconds:.0f}s"
    minutes = round(seconds / 60)
    if minutes < 90:
        return f"{minutes} min"
    if minutes < 48 * 60:
        return f"{minutes // 60}h {minutes % 60:02d}m"
    hours = round(seconds / 3600)
    return f"{hours // 24}d {hours % 24:02d}h"


def shortfalls(usages: Sequence[GpuJobUsage]) -> list[str]:
    """What the history cannot tell about these GPUs, one plain line per shortfall, naming
    the GPUs it applies to (`GPUs 1, 3: ...`), in the order first met."""
    gpus_by_line: dict[str, list[int]] = {}
    for usage in usages:
        for line in _shortfalls(usage):
            gpus_by_line.setdefault(line, []).append(usage.index)
    return [
        f"{'GPU' if len(gpus) == 1 else 'GPUs'} {', '.join(map(str, gpus))}: {line}"
        for line, gpus in gpus_by_line.items()
    ]


def _shortfalls(usage: GpuJobUsage) -> list[str]:
    if usage.samples == 0:
        return ["the daemon's history holds no sample of this job's time"]
    lines = []
    if usage.starts_late_s > 0:
        lines.append(
            f"the history covers only the last {about(usage.covered_s)} of this "
            f"{about(usage.job_s)} job: it begins {about(usage.starts_late_s)} after the job "
            "started (the daemon keeps --history worth of samples, or was started later)"
        )
    if usage.gaps:
        gaps = "1 gap" if usage.gaps == 1 else f"{usage.gaps} gaps"
        lines.append(
            f"the history has {gaps} (the daemon did not sample): it covers "
            f"{about(usage.covered_s)} of this {about(usage.job_s)} job"
        )
    return lines
