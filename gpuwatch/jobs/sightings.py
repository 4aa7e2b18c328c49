"""What the daemon remembers of the jobs it saw on this node's GPUs: which GPUs each job
held, and when it was seen, for as long as the daemon keeps its history. It is what
`gpuwatch job-report` reads once the scheduler has forgotten a job's GPUs (Slurm drops
them when the job ends). Engine-blind: it keeps `Job`s, whoever told them.

A job is seen at each read of the jobs that shows it; `gone_at` is the first read after
that which did not: it ended in between.
"""

from __future__ import annotations

import threading
from typing import Any

import msgspec
from msgspec.structs import replace

from gpuwatch.jobs.job_table import Job, JobTable, job_from_record, job_record
from gpuwatch.record_fields import BadRecord, optional, time_field

MAX_JOBS_KEPT = 100_000
"""The oldest are forgotten first beyond this many (a node running a job a second for a
day keeps the day)."""


class Sighting(msgspec.Struct, frozen=True):
    """One job as the daemon saw it on this node."""

    job: Job
    """The job as last seen; its `gpu_minor_numbers` are every GPU it was seen holding here."""
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
                    minors |= set(before.job.gpu_minor_numbers)
                first = (
                    before.first_seen_at if before is not None and before.gone_at is None else at
                )
                held = replace(job, gpu_minor_numbers=tuple(sorted(minors)))
                self._jobs[job.job_id] = Sighting(held, first, at)
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
            kept = {s.job.job_id: s for s in newest}
        if len(kept) < len(self._jobs) and self._since is not None:
            self._since = max(self._since, horizon)
        self._jobs = kept


def sighting_record(seen: Sighting) -> dict[str, Any]:
    """A sighting as JSON (`GET /v1/jobs/seen`): the job's record and when it was seen."""
    return {
        **job_record(seen.job),
        "first_seen_at": seen.first_seen_at,
        "last_seen_at": seen.last_seen_at,
        "gone_at": seen.gone_at,
    }


def sighting_from_record(data: object) -> Sighting:
    """The sighting a `sighting_record` wrote; `BadRecord` for anything malformed (another
    user's daemon, or a process on its socket, could send anything)."""
    if not isinstance(data, dict):
        raise BadRecord("job: not an object")
    return Sighting(
        job_from_record(data),
        first_seen_at=time_field(data, "first_seen_at"),
        last_seen_at=time_field(data, "last_seen_at"),
        gone_at=optional(data, "gone_at", time_field),
    )
