"""The sources of `gpuwatch tui`'s frames: a backend on this machine, or `gpuwatch status`
streamed over ssh from another.

A `Source` runs on a worker thread, never on the UI thread: a driver call
that hangs blocks only that thread, and the screen says how long it has had
no sample. Nothing here imports Textual.
"""

from __future__ import annotations

import abc
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import psutil

from gpuwatch.backends import remote_snapshots
from gpuwatch.backends.base import Backend
from gpuwatch.errors import GpuwatchError
from gpuwatch.gpu_history import GpuSeries
from gpuwatch.hostinfo import read_lineage
from gpuwatch.jobs.job_table import NodeJobs
from gpuwatch.leases.directory import LeaseDir, user_name
from gpuwatch.models import Lease, Snapshot
from gpuwatch.reports.training import TrainingReports
from gpuwatch.request import Waiter
from gpuwatch.sampling.allocated_idle import AllocatedIdle
from gpuwatch.sampling.node_jobs import JobsReader, with_own_idle
from gpuwatch.sampling.ticks import ticks
from gpuwatch.tui.common.frames import NO_TRAINING, Ancestor, Backfill, Frame, HostStats

HISTORY_WINDOW_S = 3600.0
"""How far back the daemon's history is asked for: the graphs and the idle detection."""
TRAINING_READ_EVERY_S = 1.0
"""Training reports are read at most this often (frames in between carry the last read)."""


class Source(abc.ABC):
    """Where one section of the screen gets its frames. Used from one worker thread."""

    label: str
    """The section's name: the machine's host name or the `--host` given."""
    tree: bool = False
    """Read each process's ancestors too (set while the tree view is shown); a source that
    cannot read them leaves them out."""

    def backfill(self) -> Backfill:
        """Samples from before now, when the source keeps any (read once, at start)."""
        return Backfill(self.label, note="from this screen's samples")

    @abc.abstractmethod
    def frames(self, interval_s: float, stop: threading.Event) -> Iterator[Frame]:
        """Frames, one per `interval_s`, until `stop` is set; never raises."""

    def close(self) -> None:  # noqa: B027 - most sources hold nothing
        """Releases what the source holds. Safe to call twice."""


class HostStatsReader:
    """This machine's CPU (since the previous call), memory, swap and load, through psutil.

    The first call gives the CPU's average since boot; later ones, since the call before
    (as `top`)."""

    def __init__(self) -> None:
        self._cpu_s = (0.0, 0.0)

    def __call__(self) -> HostStats:
        times = psutil.cpu_times()
        # Busy is all but idle and iowait, as `top` counts; guest time is inside user and nice.
        total = sum(times) - times.guest - times.guest_nice
        busy = total - times.idle - times.iowait
        busy_before, total_before = self._cpu_s
        self._cpu_s = (busy, total)
        elapsed = total - total_before
        memory, swap = psutil.virtual_memory(), psutil.swap_memory()
        load = os.getloadavg()
        return HostStats(
            cpu_pct=round(100.0 * (busy - busy_before) / elapsed, 1) if elapsed > 0 else 0.0,
            cpu_count=os.cpu_count() or 1,
            memory_used_bytes=memory.total - memory.available,
            memory_total_bytes=memory.total,
            swap_used_bytes=swap.used,
            swap_total_bytes=swap.total,
            load_1m=load[0],
            load_5m=load[1],
            load_15m=load[2],
        )


read_host_stats = HostStatsReader()
"""The reader local sources use unless told otherwise."""


@dataclass
class LocalSource(Source):
    """A backend on this machine (daemon, NVML or simulated), its leases and waiting jobs."""

    backend: Backend
    lease_dir: LeaseDir | None = None
    host_stats: Callable[[], HostStats | None] | None = read_host_stats
    label: str = ""
    tree: bool = False
    """Read each process's ancestors too (set while the tree view is shown)."""
    training: Callable[[], TrainingReports] | None = None
    """Where the training reports of this machine come from, if the screen shows them."""
    jobs: JobsReader | None = None
    """Who to ask which job holds each GPU: asked on this source's thread, after the GPUs,
    with a deadline (and the cached answer on later frames), so Slurm never holds the screen."""
    monotonic: Callable[[], float] = time.monotonic
    """The clock of idle times this source counts itself: a wall clock stepped back or
    forward must not stretch them."""
    _closed: bool = field(default=False, repr=False)
    _idle: AllocatedIdle = field(default_factory=AllocatedIdle, repr=False)
    """How long each held GPU has been idle, counted from this screen's own samples where
    no daemon counts it."""
    _training_found: TrainingReports = field(default=NO_TRAINING, repr=False)
    _training_read_at: float | None = field(default=None, repr=False)

    def backfill(self) -> Backfill:
        """The backend's history, where it keeps one (the daemon's, also behind `auto`)."""
        try:
            series = self.backend.history(HISTORY_WINDOW_S)
        except (OSError, ValueError, GpuwatchError) as error:
            return Backfill(self.label, note=f"daemon history unavailable ({error})")
        if series is None:
            return super().backfill()
        return Backfill(self.label, tuple(series), note=_span_note(series))

    def frames(self, interval_s: float, stop: threading.Event) -> Iterator[Frame]:
        for _ in ticks(interval_s, sleep=stop.wait):
            if stop.is_set():
                return
            yield self.read()

    def read(self) -> Frame:
        """One frame now; a failure becomes the frame's `error`."""
        if self.jobs is not None:
            self.jobs.start()  # Slurm answers while the GPUs are read
        try:
            snapshot = self.backend.sample()
        except Exception as failure:  # a driver that fails as a whole: say so, keep going
            return Frame(self.label, None, error=_describe(failure), host=self._host())
        label = self.label or snapshot.hostname
        leases: tuple[Lease, ...] = ()
        waiters: tuple[Waiter, ...] = ()
        error: str | None = None
        if self.lease_dir is not None:
            try:
                leases = tuple(self.lease_dir.leases())
                waiters = tuple(self.lease_dir.waiting_before(None))
            except GpuwatchError as failure:
                error = f"leases unreadable: {failure}"
        ancestors: tuple[Ancestor, ...] = ()
        if self.tree:
            pids = {p.pid for p in snapshot.processes} | {lease.pid for lease in leases}
            ancestors = read_ancestors(pids)
        return Frame(
            label,
            snapshot,
            leases,
            waiters,
            self._host(),
            error,
            ancestors=ancestors,
            training=self._training(),
            jobs=self._jobs(snapshot),
        )

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.backend.close()
            if self.jobs is not None:
                self.jobs.close()

    def _jobs(self, snapshot: Snapshot) -> NodeJobs | None:
        if self.jobs is None:
            return None
        try:
            self.jobs.observe(snapshot)  # an engine may need them to tell GPUs apart
            jobs = self.jobs.read()
        except Exception as error:  # the jobs are a nicety: say why they are missing
            return NodeJobs(None, f"reading jobs failed: {_describe(error)}", scheduler=True)
        return with_own_idle(jobs, snapshot.gpus, self._idle, self.monotonic())

    def _training(self) -> TrainingReports:
        """The latest training reports, read again once `TRAINING_READ_EVERY_S` has passed."""
        now = time.monotonic()
        if self.training is None:
            return NO_TRAINING
        if self._training_read_at is not None and now - self._training_read_at < (
            TRAINING_READ_EVERY_S
        ):
            return self._training_found
        self._training_read_at = now
        try:
            self._training_found = self.training()
        except Exception:  # an unreadable directory shows as no training, never a crash
            self._training_found = NO_TRAINING
        return self._training_found

    def _host(self) -> HostStats | None:
        try:
            return self.host_stats() if self.host_stats is not None else None
        except Exception:  # host statistics are a nicety: their absence is shown as "-"
            return None


@dataclass
class RemoteSource(Source):
    """Another machine, through `gpuwatch status --json --watch` over ssh; reconnects."""

    label: str
    backend: str | None = None
    sim: str | None = None
    retry_s: float = 5.0

    def frames(self, interval_s: float, stop: threading.Event) -> Iterator[Frame]:
        while not stop.is_set():
            try:
                stream = remote_snapshots(
                    self.label,
                    interval_s=interval_s,
                    count=None,
                    backend=self.backend,
                    sim=self.sim,
                )
                for snapshot, leases in stream:
                    yield Frame(self.label, snapshot, tuple(leases), local=False)
                    if stop.is_set():
                        return
                error = "the remote stream ended"
            except Exception as failure:  # unreachable, no gpuwatch there, garbled output
                error = _describe(failure)
            yield Frame(
                self.label, None, error=f"{error}; retrying in {self.retry_s:g}s", local=False
            )
            stop.wait(self.retry_s)


def read_ancestors(pids: set[int], limit: int = 4096) -> tuple[Ancestor, ...]:
    """Each of `pids` and its ancestors below init; unreadable ones are left out."""
    lineage = read_lineage(pids, limit)
    return tuple(Ancestor(link.pid, link.ppid, user_name(link.uid), link.name) for link in lineage)


def _span_note(series: Sequence[GpuSeries]) -> str:
    times = series[0].taken_at if series else []
    if len(times) < 2:
        return "daemon has no history yet"
    minutes = (times[-1] - times[0]) / 60
    return f"from the daemon's history ({minutes:.0f} min)"


def _describe(error: BaseException) -> str:
    return str(error) if isinstance(error, GpuwatchError) else f"{type(error).__name__}: {error}"
