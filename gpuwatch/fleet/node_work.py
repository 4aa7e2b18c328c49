"""What a gpuwatch daemon tells of the work around its GPUs besides the snapshot: the line
of jobs waiting for them, and the scheduler's job on each.

    gpuwatch_lease_waiters{hostname}                      jobs in line (`pick --wait`)
    gpuwatch_lease_longest_wait_seconds{hostname}         how long the oldest has waited
    gpuwatch_jobs_known{hostname}                         1 while the scheduler answers, else 0
    gpuwatch_gpu_job_info{gpu, uuid, hostname, job_id, job_user} 1    per GPU a job holds
    gpuwatch_gpu_allocated_idle_seconds{gpu, uuid, hostname}     how long that job left it idle

The job's id is the label `job_id`, as Prometheus keeps `job` for the scrape's own job.
A daemon that exports no line (a version before it) leaves the line unknown; one that says
its jobs are not known (0), or exports no job series at all (no scheduler there), leaves
the jobs unknown: `None`, never "no job". Values come from another machine: each is
range-checked, a bad one unknown.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gpuwatch.fleet import mapped as m
from gpuwatch.fleet.exposition import Sample
from gpuwatch.fleet_model import GpuJob

WAITERS = "gpuwatch_lease_waiters"
LONGEST_WAIT = "gpuwatch_lease_longest_wait_seconds"
JOBS_KNOWN = "gpuwatch_jobs_known"
JOB_INFO = "gpuwatch_gpu_job_info"
ALLOCATED_IDLE = "gpuwatch_gpu_allocated_idle_seconds"
BY_NODE_OR_GPU = (WAITERS, LONGEST_WAIT, JOBS_KNOWN, ALLOCATED_IDLE, JOB_INFO)
"""Families read with no more labels than the GPU's index and `JOB_LABELS`: what the
others say (uuid, hostname) is known from the GPU's identity series."""
JOB_LABELS = ("job_id", "job_user")
MAX_WAITERS = 1_000_000
MAX_SECONDS = 1e10  # three centuries: anything longer is not a duration


def waiting_line(by_name: Mapping[str, Sequence[Sample]]) -> tuple[int | None, float | None]:
    """The number of jobs in line and the oldest one's wait, each `None` when not told."""
    count = _first(by_name, WAITERS)
    oldest = _first(by_name, LONGEST_WAIT)
    return (
        None if count is None else m.small_whole(count, MAX_WAITERS),
        None if oldest is None else seconds(oldest),
    )


def gpu_jobs(
    by_name: Mapping[str, Sequence[Sample]], gpu_indices: set[int]
) -> tuple[GpuJob, ...] | None:
    """The job on each GPU of `gpu_indices` that a job holds, sorted by GPU and job;
    `None` when the jobs are unknown."""
    known = _first(by_name, JOBS_KNOWN)
    infos = by_name.get(JOB_INFO, ())
    if (known is None and not infos) or (known is not None and m.flag(known) is not True):
        return None
    idle: dict[int, float | None] = {}
    for sample in by_name.get(ALLOCATED_IDLE, ()):
        if (index := m.index_of(sample.labels.get("gpu"))) is not None:
            idle[index] = seconds(sample.value)
    jobs: dict[tuple[int, str], GpuJob] = {}
    for sample in infos:
        index = m.index_of(sample.labels.get("gpu"))
        job_id = m.label(sample.labels.get("job_id"), 64)
        if index not in gpu_indices or job_id is None or sample.value != 1:
            continue
        assert index is not None
        user = m.label(sample.labels.get("job_user"), 64)
        jobs[(index, job_id)] = GpuJob(index, job_id, user, idle.get(index))
    return tuple(job for _, job in sorted(jobs.items()))


def seconds(value: float) -> float | None:
    return value if 0 <= value <= MAX_SECONDS else None


def _first(by_name: Mapping[str, Sequence[Sample]], name: str) -> float | None:
    samples = by_name.get(name, ())
    return samples[0].value if samples else None
