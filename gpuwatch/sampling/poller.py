"""The daemon's sampling of a backend at a steady interval (`Poller`), into a bounded
history; a command's is `gpuwatch.sampling.ticks.watch`."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable

import msgspec

from gpuwatch.backends.base import Backend
from gpuwatch.gpu_history import GpuSeries
from gpuwatch.models import Snapshot
from gpuwatch.sampling.history import History
from gpuwatch.sampling.ticks import ticks

log = logging.getLogger("gpuwatch.sampling")


class PollState(msgspec.Struct, frozen=True):
    """What the poller knows now. `error` says why the last attempt to sample failed."""

    snapshot: Snapshot | None
    error: str | None
    attempted_at: float
    """`time.monotonic()` when the last attempt finished, failed or not."""
    samples: int
    sampled_at: float = 0.0
    """`time.monotonic()` when `snapshot` was taken: its age, whatever the wall clock does."""

    @property
    def attempted(self) -> bool:
        """Whether a first attempt to sample has finished, failed or not."""
        return self.samples > 0 or self.error is not None


class Poller:
    """Samples a backend every `interval_s` on its own thread; keeps the latest and a history.

    It never stops on a fault: a failing GPU is reported in its sample, and a
    backend that fails as a whole (a driver reloaded under it) is reported in
    `state.error`, closed, and opened afresh at the next tick. A slow driver
    call delays the samples, never the readers: they get the latest snapshot.

    `after_sample`, when given, is called on the poller's thread with each snapshot and
    the `time.monotonic()` it was taken at: something fed by every sample (it must be
    quick and never wait: the next sample waits for it). A fault of it is logged and
    leaves the sample, and the backend, alone.
    """

    def __init__(
        self,
        open_source: Callable[[], Backend],
        interval_s: float,
        history_s: float,
        *,
        after_sample: Callable[[Snapshot, float], None] | None = None,
    ) -> None:
        self._open_source = open_source
        self._after_sample = after_sample
        self._source: Backend | None = open_source()  # a failure here is the caller's to report
        self.interval_s = interval_s
        self.history_s = history_s
        self.state = PollState(None, None, time.monotonic(), 0)
        self._history: History | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._reopen = False
        self._thread: threading.Thread | None = None

    @property
    def history_capacity(self) -> int:
        return max(1, math.ceil(self.history_s / self.interval_s))

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="gpuwatch-poller", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 1.0) -> None:
        """Stops sampling and closes the backend (unless a stuck driver call holds it)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                return  # stuck in the driver: the process exit will end it
        if self._source is not None:
            self._source.close()

    def reconfigure(self, interval_s: float, history_s: float) -> None:
        """Takes a new interval and retention, keeping the history that still fits."""
        with self._lock:
            self.interval_s, self.history_s = interval_s, history_s
            if self._history is not None and self._history.capacity != self.history_capacity:
                self._history = self._history.resized(self.history_capacity)
        self._wake.set()

    def reopen(self) -> None:
        """Closes the backend and opens it afresh before the next sample."""
        self._reopen = True
        self._wake.set()

    @property
    def stalled_s(self) -> float | None:
        """How long sampling has made no progress, when that is far longer than an interval
        (a driver call that hangs); `None` while it works."""
        idle_s = time.monotonic() - self.state.attempted_at
        return idle_s if idle_s > max(5 * self.interval_s, 10.0) else None

    def history_since(self, start: float, limit: int) -> tuple[list[GpuSeries], bool]:
        """Each GPU's samples since `start` (`time.monotonic()`), the newest `limit` at most;
        and whether older ones were left out."""
        with self._lock:  # only the copy is made under the lock; the sampler waits for no JSON
            if self._history is None:
                return [], False
            window = self._history.window(start, limit)
        return window.series(), window.truncated

    def history_size(self) -> tuple[int, int, int]:
        """(samples held, capacity, bytes allocated)."""
        with self._lock:
            if self._history is None:
                return 0, self.history_capacity, 0
            return len(self._history), self._history.capacity, self._history.nbytes

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()
            for _ in ticks(self.interval_s, sleep=self._wake.wait):
                if self._stop.is_set() or self._wake.is_set():
                    break  # stopping, or new settings: start a fresh schedule
                try:
                    self._sample_once()
                except Exception as error:  # the poller outlives any fault; it is reported
                    self.state = PollState(
                        self.state.snapshot,
                        f"{type(error).__name__}: {error}",
                        time.monotonic(),
                        self.state.samples,
                        self.state.sampled_at,
                    )
                    self._reopen = True

    def _sample_once(self) -> None:
        if self._reopen or self._source is None:
            self._reopen = False
            if self._source is not None:
                self._source.close()
                self._source = None
            self._source = self._open_source()
        snapshot = self._source.sample()
        sampled_at = time.monotonic()
        with self._lock:
            if self._history is None or self._history.gpu_count != len(snapshot.gpus):
                self._history = History(self.history_capacity, len(snapshot.gpus))
            self._history.append(snapshot, sampled_at)
        self.state = PollState(snapshot, None, sampled_at, self.state.samples + 1, sampled_at)
        if self._after_sample is not None:
            try:
                self._after_sample(snapshot, sampled_at)
            except Exception:  # not the driver's fault: no reopening, no failed sample
                log.exception("after a sample")
