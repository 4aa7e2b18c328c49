"""A stand-in for the kubelet's pod-resources API: a gRPC server on a Unix socket speaking
the published `podresources/v1` (tests/helpers/kubelet/podresources_v1.proto, compiled
with grpcio-tools when first used), answering `List` with the pods a test gives it and
`GetAllocatableResources` with the devices its device plugins offer.

Like a real kubelet it sends every field of the API, those gpuwatch does not read among
them (CPU ids, memory, topology, CDI device names, devices that are not NVIDIA's). It can
be made slow (its calls answer only once released), crash under a call, answer as a
kubelet older than 1.23 (no `GetAllocatableResources`) or taken away; and beside it stand
sockets that are no kubelet at all: one that never speaks, one that hangs up.
"""

from __future__ import annotations

import functools
import shutil
import socket
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

PROTO_DIR = Path(__file__).with_name("kubelet")
SLOW_CAP_S = 60.0
"""A slow call answers at the latest after this, so that no test can hang on it."""
FPGA = ("example.com/fpga", "fpga0")
"""A device of another vendor's plugin, which every container also holds."""


@dataclass(frozen=True)
class Claim:
    """A device a container holds through a DRA claim (`dynamic_resources`)."""

    claim: str
    driver: str
    device: str
    pool: str = "node"
    cdi_device: str = ""


@dataclass(frozen=True)
class Container:
    """A container, the devices the kubelet gave it (resource name, device ids), and the
    devices it holds through DRA claims."""

    name: str
    devices: tuple[tuple[str, tuple[str, ...]], ...] = ()
    claims: tuple[Claim, ...] = ()


@dataclass(frozen=True)
class PodSpec:
    namespace: str
    name: str
    containers: tuple[Container, ...] = ()


def gpu_pod(namespace: str, name: str, container: str, *uuids: str) -> PodSpec:
    """A pod whose one container holds whole GPUs (`nvidia.com/gpu`)."""
    return device_pod(namespace, name, container, "nvidia.com/gpu", *uuids)


def mig_pod(namespace: str, name: str, container: str, profile: str, *uuids: str) -> PodSpec:
    """A pod whose one container holds MIG devices (`nvidia.com/mig-PROFILE`)."""
    return device_pod(namespace, name, container, f"nvidia.com/mig-{profile}", *uuids)


def device_pod(namespace: str, name: str, container: str, resource: str, *ids: str) -> PodSpec:
    """A pod whose one container holds devices `ids` of `resource`."""
    return PodSpec(namespace, name, (Container(container, ((resource, ids),)),))


@functools.cache
def api() -> tuple[Any, Any]:
    """The (messages, services) modules grpcio-tools makes of the published API."""
    sys.path.insert(0, str(PROTO_DIR))
    try:
        return grpc.protos_and_services("podresources_v1.proto")  # type: ignore[no-any-return]
    finally:
        sys.path.remove(str(PROTO_DIR))


@dataclass
class Kubelet:
    """The stand-in's state: what its calls answer, and whether they are slow.

    `allocatable`: the devices `GetAllocatableResources` offers, by resource; `None`, those
    its pods hold (and the FPGA). `allocatable_error`: the call fails so instead (a
    kubelet before 1.23: `UNIMPLEMENTED`). `after_list`: called once `List` has its answer,
    before it is sent.
    """

    socket_path: str
    pods: list[PodSpec] = field(default_factory=list)
    allocatable: dict[str, tuple[str, ...]] | None = None
    allocatable_error: tuple[grpc.StatusCode, str] | None = None
    after_list: Callable[[], None] | None = None
    calls: int = 0
    _released: threading.Event = field(default_factory=threading.Event)
    _server: Any = None

    def slow(self) -> None:
        """Its calls answer only when `release()` is called (or after `SLOW_CAP_S`)."""
        self._released.clear()

    def release(self) -> None:
        self._released.set()

    def crash(self) -> None:
        """Stops serving at once, ending every call under way, as a kubelet that dies."""
        self._server.stop(grace=None).wait()

    def answer(self) -> Any:
        messages, _ = api()
        return messages.ListPodResourcesResponse(
            pod_resources=[_pod(messages, pod) for pod in self.pods]
        )

    def offered(self) -> Any:
        messages, _ = api()
        offered = self.allocatable
        if offered is None:
            held: dict[str, dict[str, None]] = {FPGA[0]: {FPGA[1]: None}}
            for pod in self.pods:
                for container in pod.containers:
                    for resource, ids in container.devices:
                        held.setdefault(resource, {}).update(dict.fromkeys(ids))
            offered = {resource: tuple(ids) for resource, ids in held.items()}
        return messages.AllocatableResourcesResponse(
            devices=[
                messages.ContainerDevices(resource_name=resource, device_ids=list(ids))
                for resource, ids in offered.items()
            ],
            cpu_ids=[0, 1, 2, 3],
        )


def _pod(messages: Any, pod: PodSpec) -> Any:
    topology = messages.TopologyInfo(nodes=[messages.NUMANode(ID=0)])
    containers = [
        messages.ContainerResources(
            name=container.name,
            devices=[
                *(
                    messages.ContainerDevices(
                        resource_name=resource, device_ids=list(ids), topology=topology
                    )
                    for resource, ids in container.devices
                ),
                # what else a kubelet hands out, which is none of gpuwatch's business
                messages.ContainerDevices(resource_name=FPGA[0], device_ids=[FPGA[1]]),
            ],
            cpu_ids=[2, 3],
            memory=[messages.ContainerMemory(memory_type="memory", size=1 << 30)],
            dynamic_resources=[_claim(messages, pod.namespace, c) for c in container.claims],
        )
        for container in pod.containers
    ]
    return messages.PodResources(name=pod.name, namespace=pod.namespace, containers=containers)


def _claim(messages: Any, namespace: str, claim: Claim) -> Any:
    cdi = [messages.CDIDevice(name=claim.cdi_device)] if claim.cdi_device else []
    return messages.DynamicResource(
        claim_name=claim.claim,
        claim_namespace=namespace,
        claim_resources=[
            messages.ClaimResource(
                cdi_devices=cdi,
                driver_name=claim.driver,
                pool_name=claim.pool,
                device_name=claim.device,
            )
        ],
    )


@contextmanager
def kubelet_stand_in(*pods: PodSpec, folder_mode: int = 0o700) -> Iterator[Kubelet]:
    """A stand-in serving `pods` on a socket of its own (under /tmp: a Unix socket's path
    must be short; in a folder of `folder_mode`) until the block ends."""
    _, services = api()
    folder = tempfile.mkdtemp(prefix="kubelet-")
    Path(folder).chmod(folder_mode)
    kubelet = Kubelet(f"{folder}/kubelet.sock", list(pods))
    kubelet.release()

    class Lister(services.PodResourcesListerServicer):  # type: ignore[misc,name-defined]
        def List(self, request: Any, context: Any) -> Any:  # the API names its calls so
            kubelet.calls += 1
            kubelet._released.wait(SLOW_CAP_S)
            answer = kubelet.answer()
            if kubelet.after_list is not None:
                kubelet.after_list()
            return answer

        def GetAllocatableResources(self, request: Any, context: Any) -> Any:
            kubelet._released.wait(SLOW_CAP_S)
            if kubelet.allocatable_error is not None:
                context.abort(*kubelet.allocatable_error)
            return kubelet.offered()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    services.add_PodResourcesListerServicer_to_server(Lister(), server)
    server.add_insecure_port(f"unix:{kubelet.socket_path}")
    server.start()
    kubelet._server = server
    try:
        yield kubelet
    finally:
        kubelet.release()
        server.stop(grace=None)
        shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def not_a_kubelet(path: str, *, hang_up: bool) -> Iterator[None]:
    """A socket at `path` that takes every connection and then says nothing, ever (or,
    `hang_up`, closes it at once), until the block ends."""
    held: list[socket.socket] = []
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(16)

    def serve() -> None:
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:  # the listener was shut: the block ended
                return
            if hang_up:
                connection.close()
            else:
                held.append(connection)

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    try:
        yield
    finally:
        listener.shutdown(socket.SHUT_RDWR)
        listener.close()
        server.join(5)
        for connection in held:
            connection.close()
