"""Who holds each GPU on this node, as the cluster's scheduler says (Slurm today).

A reader answers a `JobTable` (jobs, and the job on each GPU by device-file minor number)
or `None`, "jobs unknown", when the scheduler is absent, down or slower than its deadline;
nothing above this package needs to know which engine answered.

The names below are loaded when first used: `gpuwatch pick` inside a Slurm step needs only
gres.conf's reading (`gpuwatch.jobs.gres`), not the reader's threads and subprocesses, and
pays for every import on every job it starts.
"""

from __future__ import annotations

import importlib

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing at run time
if TYPE_CHECKING:
    from gpuwatch.jobs.gres import step_gpu_minors
    from gpuwatch.jobs.job_table import Job, JobTable, table_from_record, table_record
    from gpuwatch.jobs.slurm import SlurmJobs, job_id_of_process

__all__ = [
    "Job",
    "JobTable",
    "SlurmJobs",
    "job_id_of_process",
    "step_gpu_minors",
    "table_from_record",
    "table_record",
]

_MODULE_OF = {
    "Job": "job_table",
    "JobTable": "job_table",
    "SlurmJobs": "slurm",
    "job_id_of_process": "slurm",
    "step_gpu_minors": "gres",
    "table_from_record": "job_table",
    "table_record": "job_table",
}


def __getattr__(name: str) -> object:
    """The public names, each imported from its module the first time it is asked for."""
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'gpuwatch.jobs' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"gpuwatch.jobs.{module}"), name)
    globals()[name] = value
    return value
