"""What a screen knows of one machine: its latest frame, its GPUs' graphs and idle clocks,
and each GPU card's input. Both screens draw a machine's cards from it.

Pure and bounded: the app feeds frames in on its own thread and reads views
out; nothing here grows with run time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from gpuwatch.gpu_history import GpuSeries
from gpuwatch.models import Lease
from gpuwatch.sampling.node_jobs import idle_text, time_left_text
from gpuwatch.tui.common import render
from gpuwatch.tui.common.frames import Backfill, Frame
from gpuwatch.tui.common.trends import GpuTrend

GRAPH_WINDOW_S = 600.0
"""The span the GPU graphs cover."""


class Section:
    """One machine on the screen."""

    def __init__(self, number: int, label: str, interval_s: float) -> None:
        self.number = number
        self.label = label
        self.frame: Frame | None = None
        """The latest frame that had a snapshot."""
        self.error: str | None = None
        self.received_at: float | None = None
        """Monotonic time of the latest frame, good or bad."""
        self.wall_offset_s = 0.0
        """The source's wall clock minus our monotonic one, as of the latest snapshot: turns
        the wall times a frame carries (process starts, the daemon's history) into monotonic
        ones. Graphs and idle times run on the monotonic clock, so a wall clock stepped back
        or forward neither blanks the graphs nor makes an idle GPU look idle for a day."""
        self.history_note = "from this screen's samples"
        self._capacity = max(60, min(4096, math.ceil(GRAPH_WINDOW_S / max(interval_s, 0.1)) * 2))
        self.trends: dict[int, GpuTrend] = {}
        self._pending: Sequence[GpuSeries] = ()

    def apply_backfill(self, backfill: Backfill) -> None:
        """Keeps the past until the first frame says how big each GPU's memory is."""
        self._pending = backfill.series
        self.history_note = backfill.note

    def apply(self, frame: Frame, received_at: float) -> None:
        self.received_at = received_at
        self.error = frame.error
        snapshot = frame.snapshot
        if snapshot is None:
            return
        self.frame = frame
        self.label = frame.source or self.label
        self.wall_offset_s = snapshot.taken_at - received_at
        if len(self.trends) != len(snapshot.gpus):
            self.trends = {gpu.index: GpuTrend(self._capacity) for gpu in snapshot.gpus}
        totals = {gpu.index: gpu.memory_total_bytes for gpu in snapshot.gpus}
        for series in self._pending:
            if (trend := self.trends.get(series.index)) is not None:
                trend.add_history(
                    [taken_at - self.wall_offset_s for taken_at in series.taken_at],
                    series.memory_used_bytes,
                    series.utilization_pct,
                    totals.get(series.index),
                )
        self._pending = ()
        for gpu in snapshot.gpus:
            used, total = gpu.memory_used_bytes, gpu.memory_total_bytes
            fraction = used / total if used is not None and total else None
            trend = self.trends.get(gpu.index)
            if trend is not None:
                trend.add(received_at, fraction, gpu.utilization_pct)

    def stalled_s(self, now_monotonic: float, after_s: float, opened_at: float) -> float | None:
        """Seconds without any frame, once that is longer than `after_s`."""
        since = self.received_at if self.received_at is not None else opened_at
        waited = now_monotonic - since
        return waited if waited >= after_s else None

    def graphs(
        self, gpu_index: int, monotonic_now: float, width: int
    ) -> tuple[list[float | None], ...]:
        """The memory and utilization graphs of one GPU, `width` cells over the window."""
        trend = self.trends.get(gpu_index)
        if trend is None:
            return [], []
        start = monotonic_now - GRAPH_WINDOW_S
        return (
            trend.memory.buckets(start, monotonic_now, width),
            trend.utilization.buckets(start, monotonic_now, width),
        )

    def leases_on(self, gpu_index: int) -> list[Lease]:
        frame = self.frame
        return [] if frame is None else [le for le in frame.leases if le.gpu_index == gpu_index]

    def card_input(
        self, gpu_index: int, monotonic_now: float, card_width: int, idle_after_s: float
    ) -> render.CardInput:
        memory, utilization = self.graphs(gpu_index, monotonic_now, render.graph_width(card_width))
        snapshot = self.frame.snapshot if self.frame is not None else None
        migs = snapshot.mig_devices_of(gpu_index) if snapshot is not None else ()
        leases = self.leases_on(gpu_index)
        held = bool(leases) or (
            snapshot is not None
            and any(p.memory_used_bytes for p in snapshot.processes_on(gpu_index))
        )
        trend = self.trends.get(gpu_index)
        idle = trend.idle.idle_for(monotonic_now) if trend is not None and held else None
        note = ""
        if idle is not None and idle.seconds >= idle_after_s:
            note = f"held, idle {'≥' if idle.at_least else ''}{render.duration(idle.seconds)}"
        job, job_left, allocated_idle = self.job_of(gpu_index)
        return render.CardInput(
            memory,
            utilization,
            leases,
            idle_note=note,
            migs=migs,
            job=job,
            job_left=job_left,
            allocated_idle=allocated_idle,
        )

    def job_of(self, gpu_index: int) -> tuple[str, str, str]:
        """`job 1234 alice` for the job holding the GPU, its time left as of the frame
        (`2:13:05 left`), and `allocated, idle 12m` when it has left the GPU idle past the
        window; empty where no job holds it."""
        frame = self.frame
        jobs = frame.jobs if frame is not None else None
        snapshot = frame.snapshot if frame is not None else None
        if jobs is None or snapshot is None:
            return "", "", ""
        gpu = next((gpu for gpu in snapshot.gpus if gpu.index == gpu_index), None)
        job = jobs.job_of(gpu) if gpu is not None else None
        if gpu is None or job is None:
            return "", "", ""
        idle_s = jobs.idle_s(gpu)
        return (
            f"job {job.job_id} {job.user or '?'}",
            time_left_text(job, snapshot.taken_at),
            idle_text(idle_s) if idle_s is not None else "",
        )
