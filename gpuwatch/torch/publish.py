"""Publishing a watch's reports without ever holding training up.

The training thread only appends each step's record to a bounded deque (one
atomic append; when the sender has fallen behind, the oldest record is dropped
and counted). A background thread wakes a few times a second, takes what is
there, and writes one report file (`gpuwatch.reports.training.ReportFile`). Readers
open that file on their own schedule: a reader that is slow, stops, or never
existed changes nothing for the writer. A lease directory that cannot be
written turns publishing off with one notice; training goes on.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import NamedTuple

from gpuwatch.errors import LeaseError
from gpuwatch.reports.training import MAX_POINTS, MemoryPoint, ReportFile, TrainingReport
from gpuwatch.torch.stats import AllocatorStats

PUBLISH_INTERVAL_S = 0.25
"""At most four reports a second: enough for a live view, nothing for the file system."""
NVML_INTERVAL_S = 2.0
QUEUE_LENGTH = 1024


class StepRecord(NamedTuple):
    """What the training thread hands over at the end of each step (a tuple: cheap to build)."""

    step: int
    step_time_s: float
    stats: AllocatorStats | None


class StepQueue:
    """A bounded hand-over from the training thread: appends never block or fail."""

    def __init__(self, length: int = QUEUE_LENGTH) -> None:
        self._items: deque[StepRecord] = deque(maxlen=length)
        self.dropped = 0

    def put(self, record: StepRecord) -> None:
        if len(self._items) == self._items.maxlen:
            self.dropped += 1  # the deque drops the oldest itself
        self._items.append(record)

    def take_all(self) -> list[StepRecord]:
        taken = []
        while True:
            try:
                taken.append(self._items.popleft())
            except IndexError:
                return taken


ReportBuilder = Callable[[StepRecord, tuple[MemoryPoint, ...], int | None], TrainingReport]
"""Builds the report from the latest step, the recent series and the driver's figure."""


class Sender:
    """The background thread that turns queued steps into a published report."""

    def __init__(
        self,
        queue: StepQueue,
        build: ReportBuilder,
        *,
        process_memory: Callable[[], int | None] | None = None,
        lease_dir: str | None = None,
        interval_s: float = PUBLISH_INTERVAL_S,
    ) -> None:
        self._queue = queue
        self._build = build
        self._process_memory = process_memory
        self._lease_dir = lease_dir
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._lock = threading.Lock()  # the thread and flush() publish in turn
        self._file: ReportFile | None = None
        self._recent: deque[MemoryPoint] = deque(maxlen=MAX_POINTS)
        self._latest: StepRecord | None = None
        self._nvml: tuple[float, int | None] = (-NVML_INTERVAL_S, None)
        self.published = 0
        self.failed = 0
        self._thread = threading.Thread(target=self._run, name="gpuwatch-torch", daemon=True)

    @property
    def path(self) -> str | None:
        return self._file.path if self._file is not None else None

    def start(self) -> None:
        self._thread.start()

    def flush(self) -> None:
        """Publishes what is queued now, from the calling thread (tests, and at close)."""
        self._publish_pending()

    def close(self, timeout_s: float = 5.0) -> None:
        """Stops the thread, then removes the report: the watch is over."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        with self._lock:
            if self._file is not None:
                self._file.close()

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self._publish_pending()
            except Exception as error:  # the thread must outlive any one bad report
                self._failed(error)

    def _publish_pending(self) -> None:
        with self._lock:
            self._publish_locked()

    def _publish_locked(self) -> None:
        records = self._queue.take_all()
        if not records:
            return
        self._latest = latest = records[-1]
        if latest.stats is not None:
            stats = latest.stats
            self._recent.append(
                MemoryPoint(
                    latest.step,
                    stats.allocated_bytes,
                    stats.reserved_bytes,
                    max(r.stats.allocated_peak_bytes for r in records if r.stats is not None),
                    stats.inactive_split_bytes,
                )
            )
        report = self._build(latest, tuple(self._recent), self._driver_figure())
        self._write(report)

    def _driver_figure(self) -> int | None:
        if self._process_memory is None:
            return None
        read_at, value = self._nvml
        if time.monotonic() - read_at >= NVML_INTERVAL_S:
            try:
                value = self._process_memory()
            except Exception:  # the driver's view is a bonus: never a reason to stop
                value = None
            self._nvml = (time.monotonic(), value)
        return value

    def _write(self, report: TrainingReport) -> None:
        try:
            if self._file is None:
                self._file = ReportFile(self._lease_dir)
            self._file.publish(report)
            self.published += 1
        except (LeaseError, OSError) as error:
            self._failed(error)

    def _failed(self, error: Exception) -> None:
        self.failed += 1
        if self.failed == 1:
            sys.stderr.write(f"gpuwatch.torch: cannot publish reports: {error}\n")
