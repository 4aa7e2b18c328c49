"""What a job did with each of its GPUs, from the daemon's history: mean and peak
utilisation, peak memory, time idle (the GPU half of Slurm's `seff`). Pure: series in,
figures out, no I/O.

`job_on_node` first puts together what is known of the job here: Slurm's account of its
run (while Slurm remembers it), the GPUs from its own `SLURM_JOB_GPUS` (in its epilog),
from Slurm while it runs, or from the daemon's memory of the job after; it says plainly
when none of them knows the job ("never seen") or its GPUs.

Each sample stands for the time until the next one, but never for more than `gap_s` (three
sampling intervals, and at least two seconds): a longer silence is a gap in the history
(the daemon was down or restarted), counted as not covered rather than filled in. The
figures are the whole GPU's, as NVML reports them: on a GPU Slurm gave to this job alone,
the job's.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import msgspec

from gpuwatch.errors import JobUnknownError, SchedulerUnavailableError
from gpuwatch.gpu_history import GpuSeries
from gpuwatch.jobs.job_runs import JobRun
from gpuwatch.jobs.sightings import Sighting

IDLE_MAX_PCT = 1
"""A sample at or below this utilisation counts as idle."""
GAP_INTERVALS = 3
"""A silence longer than this many sampling intervals is a gap in the history."""
GAP_MIN_S = 2.0
"""Nor is a silence this short ever one: on a busy node (a Slurm node running jobs is one) a
sample is late by a scheduling stall now and then, and three intervals of a fast daemon
(0.6 s at 0.2 s) are shorter than such a stall."""


class GpuJobUsage(msgspec.Struct, frozen=True):
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
    gap_s = max(GAP_INTERVALS * interval_s, GAP_MIN_S)
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


class SlurmAnswer(msgspec.Struct, frozen=True):
    """What Slurm said of the job: its run, or `None` and why (`unavailable`: Slurm is
    there but did not answer; else it is absent, or knows no such job)."""

    run: JobRun | None
    why: str = ""
    unavailable: bool = False


class DaemonMemory(msgspec.Struct, frozen=True):
    """What the daemon remembers of the job (`GET /v1/jobs/seen`)."""

    seen: Sighting | None
    since: float | None
    """When its memory of jobs begins; `None` when it has read no jobs."""
    reading: bool = True
    absent: str = ""
    """Why there is no daemon to ask, where there is none."""


class JobOnNode(msgspec.Struct, frozen=True):
    """A job's run on this node, and the GPUs it held here, put together."""

    job_id: str
    node: str
    state: str
    start_s: float
    end_s: float | None
    """`None` while it runs."""
    minor_numbers: tuple[int, ...]
    gpus_from: str
    jobs_from: str
    notes: tuple[str, ...] = ()


def job_on_node(
    job_id: str,
    node: str,
    slurm: SlurmAnswer,
    memory: DaemonMemory,
    gpus_given: tuple[tuple[int, ...], str] | None,
) -> JobOnNode:
    """The job on `node`. `gpus_given`: its GPUs and where from, where its own variables
    or Slurm named them by GRES index. `JobUnknownError` when neither Slurm nor the daemon
    knows the job here, or its GPUs; `SchedulerUnavailableError` when Slurm did not answer
    and the daemon never saw it."""
    run, seen = slurm.run, memory.seen
    if run is None and seen is None:
        raise _never_seen(job_id, node, slurm, memory)
    if run is not None:
        if run.start_s is None:
            raise JobUnknownError(f"job {job_id} has not started ({run.state or 'no state'})")
        if node not in run.nodes and seen is None:
            raise JobUnknownError(
                f"job {job_id} ran on {','.join(run.nodes)[:200] or 'no node'}, not on this "
                f"node ({node}): run job-report there"
            )
    minors, gpus_from = _gpus(job_id, node, run, seen, memory, gpus_given)
    if not minors:
        raise JobUnknownError(f"job {job_id} held no GPU on this node ({node})")
    start, end, notes = _times(run, seen)
    return JobOnNode(
        job_id=job_id,
        node=node,
        state=run.state if run is not None else ("RUNNING" if end is None else "ENDED"),
        start_s=start,
        end_s=end,
        minor_numbers=minors,
        gpus_from=gpus_from,
        jobs_from=run.source if run is not None else "the daemon's memory",
        notes=tuple(notes),
    )


def _never_seen(job_id: str, node: str, slurm: SlurmAnswer, memory: DaemonMemory) -> Exception:
    daemon = f"the daemon never saw it on this node's GPUs ({_memory_span(memory)})"
    if memory.absent:
        daemon = f"no daemon answers to remember it ({memory.absent})"
    if slurm.unavailable:
        return SchedulerUnavailableError(f"{slurm.why}; {daemon}")
    return JobUnknownError(f"job {job_id} was never seen: {slurm.why}, and {daemon}")


def _memory_span(memory: DaemonMemory) -> str:
    if memory.absent:
        return f"no daemon answers: {memory.absent}"
    if not memory.reading:
        return "it reads no scheduler here"
    if memory.since is None:
        return "it has read no jobs yet"
    return f"it remembers jobs since {clock_time(memory.since)}, as long as its --history"


def _gpus(
    job_id: str,
    node: str,
    run: JobRun | None,
    seen: Sighting | None,
    memory: DaemonMemory,
    given: tuple[tuple[int, ...], str] | None,
) -> tuple[tuple[int, ...], str]:
    if given is not None:
        return given
    if seen is not None:
        return seen.job.gpu_minor_numbers, "the daemon's memory"
    assert run is not None  # job_on_node: one of them is known
    when = f"from {clock_time(run.start_s)}" if run.start_s is not None else ""
    raise JobUnknownError(
        f"Slurm says job {job_id} ran on {node} {when}, but which GPUs it held is not known: "
        f"Slurm forgets them when the job ends, and the daemon never saw it "
        f"({_memory_span(memory)})"
    )


def _times(run: JobRun | None, seen: Sighting | None) -> tuple[float, float | None, list[str]]:
    """The job's start and end (`None`: it runs), and notes on where they came from."""
    if run is not None and run.start_s is not None:
        return run.start_s, run.end_s, []
    assert seen is not None
    start = seen.job.started_at if seen.job.started_at is not None else seen.first_seen_at
    if seen.gone_at is None:
        return start, None, []
    note = (
        f"Slurm no longer knows job {seen.job.job_id}: it ended between "
        f"{clock_time(seen.last_seen_at)} and {clock_time(seen.gone_at)} (the daemon's last "
        "two reads of the jobs); the figures run to the first"
    )
    return start, seen.last_seen_at, [note]


def clock_time(unix_s: float) -> str:
    """`2026-11-27 06:41:42`, local time."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(unix_s))
