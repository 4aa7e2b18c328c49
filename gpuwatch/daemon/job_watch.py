"""The daemon's knowledge of jobs: who holds each GPU, and which held GPUs sit idle.

One thread of its own asks the scheduler every `--jobs-refresh`, and sooner when slurmd's
spool folder changes (a job step started or ended there; one stat a second, and at most one
early question every `EARLY_ASK_GAP_S`), and keeps the answer. Asking is never done on the
poller's thread or a request's: a scheduler that is absent, down or hung (its command is
killed at its deadline) makes the jobs unknown, with a reason, and delays nothing else.
After each sample the poller feeds the GPUs, with the jobs known then, to an
`AllocatedIdle`; a request reads one `JobsNow`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from gpuwatch.jobs import JobTable, SlurmJobs
from gpuwatch.jobs.engines import open_job_reader, slurmd_spool_dir
from gpuwatch.models import Snapshot
from gpuwatch.sampling.allocated_idle import AllocatedIdle
from gpuwatch.units import format_duration

log = logging.getLogger("gpuwatch.daemon")

ASK_TIMEOUT_S = 5.0
"""A Slurm command that has not answered by then is killed: the jobs are unknown."""
SPOOL_CHECK_S = 1.0
"""How often slurmd's spool folder is looked at (one stat)."""
EARLY_ASK_GAP_S = 5.0
"""The least time between two questions to Slurm when the spool folder prompts the second:
each is a full job list from slurmctld, and a node running a step a second must not turn
into a question a second from every node of the cluster."""
_REASONS = {
    "absent": "squeue is not found",
    "failed": "squeue and scontrol failed (is slurmctld down?)",
    "timeout": f"Slurm did not answer within {ASK_TIMEOUT_S:g}s",
}


@dataclass(frozen=True, slots=True)
class JobSettings:
    """The daemon's settings that shape its job reading."""

    engine: str = "auto"
    refresh_s: float = 30.0
    idle_window_s: float = 600.0
    slurm_conf: str | None = None


@dataclass(frozen=True, slots=True)
class JobsNow:
    """What one request shows of jobs: the table (`None`: unknown, and `error` says why),
    and the seconds each held GPU has been idle, by uuid (0 for one in use). `reading`:
    whether a scheduler is asked at all (False: `--jobs off`, or none found)."""

    table: JobTable | None
    error: str | None
    idle_window_s: float
    allocated_idle_s: Mapping[str, float] = field(default_factory=dict)
    reading: bool = True

    @property
    def known(self) -> bool:
        return self.table is not None


NO_JOBS = JobsNow(None, "job reading is off (--jobs off)", 600.0, reading=False)


class JobWatch:
    """Reads jobs on its own thread (`start`, `stop`); `after_sample` is the poller's hook."""

    def __init__(
        self,
        settings: JobSettings,
        open_reader: Callable[[JobSettings], tuple[SlurmJobs | None, str | None]] | None = None,
    ) -> None:
        self._open_reader = open_reader or _open_reader
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._idle = AllocatedIdle()
        self._thread: threading.Thread | None = None
        self._table: JobTable | None = None
        self._error: str | None = None
        self._apply(settings)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="gpuwatch-jobs", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Asks no more; a question under way ends on its deadline."""
        self._stop.set()
        self._wake.set()
        if self._reader is not None:
            self._reader.close()

    def reconfigure(self, settings: JobSettings) -> None:
        """A new reader for new settings (SIGHUP), asked at once; the jobs known stay
        until it answers, so that a reload is no outage."""
        old = self._reader
        with self._lock:
            table, error = self._table, self._error
            self._apply(settings)
            if self._reader is not None and old is not None:
                self._table, self._error = table, error
        if old is not None:
            old.close()
        self._wake.set()

    def _apply(self, settings: JobSettings) -> None:
        self.settings = settings
        self._reader, why = self._open_reader(settings)
        self._spool = slurmd_spool_dir(self._reader) if self._reader is not None else None
        self._table, self._error = None, why or "Slurm has not answered yet"

    def describe(self) -> str:
        """How jobs are read, for the daemon's log."""
        if self._reader is None:
            return f"no jobs: {self._error}"
        return f"jobs from Slurm every {format_duration(self.settings.refresh_s)}"

    def after_sample(self, snapshot: Snapshot, sampled_at: float) -> None:
        """Counts idle time of held GPUs in `snapshot` (on the poller's thread: no waiting
        but for the lock, held only to count)."""
        with self._lock:
            self._idle.update(snapshot.gpus, self._table, sampled_at)

    def now(self, snapshot: Snapshot | None) -> JobsNow:
        """The jobs as known now, with the idle time of `snapshot`'s held GPUs."""
        with self._lock:
            table, error, reading = self._table, self._error, self._reader is not None
            idle = self._idle.idle_s(table, snapshot.gpus) if snapshot is not None else {}
        return JobsNow(table, error, self.settings.idle_window_s, idle, reading)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()
            reader, seen = self._reader, _changed_at(self._spool)
            asked_at = time.monotonic()
            if reader is not None:
                self._ask(reader)
            self._wait_for_next(asked_at, seen)

    def _ask(self, reader: SlurmJobs) -> None:
        pending = reader.start()
        if pending is not None:
            pending.join(reader.timeout_s + 1.0)
        error: str | None
        if pending is not None and pending.is_alive():  # stuck before any command's deadline
            table, error = None, _REASONS["timeout"]
        else:
            table = reader.latest()
            error = None if table is not None else _reason(reader.last_error)
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
        `EARLY_ASK_GAP_S` after the last question, when slurmd's spool folder changed from
        `seen` (as it was before that question)."""
        due = asked_at + self.settings.refresh_s
        while True:
            left_s = due - time.monotonic()
            if left_s <= 0 or self._wake.wait(min(left_s, SPOOL_CHECK_S)):
                return
            if self._spool is not None and _changed_at(self._spool) != seen:
                due = min(due, asked_at + EARLY_ASK_GAP_S)


def _changed_at(folder: Path | None) -> int | None:
    """When `folder`'s list of entries last changed (ns), or `None` where it cannot tell."""
    if folder is None:
        return None
    try:
        return os.stat(folder).st_mtime_ns
    except OSError:
        return None


def _reason(code: str | None) -> str:
    if code is None:
        return "Slurm has not answered yet"
    return _REASONS.get(code, code)


def _open_reader(settings: JobSettings) -> tuple[SlurmJobs | None, str | None]:
    return open_job_reader(settings.engine, slurm_conf=settings.slurm_conf, timeout_s=ASK_TIMEOUT_S)
