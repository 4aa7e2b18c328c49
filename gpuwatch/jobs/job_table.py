"""Who holds each GPU: the jobs a cluster engine ran on this node, and their devices.

A scheduler names a GPU its own way: Slurm by its device file's minor number
(`/dev/nvidiaN`, gres.conf's `File=`, which NVML reports as `GpuSample.minor_number`),
Kubernetes by the UUID the device plugin gave out (`GPU-...`, or `MIG-...` for a MIG
device). A `Job` holds devices either way; the NVML index is never assumed to follow
either. A pod is a `Job` too (one per container holding devices), named `namespace/pod`,
with its `Pod`: whatever shows jobs shows pods, through the same table.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

from gpuwatch.holders import (
    MAX_CONTAINER_CHARS,
    MAX_NAME_CHARS,
    MAX_USER_CHARS,
    NO_HOLDERS,
    Holder,
    HolderKind,
    Holders,
    device_key,
    holder_problem,
    holders_on,
    unknown_holders,
)
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
MAX_JOB_ID_CHARS = MAX_NAME_CHARS
"""A Slurm job id is short; a pod's `namespace/name` is at most 63 + 1 + 253 characters."""
MAX_POD_NAME_CHARS = MAX_CONTAINER_CHARS
"""The longest name Kubernetes gives anything (a DNS subdomain)."""
MAX_NAMESPACE_CHARS = 63
"""A Kubernetes namespace is a DNS label."""
MAX_JOB_NAME_CHARS = 256
MAX_STATE_CHARS = 32
MAX_UUID_CHARS = 96
_MAX_MINOR = 1 << 20


class Pod(msgspec.Struct, frozen=True):
    """The Kubernetes container that holds a job's devices."""

    namespace: str
    name: str
    container: str


class Job(msgspec.Struct, frozen=True):
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

    @property
    def as_holder(self) -> Holder:
        """The job as the holder of its devices."""
        if self.pod is not None:
            return Holder(HolderKind.POD, self.job_id, container=self.pod.container or None)
        return Holder(HolderKind.JOB, self.job_id, user=self.user)

    def time_left_s(self, now: float) -> float | None:
        """Seconds until its time limit at Unix time `now` (at least 0); `None` when unlimited
        or unknown."""
        if self.started_at is None or self.time_limit_s is None:
            return None
        return max(0.0, self.started_at + self.time_limit_s - now)


class Doubt(msgspec.Struct, frozen=True):
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


class JobTable(msgspec.Struct, frozen=True):
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

    def __post_init__(self) -> None:
        printable_fields(self, "source")
        believed, doubts = believed_jobs(self.jobs)
        if doubts:  # a job that cannot be believed is dropped alone: its devices unknown
            msgspec.structs.force_setattr(self, "jobs", believed)
            msgspec.structs.force_setattr(self, "doubts", (*self.doubts, *doubts))

    @property
    def by_minor_number(self) -> Mapping[int, Job]:
        """The job holding each GPU that is held, by its device file's minor number (the
        first job to name it)."""
        held: dict[int, Job] = {}
        for job in self.jobs:
            for minor in job.gpu_minor_numbers:
                held.setdefault(minor, job)
        return held

    def job_on(self, minor_number: int | None) -> Job | None:
        """The job holding the GPU with this minor number; `None` when it is free (or the
        GPU's minor number is not known)."""
        if minor_number is None:
            return None
        return next((job for job in self.jobs if minor_number in job.gpu_minor_numbers), None)

    def job_of_gpu(self, gpu: GpuSample) -> Job | None:
        """The job holding this whole GPU, found by its `minor_number` or its UUID."""
        return self.job_on(gpu.minor_number) or self._job_by_uuid(gpu.uuid)

    def job_of_device(self, device: Device) -> Job | None:
        """The job holding this GPU or MIG device (a MIG device by its UUID)."""
        if isinstance(device, MigDevice):
            return self._job_by_uuid(device.uuid)
        return self.job_of_gpu(device)

    def _job_by_uuid(self, uuid: str | None) -> Job | None:
        if not uuid:
            return None
        return next((job for job in self.jobs if uuid in job.device_uuids), None)

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

    def holders(self, snapshot: Snapshot) -> Holders:
        """Who holds each of `snapshot`'s devices by this table, and which are unknown:
        those a doubt names (every device for a doubt that names none that can be read),
        and, where the table names GPUs by minor number (Slurm), a GPU whose minor number
        the driver did not tell, which no job can be matched to."""
        gpu_of_minor = {gpu.minor_number: gpu for gpu in snapshot.gpus}
        devices: list[Device] = [*snapshot.gpus, *snapshot.mig_devices]
        of_uuid = {device.uuid: device for device in devices if device.uuid}
        held: dict[str, list[Holder]] = {}
        for job in self.jobs:
            named: list[Device | None] = [gpu_of_minor.get(m) for m in job.gpu_minor_numbers]
            named += [of_uuid.get(uuid) for uuid in job.device_uuids]
            for device in named:
                if device is not None:
                    held.setdefault(device_key(device), []).append(job.as_holder)
        unknown: dict[str, str] = {}
        by_minor = any(job.gpu_minor_numbers for job in self.jobs) or any(
            doubt.gpu_minor_numbers for doubt in self.doubts
        )
        for gpu in snapshot.gpus:
            if by_minor and gpu.minor_number is None:
                unknown[device_key(gpu)] = (
                    "the driver does not tell its minor number, by which Slurm names GPUs"
                )
        whole_node = None
        for doubt in self.doubts:
            if doubt.whole_node:
                whole_node = whole_node or doubt.why
            named = [gpu_of_minor.get(m) for m in doubt.gpu_minor_numbers]
            named += [of_uuid.get(uuid) for uuid in doubt.device_uuids]
            for device in named:
                if device is not None:
                    unknown.setdefault(device_key(device), doubt.why)
        return holders_on(snapshot, held, unknown, unknown_why=whole_node)


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
        namespace=text_field(pod, "namespace", MAX_NAMESPACE_CHARS, shortest=1),
        name=text_field(pod, "name", MAX_POD_NAME_CHARS, shortest=1),
        container=text_field(pod, "container", MAX_CONTAINER_CHARS),
    )


def _uuids(data: dict[str, Any]) -> tuple[str, ...]:
    uuids = list_field(data, "device_uuids", MAX_GPUS_PER_NODE)
    if not all(
        isinstance(u, str) and 0 < len(u) <= MAX_UUID_CHARS and u.isprintable() for u in uuids
    ):
        raise BadRecord("device_uuids: not device UUIDs")
    return tuple(uuids)


def job_problem(job: Job) -> str | None:
    """Why `job` cannot be believed, or `None`: the one check of a job, whichever engine
    told it and whoever reads it back (a `JobTable` applies it to every job it is given),
    so that nothing the daemon publishes is refused by its readers."""
    holder = job.as_holder
    return (
        holder_problem(holder.kind, job.job_id, job.user, holder.container)
        or _devices_problem(job)
        or _fields_problem(job)
        or (None if job.pod is None else _pod_problem(job.pod))
    )


def _devices_problem(job: Job) -> str | None:
    said = f"job {job.job_id}"
    if len(job.gpu_minor_numbers) > MAX_GPUS_PER_NODE or len(job.device_uuids) > MAX_GPUS_PER_NODE:
        return f"{said}: more than {MAX_GPUS_PER_NODE} devices"
    if not all(type(m) is int and 0 <= m < _MAX_MINOR for m in job.gpu_minor_numbers):
        return f"{said}: GPUs that are not minor numbers"
    if not all(0 < len(uuid) <= MAX_UUID_CHARS for uuid in job.device_uuids):
        return f"{said}: device ids that are not device UUIDs"
    return None


def _fields_problem(job: Job) -> str | None:
    said = f"job {job.job_id}"
    for name, seconds in (("start", job.started_at), ("time limit", job.time_limit_s)):
        if seconds is not None and not 0 <= seconds <= MAX_TIME:
            return f"{said}: a {name} of {seconds:.3g}s"
    if job.name is not None and len(job.name) > MAX_JOB_NAME_CHARS:
        return f"{said}: a name of over {MAX_JOB_NAME_CHARS} characters"
    if not 0 < len(job.state) <= MAX_STATE_CHARS:
        return f"{said}: a state that is not one"
    return None


def _pod_problem(pod: Pod) -> str | None:
    if not 0 < len(pod.namespace) <= MAX_NAMESPACE_CHARS:
        return f"pod {pod.name}: a namespace that is not one"
    if not 0 < len(pod.name) <= MAX_POD_NAME_CHARS:
        return f"pod in {pod.namespace}: a name that is not one"
    return None


def believed(job: Job) -> Job | Doubt:
    """`job` where it can be believed, else a `Doubt` saying why (`job_problem`), naming
    its devices as far as they can be read: an engine never publishes a job its clients
    reject, and never drops one silently."""
    why = job_problem(job)
    if why is None:
        return job
    return Doubt(why, *_readable_devices(list(job.gpu_minor_numbers), list(job.device_uuids)))


def believed_jobs(jobs: Iterable[Job]) -> tuple[tuple[Job, ...], tuple[Doubt, ...]]:
    """The jobs that can be believed, and a doubt for each of the others (`believed`)."""
    judged = [believed(job) for job in jobs]
    return (
        tuple(job for job in judged if isinstance(job, Job)),
        tuple(doubt for doubt in judged if isinstance(doubt, Doubt)),
    )


def job_from_record(data: object) -> Job:
    """The job a `job_record` wrote, its fields of the right types; `BadRecord` for one
    that is not (its values are checked where it joins a table: `job_problem`)."""
    if not isinstance(data, dict):
        raise BadRecord("job: not an object")
    minors = list_field(data, "gpu_minor_numbers", MAX_GPUS_PER_NODE)
    if not all(type(m) is int and 0 <= m < _MAX_MINOR for m in minors):
        raise BadRecord("gpu_minor_numbers: not minor numbers")
    return Job(
        job_id=text_field(data, "job_id", MAX_JOB_ID_CHARS, shortest=1),
        user=optional(data, "user", lambda d, n: text_field(d, n, MAX_USER_CHARS)),
        name=optional(data, "name", lambda d, n: text_field(d, n, MAX_JOB_NAME_CHARS)),
        gpu_minor_numbers=tuple(minors),
        started_at=optional(data, "started_at", time_field),
        time_limit_s=optional(data, "time_limit_s", lambda d, n: float_field(d, n, 0, MAX_TIME)),
        state=text_field(data, "state", MAX_STATE_CHARS, shortest=1)
        if "state" in data
        else "RUNNING",
        # An older daemon sends neither: its jobs hold GPUs by minor number only.
        device_uuids=_uuids(data),
        pod=optional(data, "pod", _pod_from_record),
    )


def _job_or_doubt(data: object) -> Job | Doubt:
    """The job a record holds, or a doubt naming the devices it names, as far as they can
    be read: one record the reader cannot believe never voids the others."""
    try:
        return job_from_record(data)
    except BadRecord as error:
        said = data.get("job_id") if isinstance(data, dict) else None
        who = f"job {said!r:.40}" if isinstance(said, str) else "a job"
        minors, uuids = _devices_of_record(data)
        return Doubt(f"{who} is malformed ({error})", minors, uuids)


def _devices_of_record(data: object) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """The minor numbers and device UUIDs a malformed job record names, as far as they
    can be read."""
    if not isinstance(data, dict):
        return (), ()
    return _readable_devices(data.get("gpu_minor_numbers"), data.get("device_uuids"))


def _readable_devices(minors: object, uuids: object) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """The minor numbers and device UUIDs in two lists of a job that cannot be believed,
    as far as they can be read (none, where a list cannot: then every device is in
    doubt)."""
    if not isinstance(minors, list) or len(minors) > MAX_GPUS_PER_NODE:
        minors = []
    if not isinstance(uuids, list) or len(uuids) > MAX_GPUS_PER_NODE:
        uuids = []
    return (
        tuple(m for m in minors if type(m) is int and 0 <= m < _MAX_MINOR),
        tuple(u for u in uuids if isinstance(u, str) and 0 < len(u) <= MAX_UUID_CHARS),
    )


def table_record(table: JobTable | None, *, error: str | None = None) -> dict[str, Any]:
    """A node's jobs as JSON: `{"known": false, "error": ...}` when they are unknown; the
    records of the engine's answer that could not be believed under `doubts`."""
    if table is None:
        return {"known": False, "error": error, "jobs": None}
    return {
        "known": True,
        "read_at": table.read_at,
        "source": table.source,
        "jobs": [job_record(job) for job in table.jobs],
        "doubts": [doubt_record(doubt) for doubt in table.doubts],
    }


def doubt_record(doubt: Doubt) -> dict[str, Any]:
    """A doubt as JSON: the model's field names."""
    return {
        "why": doubt.why,
        "gpu_minor_numbers": list(doubt.gpu_minor_numbers),
        "device_uuids": list(doubt.device_uuids),
    }


def _doubt_from_record(data: object) -> Doubt:
    """The doubt a `doubt_record` wrote; one that cannot be read doubts every device."""
    why = data.get("why") if isinstance(data, dict) else None
    if not isinstance(why, str) or not 0 < len(why) <= MAX_WHY_CHARS:
        why = "a record the daemon doubts, which cannot be read"
    minors, uuids = _devices_of_record(data)
    return Doubt(why, minors, uuids)


def table_from_record(data: object, *, strict: bool = False) -> JobTable | None:
    """The table a `table_record` wrote; `None` for "jobs unknown"; `BadRecord` where the
    table itself is malformed. A job that cannot be read or believed is dropped alone, as
    a doubt: the devices it names have unknown holders, the rest of the table stands
    (`strict`: a record this process wrote itself, whole or not at all: `BadRecord`)."""
    if not isinstance(data, dict):
        raise BadRecord("jobs: not an object")
    if data.get("known") is not True:
        return None
    records = list_field(data, "jobs", MAX_JOBS)
    read = [job_from_record(r) if strict else _job_or_doubt(r) for r in records]
    for job in read if strict else ():
        if isinstance(job, Job) and (why := job_problem(job)) is not None:
            raise BadRecord(why)
    said = list_field(data, "doubts", MAX_JOBS)  # an older daemon sends none
    return JobTable(
        jobs=tuple(job for job in read if isinstance(job, Job)),
        read_at=time_field(data, "read_at"),
        source=text_field(data, "source", 64),
        doubts=(
            *(doubt for doubt in read if isinstance(doubt, Doubt)),
            *(_doubt_from_record(doubt) for doubt in said),
        ),
    )


MAX_WHY_CHARS = 200
"""The longest reason a screen is given for jobs being unknown."""


class NodeJobs(msgspec.Struct, frozen=True):
    """This node's jobs as a screen shows them.

    `scheduler` False: no scheduler here, nothing is shown. Else `table` holds the jobs, or
    is `None` and `unknown_why` says why they are unknown.
    """

    table: JobTable | None = None
    unknown_why: str | None = None
    allocated_idle_s: Mapping[str, float] = msgspec.field(default_factory=dict)
    """Seconds each allocated GPU has been idle, by UUID, where the daemon tracks it."""
    idle_window_s: float | None = None
    """From how long idle an allocated GPU is shown as such; `None`: never (not tracked)."""
    scheduler: bool = False

    def __post_init__(self) -> None:
        printable_fields(self, "unknown_why")

    def holders(self, snapshot: Snapshot) -> Holders:
        """Who holds each of `snapshot`'s devices: nothing where no scheduler is here,
        every device unknown while the jobs are."""
        if not self.scheduler:
            return NO_HOLDERS
        if self.table is None:
            return unknown_holders(
                f"jobs unknown: {self.unknown_why or 'the scheduler did not say'}"
            )
        return self.table.holders(snapshot)

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
