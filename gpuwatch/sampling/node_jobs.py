"""Who holds each GPU of this node, for a screen: `NodeJobs`, and the readers that give it.

A command that shows GPUs (`status`, the TUI) asks one reader, chosen by `jobs_reader`:

- reading the daemon: the daemon's `/v1/jobs` (its table, and how long each allocated GPU
  has been idle); a daemon without that route (an older one), or one that reads no
  scheduler (`"reading": false`), is passed by: asked as without a daemon;
- else, where `squeue` is on the PATH: this node's Slurm, asked by this process
  (`SlurmJobs`, in a thread, with a deadline), through a small cache file for one-shot
  commands (`jobs_cache`);
- else nothing: a machine without a scheduler shows no job, and no "jobs unknown" either.

`start()` begins asking before the GPUs are read, so that Slurm answers meanwhile;
`read()` gives the answer, never waiting past the deadline. A scheduler that is down or
slow gives a `NodeJobs` whose `unknown_why` says so: never an error, never a wait.
"""

from __future__ import annotations

import math
import os
import shutil
from collections.abc import Callable, Sequence

from gpuwatch.backends.base import Backend
from gpuwatch.backends.daemon_client import fetch_jobs_record
from gpuwatch.errors import DaemonUnavailableError
from gpuwatch.jobs.job_table import MAX_WHY_CHARS, NO_JOBS, Job, NodeJobs, table_from_record
from gpuwatch.jobs.slurm import SlurmJobs
from gpuwatch.jobs.slurm_places import configured_slurm_conf
from gpuwatch.models import GpuSample
from gpuwatch.paths import socket_candidates
from gpuwatch.record_fields import BadRecord
from gpuwatch.sampling.allocated_idle import IDLE_WINDOW_S, AllocatedIdle
from gpuwatch.sampling.jobs_cache import JobsCache
from gpuwatch.units import format_span

ONE_SHOT_DEADLINE_S = 1.0
"""How long a one-shot `gpuwatch status` waits for Slurm at most (counted from before the
GPUs are read: Slurm answers meanwhile)."""
WATCH_DEADLINE_S = 2.0
"""The deadline of each Slurm command for a screen that refreshes (the TUI, `--watch`):
it waits only the first time; later frames show the cached answer."""
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

    def read(self) -> NodeJobs:
        """The jobs now, or why they are unknown; never waits past the reader's deadline."""
        return NO_JOBS

    def close(self) -> None:
        """Stops asking; safe to call twice."""


class SlurmReader(JobsReader):
    """This node's Slurm, asked by this process through `SlurmJobs` (which asks on a thread
    of its own, so that squeue runs while the driver is opened and read).

    `one_shot` (a command that reads once): the answer of the last few seconds is taken
    from `cache` (any process's), and a refresh under way when the command ends is waited
    for a moment, so that a squeue past its deadline is killed, not left running.
    """

    def __init__(
        self,
        slurm: Callable[[], SlurmJobs],
        *,
        deadline_s: float,
        cache: JobsCache | None = None,
        one_shot: bool = False,
    ) -> None:
        self._make_slurm = slurm
        self._slurm: SlurmJobs | None = None
        self._deadline_s = deadline_s
        self._cache = cache
        self._cached: NodeJobs | None = None
        self._one_shot = one_shot

    def start(self) -> None:
        if self._cache is not None and self._cached is None:
            self._cached = self._cache.load()
        if self._cached is None:
            self._reader().start()

    def read(self) -> NodeJobs:
        if (cached := self._cached) is not None:
            self._cached = None  # once: a later read asks Slurm again
            return cached
        slurm = self._reader()
        table = slurm.table()
        why = (
            None if table is not None else _cut(unknown_reason(slurm.last_error, self._deadline_s))
        )
        jobs = NodeJobs(table, why, scheduler=True)
        if self._cache is not None:
            self._cache.store(jobs)
        return jobs

    def close(self) -> None:
        if self._slurm is not None:
            self._slurm.close()
            if self._one_shot:  # the command is about to end
                finish(self._slurm)

    def _reader(self) -> SlurmJobs:
        if self._slurm is None:
            self._slurm = self._make_slurm()
        return self._slurm


def finish(slurm: SlurmJobs, grace_s: float = 0.5) -> None:
    """Waits a moment for a refresh under way (of a closed `slurm`) to end: past its
    deadline it kills the Slurm command, which a process that exits first would leave
    running in its own session."""
    pending = slurm.start()  # closed: starts nothing, returns the refresh under way
    if pending is not None:
        pending.join(grace_s)


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
            return self._fallback.read()
        return jobs_from_daemon(record, scheduler_here=slurm_conf() is not None)

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
        return NodeJobs(None, _cut(unknown_reason(why, None)), scheduler=True)
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


def unknown_reason(error: str | None, deadline_s: float | None) -> str:
    """What the reader's terse reason means to a user."""
    if error == "timeout":
        within = f" within {deadline_s:g}s" if deadline_s is not None else ""
        return f"Slurm did not answer{within}"
    if error == "failed":
        return "squeue and scontrol failed (is slurmctld down?)"
    if error == "absent":
        return "squeue not found"
    return error or "Slurm did not say"


def _cut(text: str) -> str:
    return text if len(text) <= MAX_WHY_CHARS else text[: MAX_WHY_CHARS - 1] + "…"


def slurm_conf() -> str | None:
    """This node's slurm.conf when Slurm's commands are here (`configured_slurm_conf`);
    `None` without squeue on the PATH, or with squeue but no configuration."""
    return configured_slurm_conf(os.environ) if shutil.which("squeue") else None


def jobs_reader(
    source: Backend, *, one_shot: bool, wanted: bool = True, local: JobsReader | None = None
) -> JobsReader:
    """The reader for a command showing `source`'s GPUs: the daemon's, this node's Slurm's,
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
    """For a one-shot command on a Slurm node without a daemon: this node's reader, started
    now, before the driver is opened, so that squeue answers while the GPUs are read. `None`
    where a daemon's socket is there (the daemon will be asked) or no Slurm is."""
    if not wanted or any(os.path.lexists(path) for path in socket_candidates()):
        return None
    reader = _local_reader(one_shot=True)
    if not isinstance(reader, SlurmReader):
        return None
    reader.start()
    return reader


def _local_reader(one_shot: bool) -> JobsReader:
    conf = slurm_conf()
    if conf is None:
        return JobsReader()
    deadline_s = ONE_SHOT_DEADLINE_S if one_shot else WATCH_DEADLINE_S
    gres_conf = os.path.join(os.path.dirname(conf), "gres.conf")

    def slurm() -> SlurmJobs:
        return SlurmJobs(timeout_s=deadline_s, gres_conf=gres_conf)

    cache = JobsCache.for_this_user() if one_shot else None
    return SlurmReader(slurm, deadline_s=deadline_s, cache=cache, one_shot=one_shot)


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
