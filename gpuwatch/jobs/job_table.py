"""Who holds each GPU: the jobs a cluster engine ran on this node, and their GPUs.

A GPU is named by its device file's minor number (`/dev/nvidiaN`), which is how a
scheduler hands GPUs out (Slurm's gres.conf `File=`) and what NVML reports of each GPU
(`GpuSample.minor_number`); the NVML index is never assumed to follow it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpuwatch.models import GpuSample


@dataclass(frozen=True, slots=True)
class Job:
    """One job running on this node, as its scheduler reports it."""

    job_id: str
    """The scheduler's id: `1234`, or `1234_7` for a task of an array job."""
    user: str | None
    name: str | None
    gpu_minor_numbers: tuple[int, ...]
    """The GPUs it holds on this node, by device-file minor number; empty for none."""
    started_at: float | None
    """Unix time it started; `None` when the scheduler did not say."""
    time_limit_s: float | None
    """Its wall-time limit; `None` for no limit or not told."""
    state: str = "RUNNING"

    def time_left_s(self, now: float) -> float | None:
        """Seconds until its time limit at Unix time `now` (at least 0); `None` when unlimited
        or unknown."""
        if self.started_at is None or self.time_limit_s is None:
            return None
        return max(0.0, self.started_at + self.time_limit_s - now)


@dataclass(frozen=True, slots=True)
class JobTable:
    """The jobs of this node at `read_at`, and which holds each GPU.

    A reader that cannot tell (the scheduler absent, down or slow) returns `None`
    instead: "jobs unknown", never an empty table, which means "no job holds a GPU".
    """

    jobs: tuple[Job, ...]
    read_at: float
    """Unix time the scheduler answered."""
    source: str = ""
    """Which of the scheduler's answers it came from (`squeue --json`, `scontrol`)."""
    _by_minor: dict[int, Job] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for job in self.jobs:
            for minor in job.gpu_minor_numbers:
                self._by_minor.setdefault(minor, job)

    @property
    def by_minor_number(self) -> Mapping[int, Job]:
        """The job holding each GPU that is held, by its device file's minor number."""
        return self._by_minor

    def job_on(self, minor_number: int | None) -> Job | None:
        """The job holding the GPU with this minor number; `None` when it is free (or the
        GPU's minor number is not known)."""
        return None if minor_number is None else self._by_minor.get(minor_number)

    def job_of_gpu(self, gpu: GpuSample) -> Job | None:
        """The job holding this GPU, found by its `minor_number`."""
        return self.job_on(gpu.minor_number)

    def job(self, job_id: str) -> Job | None:
        """The job with this id, when it runs here."""
        return next((job for job in self.jobs if job.job_id == job_id), None)
