"""Which Kubernetes pods hold this node's GPUs: the kubelet's pod-resources API, read as
dcgm-exporter reads it, behind the same `JobEngine` interface as Slurm.

`KubeletPods` asks the kubelet (`podresources`) on a thread of its own, one deadline for the
whole question, and makes each container holding NVIDIA GPUs or MIG devices a `Job`:
`namespace/pod`, named after the container, holding its devices by UUID, whatever form of
id its device plugin gave them (`kubelet_ids`, through the snapshot `observe` is given).

A device is a GPU or MIG device when its id can only be one (an NVML UUID, GKE's
`nvidiaN`), its resource is one of the GPU plugins' own names (`nvidia.com/gpu`,
`nvidia.com/gpu.shared`, `nvidia.com/mig-*`), or the devices its resource offers
(`GetAllocatableResources`) include such ids, whatever the resource is called
(`nvidia.com/a100`, another prefix). The offered devices also tell that `nvidia.com/hostdev`
(NVIDIA's network operator: NICs, by PCI address) is no GPU. A resource the kubelet does
not list (a kubelet before 1.23, a device plugin gone) is taken for GPUs by its name
alone, `nvidia.com/...`, and a device of it that cannot be mapped says so.

Nothing that cannot be read is taken for "not held": a device of NVIDIA's whose id cannot
be mapped, and every device a container holds by a DRA claim (`dynamic_resources`: the
kubelet names it by driver, pool and device, which only the API server's ResourceSlices
tie to a GPU), is a `Doubt` of the table. It names the GPUs it may be on, or none, and
then the node's every device has unknown holders; the rest of the table stands. So a DRA
claim makes the whole node's holders unknown rather than the engine's answer: the pods
that are known are still shown, and the claim in doubt is named.

A kubelet that is absent, refuses, hangs, hangs up, is not permitted, or whose answer is
too large or not read whole within the deadline gives "jobs unknown" with the reason;
nothing else waits for it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from gpuwatch.jobs.job_table import MAX_WHY_CHARS, Doubt, Job, JobTable, Pod
from gpuwatch.jobs.kubelet_ids import (
    NVIDIA_PREFIX,
    NodeDevices,
    gpu_resource,
    index_form,
    nvidia_form,
)
from gpuwatch.jobs.kubelet_places import DEFAULT_SOCKET
from gpuwatch.jobs.podresources import (
    CHECK_EVERY,
    ContainerDevices,
    Deadline,
    PodResources,
    PodResourcesError,
    cut,
    read_pod_resources,
)
from gpuwatch.models import Snapshot

DEFAULT_TIMEOUT_S = 2.0
SOURCE = "kubelet pod-resources"


class KubeletPods:
    """This node's pods holding GPUs, from the kubelet at `socket_path`; `clock` times the
    deadline."""

    def __init__(
        self,
        socket_path: str = DEFAULT_SOCKET,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.socket_path = socket_path
        self.timeout_s = timeout_s
        self._clock = clock
        self._lock = threading.Lock()
        self._pending: threading.Thread | None = None
        self._answer: JobTable | None = None
        self._why: str | None = None
        self._snapshot: Snapshot | None = None
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
        """The node's GPUs and MIG devices: what the device plugins' ids name."""
        self._snapshot = snapshot

    def changes_path(self) -> Path | None:
        """None: nothing on the node's disk changes when a pod starts or ends."""
        return None

    def close(self) -> None:
        """Asks no more. A question under way ends at its deadline: it has no process to kill."""
        self._closed = True

    def _ask(self) -> None:
        read_at, devices = time.time(), NodeDevices(self._snapshot)
        answer: JobTable | None = None
        why: str | None = None
        try:
            deadline = Deadline(self.timeout_s, self._clock)
            told = read_pod_resources(self.socket_path, deadline)
            answer = pods_table(told, devices, read_at, deadline)
        except PodResourcesError as error:
            answer, why = None, str(error)
        except Exception as error:  # a thread's exception would be lost: keep it as the reason
            answer, why = None, cut(f"reading the kubelet failed: {error!r}")
        with self._lock:
            self._answer, self._why, self._pending = answer, why, None
            # asked before the GPUs were known: what the pods hold could not all be told
            holds = answer is not None and bool(answer.jobs or answer.doubts)
            self._lacked_gpus = holds and not devices.known


class NvidiaDevices:
    """Which of the devices a kubelet's answer holds are NVIDIA GPUs or MIG devices, by
    what it offers (`allocatable`; `None`: it does not say)."""

    def __init__(self, allocatable: Iterable[tuple[str, str]] | None) -> None:
        offered = list(allocatable or ())
        self._offered = {resource for resource, _ in offered}
        self._nvidia = {
            resource
            for resource, device_id in offered
            if nvidia_form(device_id) or index_form(resource, device_id)
        }

    def holds_gpu(self, resource: str, device_id: str) -> bool:
        """Whether the device `device_id` of `resource` is a GPU or MIG device."""
        if nvidia_form(device_id) or gpu_resource(resource):
            return True
        if resource in self._offered:
            return resource in self._nvidia
        return resource.startswith(NVIDIA_PREFIX)

    def by_name_alone(self, resource: str, device_id: str) -> bool:
        """Whether only a name other than the GPU plugin's own says it is a GPU."""
        named = nvidia_form(device_id) or gpu_resource(resource)
        return not named and resource not in self._offered


def pods_table(
    answer: PodResources, devices: NodeDevices, read_at: float, deadline: Deadline | None = None
) -> JobTable:
    """The containers holding NVIDIA devices, as jobs; those holding what cannot be
    mapped, as doubts; `PodResourcesError` where that is not done by `deadline`."""
    nvidia = NvidiaDevices(answer.allocatable)
    jobs: list[Job] = []
    doubts: list[Doubt] = []
    for count, container in enumerate(answer.containers, 1):
        if deadline is not None and count % CHECK_EVERY == 0:
            deadline.check(f"reading the kubelet's answer ({count:,} containers so far)")
        job, doubt = container_holds(container, nvidia, devices)
        jobs += [job] if job is not None else []
        doubts += [doubt] if doubt is not None else []
    table = JobTable(tuple(jobs), read_at, SOURCE, tuple(doubts))
    if deadline is not None:
        deadline.check(f"reading the kubelet's answer ({len(answer.containers):,} containers)")
    return table


def container_holds(
    container: ContainerDevices, nvidia: NvidiaDevices, devices: NodeDevices
) -> tuple[Job | None, Doubt | None]:
    """The job a container is, holding the GPUs and MIG devices it holds (`None`: none),
    and the doubt of what it holds that cannot be mapped (`None`: nothing)."""
    held: list[str] = []
    problems: list[tuple[str, tuple[str, ...]]] = []  # (why, the devices it may be on)
    for resource, device_id in container.devices:
        if not nvidia.holds_gpu(resource, device_id):
            continue
        named = devices.name(device_id)
        if named.problem is None:
            held += named.uuids
            continue
        by_name = nvidia.by_name_alone(resource, device_id)
        alone = " (a GPU by its resource's name alone)" if by_name else ""
        problems.append((f"{device_id} of {resource}: {named.problem}{alone}", named.uuids))
    for claimed in container.claims:
        device = f"{claimed.driver}/{claimed.pool}/{claimed.device}"
        problems.append((f"{device} by DRA claim {claimed.claim}: not mapped to a GPU", ()))
    pod = Pod(container.namespace, container.pod, container.container)
    job = _job(pod, tuple(dict.fromkeys(held))) if held else None
    return job, _doubt(pod, problems) if problems else None


def _job(pod: Pod, uuids: tuple[str, ...]) -> Job:
    return Job(
        job_id=f"{pod.namespace}/{pod.name}",
        user=None,
        name=pod.container,
        gpu_minor_numbers=(),
        started_at=None,
        time_limit_s=None,
        device_uuids=uuids,
        pod=pod,
    )


def _doubt(pod: Pod, problems: list[tuple[str, tuple[str, ...]]]) -> Doubt:
    """One doubt of all a container holds that cannot be mapped: on the devices each may be
    on, or on the whole node where one may be on any."""
    (first, _), more = problems[0], len(problems) - 1
    why = f"pod {pod.namespace}/{pod.name} (container {pod.container}) holds {first}"
    why += f" (and {more} more)" if more else ""
    anywhere = any(not uuids for _, uuids in problems)
    uuids = () if anywhere else tuple(dict.fromkeys(u for _, on in problems for u in on))
    return Doubt(cut(why, MAX_WHY_CHARS), device_uuids=uuids)
