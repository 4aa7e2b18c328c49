"""Which Kubernetes pods hold this node's GPUs: the kubelet's pod-resources API, read as
dcgm-exporter reads it, behind the same `JobEngine` interface as Slurm.

`KubeletPods` asks `List` (`podresources`) on a thread of its own, with a deadline, and
makes each container holding NVIDIA devices a `Job`: `namespace/pod`, named after the
container, holding its devices by UUID. NVIDIA devices are those of `nvidia.com/gpu` (and
`nvidia.com/gpu.shared`, a time-sliced GPU's renamed resource) and of `nvidia.com/mig-*`.
The device plugin names them by UUID (`GPU-...`, `MIG-...`), a time-sliced replica as
`UUID::N`, or, under its `index` strategy, by NVML index (matched through the GPUs
`observe` is given). An id in any other form is kept as it is: it matches no device, and
`/v1/jobs` shows it.

A kubelet that is absent, refuses, or does not answer within the deadline gives "jobs
unknown" with the reason; nothing else waits for it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

from gpuwatch.jobs.job_table import Job, JobTable, Pod
from gpuwatch.jobs.kubelet_places import DEFAULT_SOCKET
from gpuwatch.jobs.podresources import ContainerDevices, PodResourcesError, list_devices
from gpuwatch.models import Snapshot

DEFAULT_TIMEOUT_S = 2.0
SOURCE = "kubelet pod-resources"
GPU_RESOURCES = ("nvidia.com/gpu", "nvidia.com/gpu.shared")
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
_REPLICA = "::"


class KubeletPods:
    """This node's pods holding GPUs, from the kubelet at `socket_path`."""

    def __init__(
        self,
        socket_path: str = DEFAULT_SOCKET,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        self.socket_path = socket_path
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._pending: threading.Thread | None = None
        self._answer: JobTable | None = None
        self._why: str | None = None
        self._uuid_of_index: dict[int, str] = {}
        self._lacked_gpus = False
        self._closed = False

    def start(self) -> threading.Thread | None:
        """Asks the kubelet unless a question is under way; the question under way."""
        with self._lock:
            if self._pending is None and not self._closed:
                self._pending = threading.Thread(target=self._ask, daemon=True, name="kubelet")
                self._pending.start()
            return self._pending

    def latest(self) -> JobTable | None:
        with self._lock:
            return self._answer

    def lacked_gpus(self) -> bool:
        return self._lacked_gpus

    def unknown_why(self) -> str:
        return self._why or "the kubelet has not answered yet"

    def describe(self) -> str:
        return f"the pods holding GPUs, from the kubelet at {self.socket_path}"

    def observe(self, snapshot: Snapshot) -> None:
        """Each GPU's UUID by NVML index: the device plugin's `index` strategy names GPUs so."""
        self._uuid_of_index = {gpu.index: gpu.uuid for gpu in snapshot.gpus if gpu.uuid}

    def changes_path(self) -> Path | None:
        """None: nothing on the node's disk changes when a pod starts or ends."""
        return None

    def close(self) -> None:
        """Asks no more. A question under way ends at its deadline: it has no process to kill."""
        self._closed = True

    def _ask(self) -> None:
        read_at, uuid_of_index = time.time(), self._uuid_of_index
        lacked = False
        try:
            containers = list_devices(self.socket_path, self.timeout_s)
            answer, why = pods_table(containers, uuid_of_index, read_at), None
            lacked = not uuid_of_index and any(_by_index(c) for c in containers)
        except PodResourcesError as error:
            answer, why = None, str(error)
        except Exception as error:  # a thread's exception would be lost: keep it as the reason
            answer, why = None, f"reading the kubelet failed: {error!r}"
        with self._lock:
            self._answer, self._why, self._pending = answer, why, None
            self._lacked_gpus = lacked


def pods_table(
    containers: Iterable[ContainerDevices], uuid_of_index: Mapping[int, str], read_at: float
) -> JobTable:
    """The containers holding NVIDIA devices, as jobs."""
    jobs = []
    for container in containers:
        ids = [device_id for resource, device_id in container.devices if _nvidia(resource)]
        if not ids:
            continue
        uuids = tuple(dict.fromkeys(device_uuid(device_id, uuid_of_index) for device_id in ids))
        pod = Pod(container.namespace, container.pod, container.container)
        jobs.append(
            Job(
                job_id=f"{pod.namespace}/{pod.name}",
                user=None,
                name=pod.container,
                gpu_minor_numbers=(),
                started_at=None,
                time_limit_s=None,
                device_uuids=uuids,
                pod=pod,
            )
        )
    return JobTable(tuple(jobs), read_at, SOURCE)


def _by_index(container: ContainerDevices) -> bool:
    """Whether the device plugin names a GPU of `container` by NVML index."""
    return any(
        _nvidia(resource) and device_id.split(_REPLICA, 1)[0].isdecimal()
        for resource, device_id in container.devices
    )


def _nvidia(resource: str) -> bool:
    return resource in GPU_RESOURCES or resource.startswith(MIG_RESOURCE_PREFIX)


def device_uuid(device_id: str, uuid_of_index: Mapping[int, str]) -> str:
    """The UUID a device plugin's device id names: itself, less a replica's `::N`; a GPU's
    UUID for its NVML index; else the id as it is."""
    plain = device_id.split(_REPLICA, 1)[0]
    if plain.isdecimal() and plain.isascii():
        return uuid_of_index.get(int(plain), plain)
    return plain
