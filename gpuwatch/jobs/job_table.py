"""Who holds each GPU: the jobs a cluster engine ran on this node, and their devices.

A scheduler names a GPU its own way: Slurm by its device file's minor number
(`/dev/nvidiaN`, gres.conf's `File=`, which NVML reports as `GpuSample.minor_number`),
Kubernetes by the UUID the device plugin gave out (`GPU-...`, or `MIG-...` for a MIG
device). A `Job` holds devices either way; the NVML index is never assumed to follow
either. A pod is a `Job` too (one per container holding devices), named `namespace/pod`,
with its `Pod`: whatever shows jobs shows pods, through the same table.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuwatch.models import Device, GpuSample, MigDevice, Snapshot
from gpuwatch.record_fields import (
    MAX_TIME,
    BadRecord,
    float_field,
    list_field,
    optional,
    text_field,
    time_field,
)
from gpuwatch.text import printable_fields

MAX_JOBS = 100_000
MAX_GPUS_PER_NODE = 1024
MAX_JOB_ID_CHARS = 320
"""A Slurm job id is short; a pod's `namespace/name` is at most 63 + 1 + 253 characters."""
MAX_NAME_CHARS = 253
"""The longest name Kubernetes gives anything (a DNS subdomain)."""
MAX_UUID_CHARS = 96
_MAX_MINOR = 1 << 20


@dataclass(frozen=True, slots=True)
class Pod:
    """The Kubernetes container that holds a job's devices."""

    namespace: str
    name: str
    container: str


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
    device_uuids: tuple[str, ...] = ()
    """The devices it holds by UUID (`GPU-...`, `MIG-...`): how Kubernetes names them."""
    pod: Pod | None = None
    """The container it is, where Kubernetes runs it; `None` for a scheduler's job."""

    @property
    def holder(self) -> str:
        """Who holds its devices, in words: `job 1234 (alice)`, `pod ml/train-0 (container
        main)`."""
        if self.pod is not None:
            container = self.pod.container
            return f"pod {self.job_id}" + (f" (container {container})" if container else "")
        return f"job {self.job_id}" + (f" ({self.user})" if self.user else "")

    @property
    def heading(self) -> str:
        """Who holds its GPUs, as `gpuwatch status` and the node screen head them: `job 1234
        alice` (`?` for a user not told), `pod ml/train-0 (container main)`."""
        if self.pod is not None:
            return self.holder
        return f"job {self.job_id} {self.user or '?'}"

    def __post_init__(self) -> None:
        # A job's name and user are free text, whichever engine told them.
        printable_fields(self, "job_id", "user", "name", "state")

    def time_left_s(self, now: float) -> float | None:
        """Seconds until its time limit at Unix time `now` (at least 0); `None` when unlimited
        or unknown."""
        if self.started_at is None or self.time_limit_s is None:
            return None
        return max(0.0, self.started_at + self.time_limit_s - now)


@dataclass(frozen=True, slots=True)
class Doubt:
    """A record of an engine's answer that cannot be believed (a job of the wrong shape, a
    device named in a form not understood): dropped alone, never shown as a job. The devices
    it names, as far as they can be read, have unknown holders; where it names none that
    can be read, every device of the node has (`whole_node`)."""

    why: str
    """What was wrong, in words: `job 1234: gres_detail is not a list`."""
    gpu_minor_numbers: tuple[int, ...] = ()
    device_uuids: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        printable_fields(self, "why")

    @property
    def whole_node(self) -> bool:
        """Whether it names no device that can be read: any of the node's may be held."""
        return not self.gpu_minor_numbers and not self.device_uuids


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
    doubts: tuple[Doubt, ...] = ()
    """The records of the answer that could not be believed, each dropped alone: the
    devices they name have unknown holders."""
    _by_minor: dict[int, Job] = field(default_factory=dict, init=False, repr=False, compare=False)
    _by_uuid: dict[str, Job] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        printable_fields(self, "source")
        for job in self.jobs:
            for minor in job.gpu_minor_numbers:
                self._by_minor.setdefault(minor, job)
            for uuid in job.device_uuids:
                self._by_uuid.setdefault(uuid, job)

    @property
    def by_minor_number(self) -> Mapping[int, Job]:
        """The job holding each GPU that is held, by its device file's minor number."""
        return self._by_minor

    def job_on(self, minor_number: int | None) -> Job | None:
        """The job holding the GPU with this minor number; `None` when it is free (or the
        GPU's minor number is not known)."""
        return None if minor_number is None else self._by_minor.get(minor_number)

    def job_of_gpu(self, gpu: GpuSample) -> Job | None:
        """The job holding this whole GPU, found by its `minor_number` or its UUID."""
        return self.job_on(gpu.minor_number) or self._by_uuid.get(gpu.uuid or "")

    def job_of_device(self, device: Device) -> Job | None:
        """The job holding this GPU or MIG device (a MIG device by its UUID)."""
        if isinstance(device, MigDevice):
            return self._by_uuid.get(device.uuid or "")
        return self.job_of_gpu(device)

    def held(self, snapshot: Snapshot) -> dict[str, Job]:
        """The job holding each of `snapshot`'s devices that one holds, by the device's
        UUID: the GPUs and MIG devices no other job may be given."""
        devices: list[Device] = [*snapshot.gpus, *snapshot.mig_devices]
        return {
            device.uuid: job
            for device in devices
            if device.uuid and (job := self.job_of_device(device)) is not None
        }

    def job(self, job_id: str) -> Job | None:
        """The job with this id, when it runs here."""
        return next((job for job in self.jobs if job.job_id == job_id), None)


def job_record(job: Job) -> dict[str, Any]:
    """A job as JSON (the daemon's `/v1/jobs`, `status --json`): the model's field names."""
    return {
        "job_id": job.job_id,
        "user": job.user,
        "name": job.name,
        "gpu_minor_numbers": list(job.gpu_minor_numbers),
        "started_at": job.started_at,
        "time_limit_s": job.time_limit_s,
        "state": job.state,
        "device_uuids": list(job.device_uuids),
        "pod": None if job.pod is None else pod_record(job.pod),
    }


def pod_record(pod: Pod) -> dict[str, str]:
    """A pod as JSON: `namespace`, `name`, `container`."""
    return {"namespace": pod.namespace, "name": pod.name, "container": pod.container}


def _pod_from_record(data: dict[str, Any], name: str) -> Pod:
    pod = data[name]
    if not isinstance(pod, dict):
        raise BadRecord("pod: not an object")
    return Pod(
        namespace=text_field(pod, "namespace", MAX_NAME_CHARS, shortest=1),
        name=text_field(pod, "name", MAX_NAME_CHARS, shortest=1),
        container=text_field(pod, "container", MAX_NAME_CHARS),
    )


def _uuids(data: dict[str, Any]) -> tuple[str, ...]:
    uuids = list_field(data, "device_uuids", MAX_GPUS_PER_NODE)
    if not all(
        isinstance(u, str) and 0 < len(u) <= MAX_UUID_CHARS and u.isprintable() for u in uuids
    ):
        raise BadRecord("device_uuids: not device UUIDs")
    return tuple(uuids)


def job_from_record(data: object) -> Job:
    """The job a `job_record` wrote; `BadRecord` for anything malformed."""
    if not isinstance(data, dict):
        raise BadRecord("job: not an object")
    minors = list_field(data, "gpu_minor_numbers", MAX_GPUS_PER_NODE)
    if not all(type(m) is int and 0 <= m < _MAX_MINOR for m in minors):
        raise BadRecord("gpu_minor_numbers: not minor numbers")
    return Job(
        job_id=text_field(data, "job_id", MAX_JOB_ID_CHARS, shortest=1),
        user=optional(data, "user", text_field),
        name=optional(data, "name", lambda d, n: text_field(d, n, 256)),
        gpu_minor_numbers=tuple(minors),
        started_at=optional(data, "started_at", time_field),
        time_limit_s=optional(data, "time_limit_s", lambda d, n: float_field(d, n, 0, MAX_TIME)),
        state=text_field(data, "state", 32, shortest=1) if "state" in data else "RUNNING",
        # An older daemon sends neither: its jobs hold GPUs by minor number only.
        device_uuids=_uuids(data),
        pod=optional(data, "pod", _pod_from_record),
    )


def believed(job: Job) -> Job | Doubt:
    """`job` where its clients will take it back (`job_from_record` of its `job_record`,
    as they read `/v1/jobs`), else a `Doubt` saying what they would refuse, with the
    devices it names that they would take: an engine never publishes a job its clients
    reject, and never drops one silently."""
    try:
        job_from_record(job_record(job))
    except BadRecord as error:
        minors = job.gpu_minor_numbers if len(job.gpu_minor_numbers) <= MAX_GPUS_PER_NODE else ()
        uuids = job.device_uuids if len(job.device_uuids) <= MAX_GPUS_PER_NODE else ()
        return Doubt(
            f"job {job.job_id[:40]}: {error}",
            tuple(m for m in minors if 0 <= m < _MAX_MINOR),
            tuple(u for u in uuids if 0 < len(u) <= MAX_UUID_CHARS),
        )
    return job


def table_record(table: JobTable | None, *, error: str | None = None) -> dict[str, Any]:
    """A node's jobs as JSON: `{"known": false, "error": ...}` when they are unknown."""
    if table is None:
        return {"known": False, "error": error, "jobs": None}
    return {
        "known": True,
        "read_at": table.read_at,
        "source": table.source,
        "jobs": [job_record(job) for job in table.jobs],
    }


def table_from_record(data: object) -> JobTable | None:
    """The table a `table_record` wrote; `None` for "jobs unknown"; `BadRecord` for
    anything malformed."""
    if not isinstance(data, dict):
        raise BadRecord("jobs: not an object")
    if data.get("known") is not True:
        return None
    jobs = list_field(data, "jobs", MAX_JOBS)
    return JobTable(
        jobs=tuple(job_from_record(job) for job in jobs),
        read_at=time_field(data, "read_at"),
        source=text_field(data, "source", 64),
    )


MAX_WHY_CHARS = 200
"""The longest reason a screen is given for jobs being unknown."""


@dataclass(frozen=True, slots=True)
class NodeJobs:
    """This node's jobs as a screen shows them.

    `scheduler` False: no scheduler here, nothing is shown. Else `table` holds the jobs, or
    is `None` and `unknown_why` says why they are unknown.
    """

    table: JobTable | None = None
    unknown_why: str | None = None
    allocated_idle_s: Mapping[str, float] = field(default_factory=dict)
    """Seconds each allocated GPU has been idle, by UUID, where the daemon tracks it."""
    idle_window_s: float | None = None
    """From how long idle an allocated GPU is shown as such; `None`: never (not tracked)."""
    scheduler: bool = False

    def __post_init__(self) -> None:
        printable_fields(self, "unknown_why")

    def job_of(self, gpu: GpuSample) -> Job | None:
        """The job holding `gpu`; `None` when free or unknown."""
        return None if self.table is None else self.table.job_of_gpu(gpu)

    def held(self, snapshot: Snapshot) -> dict[str, Job]:
        """The job holding each held device of `snapshot`, by UUID; none while unknown."""
        return {} if self.table is None else self.table.held(snapshot)

    def idle_s(self, gpu: GpuSample) -> float | None:
        """How long `gpu` has been allocated and idle, when that is at least the window:
        the GPUs to show as "allocated, idle"; `None` for the others."""
        seconds = self.allocated_idle_s.get(gpu.uuid or "")
        window = self.idle_window_s
        if seconds is None or window is None or seconds < window:
            return None
        return seconds


NO_JOBS = NodeJobs()
"""No scheduler: nothing to show."""
