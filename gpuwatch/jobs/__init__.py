"""Who holds each GPU on this node, as the cluster's scheduler says (Slurm today).

A reader answers a `JobTable` (jobs, and the job on each GPU by device-file minor number)
or `None`, "jobs unknown", when the scheduler is absent, down or slower than its deadline;
nothing above this package needs to know which engine answered.

The names are loaded when first used: `gpuwatch status` reads a cached table through
`gpuwatch.jobs.job_table` alone, without the cost of the Slurm reader's imports
(subprocess, threading, socket, datetime).
"""

from __future__ import annotations

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing at run time
if TYPE_CHECKING:
    from gpuwatch.jobs.gres import step_gpu_minors
    from gpuwatch.jobs.job_table import Job, JobTable, table_from_record, table_record
    from gpuwatch.jobs.slurm import SlurmJobs, job_id_of_process

_HOME = {
    "Job": "job_table",
    "JobTable": "job_table",
    "table_from_record": "job_table",
    "table_record": "job_table",
    "SlurmJobs": "slurm",
    "job_id_of_process": "slurm",
    "step_gpu_minors": "gres",
}

__all__ = [
    "Job",
    "JobTable",
    "SlurmJobs",
    "job_id_of_process",
    "step_gpu_minors",
    "table_from_record",
    "table_record",
]


def __getattr__(name: str) -> object:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value
