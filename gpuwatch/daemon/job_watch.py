"""The daemon's knowledge of jobs: who holds each GPU, which held GPUs sit idle, and which
jobs held which GPUs when (`JobSightings`, for `job-report` after a job).

One thread of its own asks the job engine (Slurm, or the kubelet's pods) every
`--jobs-refresh`, and once more after the first sample where the first answer lacked
the GPUs (an engine may need them to tell GPUs apart), and sooner when the engine's
change folder changes (slurmd's spool folder: a job step started or ended; one
stat a second, and at most one early question every `EARLY_ASK_GAP_S`), and keeps the
answer. Asking is never done on the poller's thread or a request's: an engine that is
absent, down or hung (its command is killed at its deadline) makes the jobs unknown, with
a reason, and delays nothing else. After each sample the poller feeds the GPUs, with the
jobs known then, to an `AllocatedIdle`, and to the engine (NVML's order of the GPUs); a
request reads one `JobsNow`. Stopping kills a question under way: no scheduler command
outlives the daemon.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping

import msgspec

from gpuwatch.holders import Holders
from gpuwatch.jobs.engines import JobEngine, open_job_reader
from gpuwatch.jobs.job_table import JobTable, NodeJobs
from gpuwatch.jobs.kubelet_places import DEFAULT_SOCKET
from gpuwatch.jobs.sightings import JobSightings
from gpuwatch.models import Snapshot
from gpuwatch.sampling.allocated_idle import AllocatedIdle
from gpuwatch.units import format_duration

log = logging.getLogger("gpuwatch.daemon")

ASK_TIMEOUT_S = 5.0
"""A scheduler command that has not answered by then is killed: the jobs are unknown."""
SPOOL_CHECK_S = 1.0
"""How often the engine's change folder is looked at (one stat)."""
EARLY_ASK_GAP_S = 5.0
"""The least time between two questions to the scheduler when the change folder prompts
the second: each is a full job list from slurmctld, and a node running a step a second
must not turn into a question a second from every node of the cluster."""
STOP_WAIT_S = 2.0
"""How long `stop` waits for the asking thread once its question is killed."""


class JobSettings(msgspec.Struct, frozen=True):
    """The daemon's settings that shape its job reading."""

    engine: str = "auto"
    refresh_s: float = 30.0
    idle_window_s: float = 600.0
    slurm_conf: str | None = None
    node_name: str | None = None
    """The node's name to the scheduler (--node-name), where it is not the host's."""
    keep_s: float = 86400.0
    """How long jobs seen are remembered: the daemon's --history."""
    pod_resources_socket: str = DEFAULT_SOCKET
    """The kubelet's pod-resources socket (--pod-resources-socket)."""


class JobsNow(msgspec.Struct, frozen=True):
    """What one request shows of jobs: the table (`None`: unknown, and `error` says why),
    and the seconds each held GPU has been idle, by uuid (0 for one in use). `reading`:
    whether a scheduler is asked at all (False: `--jobs off`, or none found)."""

    table: JobTable | None
    error: str | None
    idle_window_s: float
    allocated_idle_s: Mapping[str, float] = msgspec.field(default_factory=dict)
    reading: bool = True

    @property
    def known(self) -> bool:
        return self.table is not None

    def holders(self, snapshot: Snapshot) -> Holders:
        """Who holds each of `snapshot`'s devices, as a client reading `/v1/jobs` builds it
        (`NodeJobs.holders`): nothing where no scheduler is read, every device unknown
        while the jobs are."""
        return NodeJobs(self.table, self.error, scheduler=self.reading).holders(snapshot)


NO_JOBS = JobsNow(None, "job reading is off (--jobs off)", 600.0, reading=False)


class JobWatch:
    """Reads jobs on its own thread (`start`, `stop`); `after_sample` is the poller's hook."""

    def __init__(
        self,
        settings: JobSettings,
        open_reader: Callable[[JobSettings], tuple[JobEngine | None, str | None]] | None = None,
    ) -> None:
        self._open_reader = open_reader or _open_reader
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._idle = AllocatedIdle()
        self._thread: threading.Thread | None = None
        self._table: JobTable | None = None
        self._error: str | None = None
        self._sampled = False
        self.sightings = JobSightings(settings.keep_s)
        self._apply(settings)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="gpuwatch-jobs", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Asks no more, kills a question under way, and waits a moment for the thread."""
        self._stop.set()
        self._wake.set()
        if self._reader is not None:
            self._reader.close()
        if self._thread is not None:
            self._thread.join(STOP_WAIT_S)

    def reconfigure(self, settings: JobSettings) -> None:
        """A new reader for new settings (SIGHUP), asked at once; the jobs known stay
        until it answers, so that a reload is no outage."""
        old = self._reader
        with self._lock:
            table, error = self._table, self._error
            self._apply(settings)
            self.sightings.keep_s = settings.keep_s
            if self._reader is not None and old is not None:
                self._table, self._error = table, error
        if old is not None:
            old.close()
        self._wake.set()

    def _apply(self, settings: JobSettings) -> None:
        self.settings = settings
        self._reader, why = self._open_reader(settings)
        self._changes = self._reader.changes_path() if self._reader is not None else None
        self._table, self._error = None, why or "the scheduler has not answered yet"

    def describe(self) -> str:
        """How jobs are read, for the daemon's log."""
        if self._reader is None:
            return f"no jobs: {self._error}"
        return f"{self._reader.describe()} every {format_duration(self.settings.refresh_s)}"

    @property
    def reading(self) -> bool:
        """Whether a scheduler is asked at all."""
        return self._reader is not None

    def after_sample(self, snapshot: Snapshot, sampled_at: float) -> None:
        """Counts idle time of held GPUs in `snapshot`, and tells the engine the GPUs (on
        the poller's thread: no waiting but for the lock, held only to count)."""
        reader = self._reader
        if reader is not None:
            reader.observe(snapshot)
        with self._lock:
            self._idle.update(snapshot.gpus, self._table, sampled_at)
            first, self._sampled = not self._sampled, True
        if first and reader is not None and reader.lacked_gpus():
            self._wake.set()  # asked before the first sample, and it needed the GPUs

    def now(self, snapshot: Snapshot | None) -> JobsNow:
        """The jobs as known now, with the idle time of `snapshot`'s held GPUs."""
        with self._lock:
            table, error, reading = self._table, self._error, self._reader is not None
            idle = self._idle.idle_s(table, snapshot.gpus) if snapshot is not None else {}
        return JobsNow(table, error, self.settings.idle_window_s, idle, reading)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()
            reader, seen = self._reader, _changed_at(self._changes)
            asked_at = time.monotonic()
            if reader is not None:
                self._ask(reader)
            self._wait_for_next(asked_at, seen)

    def _ask(self, reader: JobEngine) -> None:
        pending = reader.start()
        if pending is not None:
            pending.join(reader.timeout_s + 1.0)
        error: str | None
        if pending is not None and pending.is_alive():  # stuck before any command's deadline
            table, error = None, f"the scheduler did not answer within {reader.timeout_s:g}s"
        else:
            table = reader.latest()
            error = None if table is not None else reader.unknown_why()
        if table is not None:
            self.sightings.note(table)
        with self._lock:
            if reader is self._reader:  # not replaced by a reload meanwhile
                self._log_change(table is not None, error)
                self._table, self._error = table, error

    def _log_change(self, known: bool, error: str | None) -> None:
        """Logs jobs becoming known, and an outage after that: a node without a scheduler
        says nothing more after its start (/v1/jobs says why jobs are unknown)."""
        if known and self._table is None:
            log.info("jobs known")
        elif not known and self._table is not None:
            log.warning("jobs unknown: %s", error)

    def _wait_for_next(self, asked_at: float, seen: int | None) -> None:
        """Until the next refresh is due, or a reload or stop; sooner, but no sooner than
        `EARLY_ASK_GAP_S` after the last question, when the change folder changed from
        `seen` (as it was before that question)."""
        due = asked_at + self.settings.refresh_s
        while True:
            left_s = due - time.monotonic()
            if left_s <= 0 or self._wake.wait(min(left_s, SPOOL_CHECK_S)):
                return
            if self._changes is not None and _changed_at(self._changes) != seen:
                due = min(due, asked_at + EARLY_ASK_GAP_S)


def _changed_at(folder: os.PathLike[str] | None) -> int | None:
    """When `folder`'s list of entries last changed (ns), or `None` where it cannot tell."""
    if folder is None:
        return None
    try:
        return os.stat(folder).st_mtime_ns
    except OSError:
        return None


def _open_reader(settings: JobSettings) -> tuple[JobEngine | None, str | None]:
    return open_job_reader(
        settings.engine,
        slurm_conf=settings.slurm_conf,
        node=settings.node_name,
        pod_resources_socket=settings.pod_resources_socket,
        timeout_s=ASK_TIMEOUT_S,
    )
