"""Who holds each GPU of this node, for a screen: `NodeJobs`, and the readers that give it.

A command that shows GPUs (`status`, the TUI) or picks them asks one reader, chosen by
`jobs_reader`:

- reading the daemon: the daemon's `/v1/jobs` (its table, and how long each allocated GPU
  has been idle); a daemon without that route (an older one), or one that reads no
  scheduler (`"reading": false`), is passed by: asked as without a daemon;
- else this node's job engine, as the daemon's `--jobs auto` would choose it (the kubelet
  where its pod-resources socket is visible, else Slurm where `squeue` is on the PATH):
  asked by this process through the one engine interface (`JobEngine`, on the engine's
  own thread, with a deadline), through a small cache file for one-shot commands
  (`jobs_cache`);
- else nothing: a machine without a scheduler shows no job, and no "jobs unknown" either.

`start()` begins asking before the GPUs are read, so that the engine answers meanwhile;
`observe()` hands it the GPUs once read (an engine may need them to tell which GPU is
which: Slurm's `AutoDetect=nvml`, the device plugin's indices), and an answer that
lacked them is asked again; `read()` gives the answer, never
waiting past the deadline. An engine that is down or slow gives a `NodeJobs` whose
`unknown_why` says so: never an error, never a wait.
"""

from __future__ import annotations

import math
import os
import shutil
import threading
import time
from collections.abc import Callable, Sequence

from gpuwatch.backends.base import Backend
from gpuwatch.backends.daemon_client import fetch_jobs_record
from gpuwatch.errors import DaemonUnavailableError
from gpuwatch.jobs.engines import JobEngine, open_job_reader
from gpuwatch.jobs.job_table import (
    MAX_WHY_CHARS,
    NO_JOBS,
    Job,
    JobTable,
    NodeJobs,
    table_from_record,
)
from gpuwatch.jobs.kubelet_places import is_socket, pod_resources_socket
from gpuwatch.jobs.slurm_places import configured_slurm_conf
from gpuwatch.models import GpuSample, Snapshot
from gpuwatch.paths import socket_candidates
from gpuwatch.record_fields import BadRecord
from gpuwatch.sampling.allocated_idle import IDLE_WINDOW_S, AllocatedIdle
from gpuwatch.sampling.jobs_cache import KNOWN_AGE_S, JobsCache
from gpuwatch.units import format_span

ONE_SHOT_DEADLINE_S = 1.0
"""How long a one-shot `gpuwatch status` waits for the engine at most (counted from before
the GPUs are read: it answers meanwhile)."""
WATCH_DEADLINE_S = 2.0
"""The deadline of each question for a screen that refreshes (the TUI, `--watch`): it waits
only the first time; later frames show the latest answer."""
ENDING_GRACE_S = 0.5
"""How long past the deadline an engine is given to end its own question and say why (a
Slurm command it kills, a gRPC call past its deadline)."""
_MAX_GPUS = 1024
_MAX_IDLE_S = 1e10


def with_own_idle(
    jobs: NodeJobs, gpus: Sequence[GpuSample], count: AllocatedIdle, now: float
) -> NodeJobs:
    """`jobs` with the idle time of each held GPU as `count` (fed here with `gpus`, sampled
    at `now`) tells it, for a screen that samples the GPUs itself; unchanged where the
    daemon already said (its count began long before this screen)."""
    if jobs.idle_window_s is not None or not jobs.scheduler:
        return jobs
    count.update(gpus, jobs.table, now)
    if jobs.table is None:
        return jobs
    idle = count.idle_s(jobs.table, gpus)
    return NodeJobs(jobs.table, None, idle, IDLE_WINDOW_S, scheduler=True)


class JobsReader:
    """Gives a `NodeJobs` each time it is read; the base class knows of no scheduler."""

    def start(self) -> None:
        """Begins asking, so that `read` finds the answer ready (call before reading GPUs)."""

    def observe(self, snapshot: Snapshot) -> None:
        """The GPUs just read (call before `read`)."""

    def read(self) -> NodeJobs:
        """The jobs now, or why they are unknown; never waits past the reader's deadline."""
        return NO_JOBS

    def close(self) -> None:
        """Stops asking; safe to call twice."""


class EngineReader(JobsReader):
    """This node's job engine, asked by this process at most every `max_age_s`.

    `one_shot` (a command that reads once): the answer of the last few seconds is taken
    from `cache` (any process's), and a question under way when the command ends is waited
    for a moment, so that a Slurm command past its deadline is killed, not left running.
    """

    def __init__(
        self,
        engine: JobEngine,
        *,
        deadline_s: float,
        cache: JobsCache | None = None,
        one_shot: bool = False,
        max_age_s: float = KNOWN_AGE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._engine = engine
        self._deadline_s = deadline_s
        self._cache = cache
        self._cached: NodeJobs | None = None
        self._one_shot = one_shot
        self._max_age_s = max_age_s
        self._clock = clock
        self._pending: threading.Thread | None = None
        self._asked_at: float | None = None
        self._waits_until: float | None = None
        """Until when a read waits for the answer: the first question's deadline, for the
        first read; later reads show the latest answer."""

    def start(self) -> None:
        if self._cache is not None and self._cached is None and self._asked_at is None:
            self._cached = self._cache.load()
        if self._cached is None:
            self._ask()

    def observe(self, snapshot: Snapshot) -> None:
        self._engine.observe(snapshot)

    def read(self) -> NodeJobs:
        if (cached := self._cached) is not None:
            self._cached = None  # once: a later read asks again
            return cached
        self._ask()
        until, self._waits_until = self._waits_until, None  # only the first read waits
        table, hung = self._answer(until)
        if until is not None and not hung and self._engine.lacked_gpus():
            self._ask(again=True)  # asked before the GPUs were known, which it needed
            table, hung = self._answer(until)
        why = None
        if table is None:
            late = f"the scheduler did not answer within {self._deadline_s:g}s"
            why = _cut(late if hung else self._engine.unknown_why())
        jobs = NodeJobs(table, why, scheduler=True)
        if self._cache is not None:
            self._cache.store(jobs)
        return jobs

    def close(self) -> None:
        self._engine.close()
        pending = self._pending
        if self._one_shot and pending is not None:  # the command is about to end
            pending.join(ENDING_GRACE_S)

    def _ask(self, *, again: bool = False) -> None:
        now = self._clock()
        if not again and self._asked_at is not None and now - self._asked_at < self._max_age_s:
            return
        if self._asked_at is None:
            self._waits_until = now + self._deadline_s + ENDING_GRACE_S
        self._pending, self._asked_at = self._engine.start(), now

    def _answer(self, until: float | None) -> tuple[JobTable | None, bool]:
        """The latest answer, waited for `until` (the first read: the first question's
        deadline and a grace for the engine to end it and say why); and whether the
        question is still under way past that."""
        pending = self._pending
        if pending is not None and until is not None:
            pending.join(max(0.0, until - self._clock()))
        hung = until is not None and pending is not None and pending.is_alive()
        return self._engine.latest(), hung


class DaemonReader(JobsReader):
    """The `/v1/jobs` of the daemon at `socket_path`; `fallback` (asked as without a daemon)
    when it has none."""

    def __init__(
        self, socket_path: str, fallback: Callable[[], JobsReader], timeout_s: float = 1.0
    ) -> None:
        self._socket_path = socket_path
        self._timeout_s = timeout_s
        self._make_fallback = fallback
        self._fallback: JobsReader | None = None
        self._snapshot: Snapshot | None = None

    def observe(self, snapshot: Snapshot) -> None:
        self._snapshot = snapshot  # for the fallback, should the daemon not read jobs
        if self._fallback is not None:
            self._fallback.observe(snapshot)

    def read(self) -> NodeJobs:
        if self._fallback is not None:
            return self._fallback.read()
        try:
            record = fetch_jobs_record(self._socket_path, self._timeout_s)
        except (OSError, ValueError, DaemonUnavailableError) as error:
            return NodeJobs(None, _cut(f"the daemon did not say ({error})"), scheduler=True)
        if record is None or record.get("reading") is False:
            # an older daemon, or one reading no scheduler (none on its PATH, --jobs off):
            # ask as without a daemon, from now on
            self._fallback = self._make_fallback()
            self._fallback.start()
            if self._snapshot is not None:
                self._fallback.observe(self._snapshot)
            return self._fallback.read()
        return jobs_from_daemon(record, scheduler_here=scheduler_here())

    def close(self) -> None:
        if self._fallback is not None:
            self._fallback.close()


def jobs_from_daemon(record: dict[str, object], *, scheduler_here: bool) -> NodeJobs:
    """The `NodeJobs` of a `/v1/jobs` answer, every field checked (another user's daemon
    could send anything). A daemon that cannot read jobs, on a node where this user has no
    scheduler either, has nothing to show."""
    try:
        table = table_from_record(record)
    except BadRecord as error:
        return NodeJobs(None, _cut(f"the daemon's answer is malformed ({error})"), scheduler=True)
    idle = _idle_map(record.get("allocated_idle_s"))
    window = _seconds(record.get("idle_window_s"))
    if table is None:
        said = record.get("error")
        why = said if isinstance(said, str) and said.isprintable() and said else None
        if why in (None, "absent") and not scheduler_here:
            return NO_JOBS
        return NodeJobs(None, _cut(unknown_reason(why)), scheduler=True)
    return NodeJobs(table, None, idle, window if window else None, True)


def _seconds(value: object) -> float | None:
    """A count of seconds in range; `None` for anything else (NaN, a boolean, text)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and 0 <= value < _MAX_IDLE_S else None


def _idle_map(value: object) -> dict[str, float]:
    """`{uuid: seconds}`, keeping only entries of the right type and range."""
    if not isinstance(value, dict) or len(value) > _MAX_GPUS:
        return {}
    return {
        uuid: checked
        for uuid, seconds in value.items()
        if isinstance(uuid, str)
        and uuid.isprintable()
        and len(uuid) <= 96
        and (checked := _seconds(seconds)) is not None
    }


def unknown_reason(error: str | None) -> str:
    """A daemon's reason for unknown jobs, in words: an older daemon sent terse codes."""
    if error == "timeout":
        return "Slurm did not answer"
    if error == "failed":
        return "squeue and scontrol failed (is slurmctld down?)"
    if error == "absent":
        return "squeue not found"
    return error or "the daemon did not say"


def _cut(text: str) -> str:
    return text if len(text) <= MAX_WHY_CHARS else text[: MAX_WHY_CHARS - 1] + "…"


def slurm_conf() -> str | None:
    """This node's slurm.conf when Slurm's commands are here (`configured_slurm_conf`);
    `None` without squeue on the PATH, or with squeue but no configuration."""
    return configured_slurm_conf(os.environ) if shutil.which("squeue") else None


def scheduler_here() -> bool:
    """Whether this process could ask a job engine of this node itself: the kubelet's
    pod-resources socket is visible to it, or Slurm is here (`slurm_conf`)."""
    return is_socket(pod_resources_socket(os.environ)) or slurm_conf() is not None


def jobs_reader(
    source: Backend, *, one_shot: bool, wanted: bool = True, local: JobsReader | None = None
) -> JobsReader:
    """The reader for a command showing `source`'s GPUs: the daemon's, this node's engine's,
    or none; `one_shot` for a command that reads once (a shorter deadline and the cache).
    `local` is this node's reader if `early_reader` started one."""
    if not wanted:
        return JobsReader()
    socket_path = getattr(source, "socket_path", None)  # the daemon's, or the auto backend's
    if isinstance(socket_path, str):
        if local is not None:  # a daemon came up since: it answers instead
            local.close()
        return DaemonReader(socket_path, lambda: _local_reader(one_shot))
    return local if local is not None else _local_reader(one_shot)


def early_reader(*, wanted: bool = True) -> JobsReader | None:
    """For a one-shot command on a node with a job engine and no daemon: this node's reader,
    started now, before the driver is opened, so that the engine answers while the GPUs are
    read. `None` where a daemon's socket is there (the daemon will be asked) or no engine is."""
    if not wanted or any(os.path.lexists(path) for path in socket_candidates()):
        return None
    reader = _local_reader(one_shot=True)
    if not isinstance(reader, EngineReader):
        return None
    reader.start()
    return reader


def _local_reader(one_shot: bool) -> JobsReader:
    deadline_s = ONE_SHOT_DEADLINE_S if one_shot else WATCH_DEADLINE_S
    socket_path = pod_resources_socket(os.environ)
    engine, _ = open_job_reader("auto", pod_resources_socket=socket_path, timeout_s=deadline_s)
    if engine is None:
        return JobsReader()
    cache = JobsCache.for_this_user() if one_shot else None
    return EngineReader(engine, deadline_s=deadline_s, cache=cache, one_shot=one_shot)


def time_left_text(job: Job, now: float) -> str:
    """`2:13:05 left`, `1-04:00:00 left` (Slurm's day notation), `no time limit`; empty
    when the start or the limit is not known."""
    if job.time_limit_s is None:
        return "no time limit" if job.started_at is not None else ""
    seconds = job.time_left_s(now)
    if seconds is None:
        return ""
    whole = int(seconds)
    days, rest = divmod(whole, 86400)
    clock = f"{rest // 3600}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{clock:0>8} left" if days else f"{clock} left"


def idle_text(seconds: float) -> str:
    """`allocated, idle 45s` / `12m` / `3h05m` / `2d04h`."""
    return f"allocated, idle {format_span(seconds)}"
