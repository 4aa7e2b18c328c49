"""What a gpuwatch daemon tells of the work around its GPUs besides the snapshot: the line
of jobs waiting for them, the scheduler's job on each, and who holds each device.

    gpuwatch_lease_waiters{hostname}                      jobs in line (`pick --wait`)
    gpuwatch_lease_longest_wait_seconds{hostname}         how long the oldest has waited
    gpuwatch_jobs_known{hostname}                         1 while the scheduler answers, else 0
    gpuwatch_gpu_job_info{gpu, uuid, hostname, job_id, job_user} 1    per GPU a job holds
    gpuwatch_gpu_allocated_idle_seconds{gpu, uuid, hostname}     how long that job left it idle
    gpuwatch_holders_known{hostname}                      0 where its scheduler does not tell
    gpuwatch_gpu_pod_info{gpu, uuid, hostname, namespace, pod, container} 1  per device a pod holds
    gpuwatch_gpu_holders_unknown{gpu, uuid, hostname}     1 per device nobody can tell about

`claims` reads who holds each device (`gpuwatch.holders`) as the daemon built it: its jobs
and pods, and what it could not tell, node-wide (`gpuwatch_holders_known` 0) or device by
device. A holder whose labels fail the one check (`holder_problem`) makes its device
unknown, never free. A daemon older than `gpuwatch_holders_known` cannot say whether its
scheduler tells: its jobs and pods hold their devices, and nothing more is known.

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
from gpuwatch.fleet.mapped import Claims
from gpuwatch.fleet_model import GpuJob
from gpuwatch.holders import Holder, HolderKind, device_key, holder_problem
from gpuwatch.models import GpuSample, MigDevice

WAITERS = "gpuwatch_lease_waiters"
LONGEST_WAIT = "gpuwatch_lease_longest_wait_seconds"
JOBS_KNOWN = "gpuwatch_jobs_known"
JOB_INFO = "gpuwatch_gpu_job_info"
ALLOCATED_IDLE = "gpuwatch_gpu_allocated_idle_seconds"
HOLDERS_KNOWN = "gpuwatch_holders_known"
POD_INFO = "gpuwatch_gpu_pod_info"
HOLDERS_UNKNOWN = "gpuwatch_gpu_holders_unknown"
HOLDER_FAMILIES = (POD_INFO, HOLDERS_UNKNOWN)
"""Read with all their labels: which device (`gpu`, `uuid`), and whose."""
DAEMON_CANNOT_TELL = (
    "its daemon cannot tell who holds its GPUs: its scheduler does not answer "
    "(gpuwatch status there says why)"
)
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


def claims(
    by_name: Mapping[str, Sequence[Sample]],
    gpus: Sequence[GpuSample],
    mig_devices: Sequence[MigDevice],
) -> Claims:
    """Who the daemon says holds each of these devices, and what it cannot tell."""
    keys = _DeviceKeys(gpus, mig_devices)
    held: dict[str, list[Holder]] = {}
    unknown: dict[str, str] = {}
    for sample in by_name.get(JOB_INFO, ()):
        key = keys.of(sample.labels)
        user = sample.labels.get("job_user") or None
        _claim(held, unknown, key, HolderKind.JOB, sample.labels.get("job_id"), user, None)
    for sample in by_name.get(POD_INFO, ()):
        labels = sample.labels
        name = f"{labels.get('namespace', '')}/{labels.get('pod', '')}"
        container = labels.get("container") or None
        _claim(held, unknown, keys.of(labels), HolderKind.POD, name, None, container)
    for sample in by_name.get(HOLDERS_UNKNOWN, ()):
        if (key := keys.of(sample.labels)) is not None and sample.value == 1:
            unknown[key] = "a record of its scheduler's answer naming it cannot be believed"
    said = _first(by_name, HOLDERS_KNOWN)
    why = DAEMON_CANNOT_TELL if said is not None and m.flag(said) is not True else None
    return Claims({k: tuple(v) for k, v in held.items()}, unknown, why)


def _claim(
    held: dict[str, list[Holder]],
    unknown: dict[str, str],
    key: str | None,
    kind: HolderKind,
    name: str | None,
    user: str | None,
    container: str | None,
) -> None:
    """Adds one holder of the device `key`, or makes that device unknown where the holder
    cannot be believed. A holder of no device this node shows is dropped (the device is
    not offered either)."""
    if key is None:
        return
    if (why := holder_problem(kind, name, user, container)) is not None:
        unknown[key] = f"its daemon names a holder that cannot be believed ({why})"
    else:
        assert name is not None
        held.setdefault(key, []).append(Holder(kind, name, user, container))


class _DeviceKeys:
    """A device's key (`device_key`) from a series' `uuid` and `gpu` labels: the device
    with that UUID, else the GPU with that index; a MIG device (`gpu` of `GPU:MIG`) the
    node does not show is its GPU, whose holders are then in doubt with it."""

    def __init__(self, gpus: Sequence[GpuSample], mig_devices: Sequence[MigDevice]) -> None:
        devices: list[GpuSample | MigDevice] = [*gpus, *mig_devices]
        self._by_uuid = {device.uuid: device_key(device) for device in devices if device.uuid}
        self._by_index = {gpu.index: device_key(gpu) for gpu in gpus}

    def of(self, labels: Mapping[str, str]) -> str | None:
        uuid = labels.get("uuid")
        if uuid and uuid in self._by_uuid:
            return self._by_uuid[uuid]
        gpu, _, _ = labels.get("gpu", "").partition(":")
        index = m.index_of(gpu)
        return None if index is None else self._by_index.get(index)
