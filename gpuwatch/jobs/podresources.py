"""The kubelet's pod-resources API (`k8s.io/kubelet/pkg/apis/podresources/v1`), as far as
gpuwatch reads it: which devices each container of each pod holds, by the `List` call.

The messages are described here rather than generated: a description of the fields read,
under their published numbers (`ListPodResourcesResponse.pod_resources = 1`;
`PodResources.name = 1, namespace = 2, containers = 3`; `ContainerResources.name = 1,
devices = 2`; `ContainerDevices.resource_name = 1, device_ids = 2`), from which the
protobuf library makes the classes and reads the answer. A field it does not describe (CPU
ids, memory, topology, dynamic resources) is skipped, as protobuf skips any field it does
not know, so a newer kubelet's answer reads the same. That needs no code generator and no
generated module tied to one protobuf release; the tests' kubelet stand-in compiles its
own description of the whole v1 API, so the two are checked against each other.

Everything the kubelet says is input: names are made printable and cut where they enter,
and an answer is read only up to `MAX_ANSWER_BYTES`.
"""

from __future__ import annotations

import errno
import functools
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from gpuwatch.text import printable

LIST_METHOD = "/v1.PodResourcesLister/List"
MAX_ANSWER_BYTES = 16 << 20
"""The most the kubelet itself sends (its pod-resources server's message limit)."""
MAX_CONTAINERS = 100_000
MAX_NAME_CHARS = 253
MAX_DEVICE_ID_CHARS = 96
MAX_WHY_CHARS = 160
# (name, number, repeated, message type or None for a string), per message of api.proto
_FIELDS: dict[str, tuple[tuple[str, int, bool, str | None], ...]] = {
    "ListPodResourcesRequest": (),
    "ListPodResourcesResponse": (("pod_resources", 1, True, "PodResources"),),
    "PodResources": (
        ("name", 1, False, None),
        ("namespace", 2, False, None),
        ("containers", 3, True, "ContainerResources"),
    ),
    "ContainerResources": (("name", 1, False, None), ("devices", 2, True, "ContainerDevices")),
    "ContainerDevices": (("resource_name", 1, False, None), ("device_ids", 2, True, None)),
}


class PodResourcesError(Exception):
    """The kubelet could not be asked, or did not answer in time; the message says why."""


@dataclass(frozen=True, slots=True)
class ContainerDevices:
    """The devices one container of one pod holds, as the kubelet names them."""

    namespace: str
    pod: str
    container: str
    devices: tuple[tuple[str, str], ...]
    """(resource name, device id) of each device, e.g. `("nvidia.com/gpu", "GPU-...")`."""


def list_devices(socket_path: str, timeout_s: float) -> list[ContainerDevices]:
    """Every container of every pod on this node that holds a device, by the kubelet at
    `socket_path`; `PodResourcesError` when it cannot be asked or does not answer within
    `timeout_s` (connecting included)."""
    _check_socket(socket_path)
    try:
        import grpc  # here: an optional extra, ~100 ms to import; only a kubelet's node needs it
    except ImportError:
        raise PodResourcesError(
            "grpcio is not installed (pip install 'gpuwatch[kubernetes]')"
        ) from None
    request_class, response_class = _messages()
    options = [("grpc.max_receive_message_length", MAX_ANSWER_BYTES), ("grpc.enable_retries", 0)]
    with grpc.insecure_channel(f"unix:{os.path.abspath(socket_path)}", options=options) as channel:
        call = channel.unary_unary(
            LIST_METHOD,
            request_serializer=request_class.SerializeToString,
            response_deserializer=response_class.FromString,
        )
        try:
            answer = call(request_class(), timeout=timeout_s)
        except grpc.RpcError as error:
            raise PodResourcesError(_why(error, socket_path, timeout_s)) from None
    return list(_containers(answer))


def _check_socket(path: str) -> None:
    """Says plainly why there is nothing to ask at `path`, before gRPC would say it its way."""
    try:
        mode = os.stat(path).st_mode
    except OSError as error:
        if error.errno == errno.EACCES:
            raise PodResourcesError(
                f"{path}: permission denied (the kubelet's is root's)"
            ) from None
        raise PodResourcesError(f"no kubelet pod-resources socket at {path}") from None
    if not stat.S_ISSOCK(mode):
        raise PodResourcesError(f"{path} is not a socket")


def _why(error: Exception, socket_path: str, timeout_s: float) -> str:
    import grpc  # imported already by the caller

    if not isinstance(error, grpc.Call):
        return _cut(f"the kubelet's pod-resources API failed: {error!r}")
    code, details = error.code(), printable(str(error.details() or ""))
    if code is grpc.StatusCode.DEADLINE_EXCEEDED:
        return f"the kubelet did not answer within {timeout_s:g}s"
    if code is grpc.StatusCode.UNAVAILABLE:
        return _cut(f"nothing answers at {socket_path} (is the kubelet running?)")
    if code is grpc.StatusCode.UNIMPLEMENTED:
        return "this kubelet has no pod-resources v1 API (Kubernetes 1.20 or later has it)"
    return _cut(f"the kubelet's pod-resources API failed: {code.name}: {details}")


def _cut(text: str) -> str:
    return text if len(text) <= MAX_WHY_CHARS else text[: MAX_WHY_CHARS - 1] + "…"


@functools.cache
def _messages() -> tuple[Any, Any]:
    """The classes of `ListPodResourcesRequest` and `ListPodResourcesResponse`, made by
    protobuf from `_FIELDS` in a pool of their own (another description of package `v1`
    in the same process cannot clash with it)."""
    # here, with grpc: ~60 ms to import, and an optional extra
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    described = descriptor_pb2.FileDescriptorProto(
        name="gpuwatch/podresources_v1.proto", package="v1", syntax="proto3"
    )
    kinds = descriptor_pb2.FieldDescriptorProto
    for message, fields in _FIELDS.items():
        added = described.message_type.add(name=message)
        for name, number, repeated, type_name in fields:
            field = added.field.add(name=name, number=number, json_name=name)
            field.label = kinds.LABEL_REPEATED if repeated else kinds.LABEL_OPTIONAL
            if type_name is None:
                field.type = kinds.TYPE_STRING
            else:
                field.type, field.type_name = kinds.TYPE_MESSAGE, f".v1.{type_name}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(described)
    request, response = (
        message_factory.GetMessageClass(pool.FindMessageTypeByName(f"v1.{name}"))
        for name in ("ListPodResourcesRequest", "ListPodResourcesResponse")
    )
    return request, response


def _containers(answer: Any) -> Iterator[ContainerDevices]:
    """Each container holding a device, its names checked (a message built from a
    description has no static type: `Any`)."""
    count = 0
    for pod in answer.pod_resources:
        for container in pod.containers:
            devices = tuple(
                (_name(device.resource_name), _name(device_id, MAX_DEVICE_ID_CHARS))
                for device in container.devices
                for device_id in device.device_ids
            )
            if not devices:
                continue
            count += 1
            if count > MAX_CONTAINERS:
                return
            yield ContainerDevices(
                _name(pod.namespace), _name(pod.name), _name(container.name), devices
            )


def _name(text: str, limit: int = MAX_NAME_CHARS) -> str:
    return printable(text[:limit])
