"""A stand-in for the kubelet's pod-resources API: a gRPC server on a Unix socket speaking
the published `podresources/v1` (tests/helpers/kubelet/podresources_v1.proto, compiled
with grpcio-tools when first used), answering `List` with the pods a test gives it.

Like a real kubelet it sends every field of the API, those gpuwatch does not read among
them (CPU ids, memory, topology, dynamic resources, devices that are not NVIDIA's). It can
be made slow (`List` answers only once released) or taken away.
"""

from __future__ import annotations

import functools
import shutil
import sys
import tempfile
import threading
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

PROTO_DIR = Path(__file__).with_name("kubelet")
SLOW_CAP_S = 60.0
"""A slow `List` answers at the latest after this, so that no test can hang on it."""


@dataclass(frozen=True)
class Container:
    """A container and the devices the kubelet gave it: (resource name, device ids)."""

    name: str
    devices: tuple[tuple[str, tuple[str, ...]], ...] = ()


@dataclass(frozen=True)
class PodSpec:
    namespace: str
    name: str
    containers: tuple[Container, ...] = ()


def gpu_pod(namespace: str, name: str, container: str, *uuids: str) -> PodSpec:
    """A pod whose one container holds whole GPUs (`nvidia.com/gpu`)."""
    return PodSpec(namespace, name, (Container(container, (("nvidia.com/gpu", uuids),)),))


def mig_pod(namespace: str, name: str, container: str, profile: str, *uuids: str) -> PodSpec:
    """A pod whose one container holds MIG devices (`nvidia.com/mig-PROFILE`)."""
    resource = f"nvidia.com/mig-{profile}"
    return PodSpec(namespace, name, (Container(container, ((resource, uuids),)),))


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
    """The stand-in's state: what `List` answers, and whether it is slow."""

    socket_path: str
    pods: list[PodSpec] = field(default_factory=list)
    calls: int = 0
    _released: threading.Event = field(default_factory=threading.Event)

    def slow(self) -> None:
        """`List` answers only when `release()` is called (or after `SLOW_CAP_S`)."""
        self._released.clear()

    def release(self) -> None:
        self._released.set()

    def answer(self) -> Any:
        messages, _ = api()
        return messages.ListPodResourcesResponse(
            pod_resources=[_pod(messages, pod) for pod in self.pods]
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
                messages.ContainerDevices(resource_name="example.com/fpga", device_ids=["fpga0"]),
            ],
            cpu_ids=[2, 3],
            memory=[messages.ContainerMemory(memory_type="memory", size=1 << 30)],
            dynamic_resources=[
                messages.DynamicResource(
                    claim_name="scratch",
                    claim_namespace=pod.namespace,
                    claim_resources=[
                        messages.ClaimResource(
                            cdi_devices=[messages.CDIDevice(name="example.com/disk=d0")],
                            driver_name="example.com",
                            pool_name="node",
                            device_name="d0",
                        )
                    ],
                )
            ],
        )
        for container in pod.containers
    ]
    return messages.PodResources(name=pod.name, namespace=pod.namespace, containers=containers)


@contextmanager
def kubelet_stand_in(*pods: PodSpec) -> Iterator[Kubelet]:
    """A stand-in serving `pods` on a socket of its own (under /tmp: a Unix socket's path
    must be short) until the block ends."""
    messages, services = api()
    folder = tempfile.mkdtemp(prefix="kubelet-")
    kubelet = Kubelet(f"{folder}/kubelet.sock", list(pods))
    kubelet.release()

    class Lister(services.PodResourcesListerServicer):  # type: ignore[misc,name-defined]
        def List(self, request: Any, context: Any) -> Any:  # the API names its calls so
            kubelet.calls += 1
            kubelet._released.wait(SLOW_CAP_S)
            return kubelet.answer()

        def GetAllocatableResources(self, request: Any, context: Any) -> Any:
            return messages.AllocatableResourcesResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    services.add_PodResourcesListerServicer_to_server(Lister(), server)
    server.add_insecure_port(f"unix:{kubelet.socket_path}")
    server.start()
    try:
        yield kubelet
    finally:
        kubelet.release()
        server.stop(grace=None)
        shutil.rmtree(folder, ignore_errors=True)
