"""The jobs in `gpuwatch status --json`: a top-level `jobs` list (or `null` when unknown,
with `jobs_error` saying why) and, on each GPU, the `job_id` holding it, how long it has
been allocated and idle, and why nobody can tell who holds it (`holders_unknown`: the
scheduler did not answer, or a record of its answer naming the GPU could not be believed).

A job's GPUs are given as this node's NVML indices and UUIDs, matched by device-file minor
number (the GRES indices Slurm counts in are not NVML's) or by UUID (as Kubernetes names
them), and the MIG devices it holds by UUID; a pod's job names its pod.
"""

from __future__ import annotations

from typing import Any

from gpuwatch.jobs.job_table import Job, NodeJobs, pod_record
from gpuwatch.models import Snapshot


def with_jobs(data: dict[str, Any], snapshot: Snapshot, jobs: NodeJobs | None) -> dict[str, Any]:
    """`data` (the snapshot's JSON) with the jobs fields, all `null` where no scheduler
    answers for this node."""
    table = jobs.table if jobs is not None else None
    data["jobs"] = None if table is None else [_job(job, snapshot) for job in table.jobs]
    data["jobs_error"] = jobs.unknown_why if jobs is not None and table is None else None
    data["allocated_idle_window_s"] = jobs.idle_window_s if jobs is not None else None
    holders = jobs.holders(snapshot) if jobs is not None else None
    for gpu, record in zip(snapshot.gpus, data["gpus"], strict=True):
        holder = jobs.job_of(gpu) if jobs is not None else None
        record["job_id"] = holder.job_id if holder is not None else None
        record["holders_unknown"] = holders.unknown_of(gpu) if holders is not None else None
        idle_s = jobs.allocated_idle_s.get(gpu.uuid or "") if jobs is not None else None
        record["allocated_idle_s"] = idle_s if holder is not None else None
    return data


def _job(job: Job, snapshot: Snapshot) -> dict[str, Any]:
    held = [
        gpu
        for gpu in snapshot.gpus
        if gpu.minor_number in job.gpu_minor_numbers or gpu.uuid in job.device_uuids
    ]
    migs = [mig.uuid for mig in snapshot.mig_devices if mig.uuid in job.device_uuids]
    return {
        "job_id": job.job_id,
        "user": job.user,
        "name": job.name,
        "gpus": [gpu.index for gpu in held],
        "gpu_uuids": [gpu.uuid for gpu in held],
        "mig_uuids": migs,
        "started_at": job.started_at,
        "time_limit_s": job.time_limit_s,
        "pod": None if job.pod is None else pod_record(job.pod),
    }
