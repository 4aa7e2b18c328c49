"""Who holds each GPU on this node, as the cluster says: Slurm's jobs, or the pods the
kubelet gave GPUs to.

An engine (`engines.JobEngine`) answers a `JobTable` (jobs, and the job on each device, by
device-file minor number or UUID) or `None`, "jobs unknown", when the scheduler is absent,
down or slower than its deadline; nothing above this package needs to know which engine
answered.
"""

from __future__ import annotations

from gpuwatch.jobs.gres import step_gpu_minors
from gpuwatch.jobs.job_table import Job, JobTable, Pod, table_from_record, table_record
from gpuwatch.jobs.kubernetes import KubeletPods
from gpuwatch.jobs.slurm import SlurmJobs, job_id_of_process

__all__ = [
    "Job",
    "JobTable",
    "KubeletPods",
    "Pod",
    "SlurmJobs",
    "job_id_of_process",
    "step_gpu_minors",
    "table_from_record",
    "table_record",
]
