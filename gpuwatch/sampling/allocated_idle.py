"""How long each GPU that a job holds has computed nothing: the waste a scheduler cannot see.

`AllocatedIdle` is fed every sample with the job table of that moment and keeps, per GPU
uuid, since when the GPU has been held by the same job with a utilisation of at most
`IDLE_UTILIZATION_PCT` at every sample. A sample where it computes (or cannot tell its
utilisation), a job that ends, or another job on the GPU starts the count afresh. While
the jobs are unknown (the scheduler slow or down), the count goes on for a GPU that stays
idle, as the job most likely still holds it; whether it does is settled when the jobs are
known again. Pure: the caller gives the time; no thread, no I/O.

>>> from gpuwatch.jobs.job_table import Job, JobTable
>>> from gpuwatch.models import GpuSample
>>> gpu = GpuSample(index=0, uuid="GPU-a", name=None, pci_bus_id=None, utilization_pct=0,
...                 minor_number=0)
>>> table = JobTable((Job("42", "alice", None, (0,), None, None),), read_at=0.0)
>>> idle = AllocatedIdle()
>>> idle.update((gpu,), table, 100.0); idle.update((gpu,), table, 160.0)
>>> idle.idle_s(table, (gpu,))
{'GPU-a': 60.0}
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from gpuwatch.jobs.job_table import JobTable
from gpuwatch.models import GpuSample

IDLE_WINDOW_S = 600.0
"""From how long idle a held GPU is shown as such where nobody says otherwise (the TUI's
own count; the daemon's `--idle-window` default)."""
IDLE_UTILIZATION_PCT = 1
"""A GPU at or below this utilisation computes nothing worth the name (a monitoring
kernel, a driver's housekeeping)."""


class _IdleSince(msgspec.Struct, frozen=True):
    job_id: str
    """The job that held the GPU when the count started."""
    since: float


class AllocatedIdle:
    """Per GPU uuid, since when the job holding it has left it idle; fed by `update`."""

    def __init__(self) -> None:
        self._idle: dict[str, _IdleSince] = {}
        self._now: float | None = None

    def update(self, gpus: Iterable[GpuSample], jobs: JobTable | None, now: float) -> None:
        """Takes one sample's GPUs and the jobs known at `now` (`None`: unknown)."""
        idle: dict[str, _IdleSince] = {}
        for gpu in gpus:
            if gpu.uuid is None or not _is_idle(gpu):
                continue
            kept = self._idle.get(gpu.uuid)
            if jobs is None:  # unknown: a count under way goes on, none starts
                if kept is not None:
                    idle[gpu.uuid] = kept
                continue
            job = jobs.job_of_gpu(gpu)
            if job is None:
                continue
            if kept is None or kept.job_id != job.job_id:
                kept = _IdleSince(job.job_id, now)
            idle[gpu.uuid] = kept
        self._idle, self._now = idle, now

    def idle_s(self, jobs: JobTable | None, gpus: Iterable[GpuSample]) -> dict[str, float]:
        """Seconds each GPU of `gpus` that a job of `jobs` holds has been idle, as of the
        last update: 0 for one in use. Empty while the jobs are unknown."""
        if jobs is None:
            return {}
        seconds: dict[str, float] = {}
        for gpu in gpus:
            job = jobs.job_of_gpu(gpu)
            if gpu.uuid is None or job is None:
                continue
            kept = self._idle.get(gpu.uuid)
            if kept is None or kept.job_id != job.job_id or self._now is None:
                seconds[gpu.uuid] = 0.0
            else:
                seconds[gpu.uuid] = self._now - kept.since
        return seconds


def _is_idle(gpu: GpuSample) -> bool:
    return gpu.utilization_pct is not None and gpu.utilization_pct <= IDLE_UTILIZATION_PCT
