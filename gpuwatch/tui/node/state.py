"""What `gpuwatch tui` knows: each machine's section, and each process's series for the
detail view.

Pure and bounded: the app feeds frames in on its own thread and reads rows out; the
series of processes that are gone are dropped.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpuwatch.tui.common.frames import Frame
from gpuwatch.tui.common.section import Section
from gpuwatch.tui.common.trends import ProcessTrends
from gpuwatch.tui.node.rows import Row, build_rows, device_labels, process_key

PROCESS_SAMPLES = 300
"""Samples kept per process for its detail graphs."""


class ScreenState:
    """Every section, and the process series shared by the detail view."""

    def __init__(self, labels: Sequence[str], interval_s: float) -> None:
        self.sections = [Section(n, label, interval_s) for n, label in enumerate(labels)]
        self.process_trends = ProcessTrends(PROCESS_SAMPLES)

    def apply(self, number: int, frame: Frame, received_at: float) -> None:
        section = self.sections[number]
        section.apply(frame, received_at)
        snapshot = frame.snapshot
        if snapshot is None:
            return
        prefix = f"{section.label}/"
        labels = device_labels(snapshot)
        samples = [
            (process_key(section.label, labels(p), p.pid), p.memory_used_bytes, p.cpu_pct)
            for p in snapshot.processes
        ]
        self.process_trends.update(received_at, samples)
        self.process_trends.keep_only({key for key, _, _ in samples}, prefix)

    def rows(self, now: float, monotonic_now: float, idle_after_s: float) -> list[Row]:
        """Every section's rows; `now` is the wall time shown (running times)."""
        return [
            row
            for section in self.sections
            for row in section_rows(section, now, monotonic_now, idle_after_s)
        ]


def section_rows(
    section: Section, now: float, monotonic_now: float, idle_after_s: float
) -> list[Row]:
    """The rows of a section's latest frame, idle times from its GPUs' idle clocks."""
    if section.frame is None:
        return []
    idle = {index: trend.idle for index, trend in section.trends.items()}
    return build_rows(
        section.frame,
        idle,
        now,
        idle_after_s,
        idle_now=monotonic_now,
        idle_offset_s=section.wall_offset_s,
    )
