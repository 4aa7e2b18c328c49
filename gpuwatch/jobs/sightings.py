"""What the daemon remembers of the jobs it saw on this node's GPUs: which GPUs each job
held, and when it was seen, for as long as the daemon keeps its history. It is what
`gpuwatch job-report` reads once the scheduler has forgotten a job's GPUs (Slurm drops
them when the job ends). Engine-blind: it keeps `Job`s, whoever told them.

A job is seen at each read of the jobs that shows it; `gone_at` is the first read after
that which did not: it ended in between.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from typing import Any

from gpuwatch.jobs.job_table import MAX_GPUS_PER_NODE, MAX_JOB_ID_CHARS, JobTable
from gpuwatch.record_fields import BadRecord, float_field, list_field, optional, text_field

MAX_JOBS_KEPT = 100_000
"""The oldest are forgotten first beyond this many (a node running a job a second for a
day keeps the day)."""
_MAX_MINOR = 1 << 20
_MAX_TIME = 1e11


@dataclass(frozen=True, slots=True)
class Sighting:
    """One job as the daemon saw it on this node."""

    job_id: str
    user: str | None
    name: str | None
    gpu_minor_numbers: tuple[int, ...]
    """Every GPU it was seen holding here, by device-file minor number."""
    started_at: float | None
    """When it started, as the scheduler said (Unix time)."""
    time_limit_s: float | None
    first_seen_at: float
    last_seen_at: float
    """The last read of the jobs that showed it."""
    gone_at: float | None = None
    """The first read after `last_seen_at` that did not show it; `None` while it runs."""


class JobSightings:
    """Sightings of the last `keep_s` seconds, safe to share between threads."""

    def __init__(self, keep_s: float) -> None:
        self.keep_s = keep_s
        self._lock = threading.Lock()
        self._jobs: dict[str, Sighting] = {}
        self._since: float | None = None

    @property
    def since(self) -> float | None:
        """When the memory begins: the first read of the jobs noted (or the oldest kept)."""
        with self._lock:
            return self._since

    def note(self, table: JobTable) -> None:
        """A read of the jobs (`table.read_at`): jobs shown are seen, jobs not shown are gone."""
        at = table.read_at
        with self._lock:
            if self._since is None:
                self._since = at
            shown = {job.job_id for job in table.jobs}
            for job_id, seen in self._jobs.items():
                if job_id not in shown and seen.gone_at is None:
                    self._jobs[job_id] = replace(seen, gone_at=at)
            for job in table.jobs:
                before = self._jobs.pop(job.job_id, None)
                minors = set(job.gpu_minor_numbers)
                if before is not None and before.gone_at is None:
                    minors |= set(before.gpu_minor_numbers)
                first = (
                    before.first_seen_at if before is not None and before.gone_at is None else at
                )
                self._jobs[job.job_id] = Sighting(
                    job.job_id,
                    job.user,
                    job.name,
                    tuple(sorted(minors)),
                    job.started_at,
                    job.time_limit_s,
                    first,
                    at,
                )
            self._forget(at)

    def seen(self, job_id: str) -> Sighting | None:
        """The job's sighting, if it was seen within the memory."""
        with self._lock:
            return self._jobs.get(job_id)

    def _forget(self, now: float) -> None:
        """Drops sightings older than `keep_s` (by their last sighting), and the oldest
        beyond `MAX_JOBS_KEPT`; the memory then begins where the oldest kept one does."""
        horizon = now - self.keep_s
        kept = {k: v for k, v in self._jobs.items() if v.last_seen_at >= horizon}
        if len(kept) > MAX_JOBS_KEPT:
            newest = sorted(kept.values(), key=lambda s: s.last_seen_at)[-MAX_JOBS_KEPT:]
            kept = {s.job_id: s for s in newest}
        if len(kept) < len(self._jobs) and self._since is not None:
            self._since = max(self._since, horizon)
        self._jobs = kept


def sighting_record(seen: Sighting) -> dict[str, Any]:
    """A sighting as JSON (`GET /v1/jobs/seen`): the model's field names."""
    return {
        "job_id": seen.job_id,
        "user": seen.user,
        "name": seen.name,
        "gpu_minor_numbers": list(seen.gpu_minor_numbers),
        "started_at": seen.started_at,
        "time_limit_s": seen.time_limit_s,
        "first_seen_at": seen.first_seen_at,
        "last_seen_at": seen.last_seen_at,
        "gone_at": seen.gone_at,
    }


def sighting_from_record(data: object) -> Sighting:
    """The sighting a `sighting_record` wrote; `BadRecord` for anything malformed (another
    user's daemon, or a process on its socket, could send anything)."""
    if not isinstance(data, dict):
        raise BadRecord("job: not an object")
    minors = list_field(data, "gpu_minor_numbers", MAX_GPUS_PER_NODE)
    if not all(type(m) is int and 0 <= m < _MAX_MINOR for m in minors):
        raise BadRecord("gpu_minor_numbers: not minor numbers")

    def when(d: dict[str, Any], name: str) -> float:
        return float_field(d, name, 0, _MAX_TIME)

    return Sighting(
        job_id=text_field(data, "job_id", MAX_JOB_ID_CHARS, shortest=1),
        user=optional(data, "user", text_field),
        name=optional(data, "name", lambda d, n: text_field(d, n, 256)),
        gpu_minor_numbers=tuple(minors),
        started_at=optional(data, "started_at", when),
        time_limit_s=optional(data, "time_limit_s", when),
        first_seen_at=when(data, "first_seen_at"),
        last_seen_at=when(data, "last_seen_at"),
        gone_at=optional(data, "gone_at", when),
    )
