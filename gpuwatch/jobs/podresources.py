"""The kubelet's pod-resources API (`k8s.io/kubelet/pkg/apis/podresources/v1`), as far as
gpuwatch reads it: which devices each container of each pod holds (`List`), by a device
plugin or a DRA claim, and which devices the node's device plugins offer
(`GetAllocatableResources`, Kubernetes 1.23 and later: which resources are GPUs).

The messages are described here rather than generated: a description of the fields read,
under their published numbers (`ListPodResourcesResponse.pod_resources = 1`;
`PodResources.name = 1, namespace = 2, containers = 3`; `ContainerResources.name = 1,
devices = 2, dynamic_resources = 5`; `ContainerDevices.resource_name = 1, device_ids = 2`;
`DynamicResource.claim_name = 2, claim_namespace = 3, claim_resources = 4`;
`ClaimResource.driver_name = 2, pool_name = 3, device_name = 4`;
`AllocatableResourcesResponse.devices = 1`), from which the protobuf library makes the
classes and reads the answer. A field it does not describe (CPU ids, memory, topology, CDI
device names) is skipped, as protobuf skips any field it does not know, so a newer kubelet's
answer reads the same. That needs no code generator and no generated module tied to one
protobuf release; the tests' kubelet stand-in compiles its own description of the whole v1
API, so the two are checked against each other.

Everything the kubelet says is input: names are made printable and cut where they enter.
An answer is bounded: at most `MAX_ANSWER_BYTES` a call (the kubelet's own limit), at most
`MAX_CONTAINERS` containers holding devices and `MAX_DEVICES` devices held or offered, both calls
and the reading of their answers within one deadline. Past any bound, the answer is not
read at all (`PodResourcesError`, saying which): a part of it would read as GPUs nobody
holds.
"""

from __future__ import annotations

import errno
import functools
import itertools
import os
import socket
import stat
import time
from collections.abc import Callable, Iterator
from typing import Any

import msgspec

from gpuwatch.jobs.job_table import MAX_JOBS
from gpuwatch.text import printable

LIST_METHOD = "/v1.PodResourcesLister/List"
ALLOCATABLE_METHOD = "/v1.PodResourcesLister/GetAllocatableResources"
MAX_ANSWER_BYTES = 16 << 20
"""The most one answer may be: the kubelet's pod-resources server's own message limit
(`podresources.DefaultMaxMsgSize`), which it never sends more than."""
MAX_CONTAINERS = MAX_JOBS
"""The most containers holding devices read: each may be a job, and a job table holds at
most as many."""
MAX_DEVICES = 250_000
"""The most devices read, of those held (all containers together) and of those offered
apart: `MAX_CONTAINERS` containers of two devices each, with room; a node's plugins offer
far fewer, a time-sliced GPU counting each replica."""
MAX_NAME_CHARS = 253
MAX_DEVICE_ID_CHARS = 96
MAX_WHY_CHARS = 160
CHECK_EVERY = 1024
"""How many containers are read between two looks at the deadline."""
# (name, number, repeated, message type or None for a string), per message of api.proto
_FIELDS: dict[str, tuple[tuple[str, int, bool, str | None], ...]] = {
    "ListPodResourcesRequest": (),
    "ListPodResourcesResponse": (("pod_resources", 1, True, "PodResources"),),
    "PodResources": (
        ("name", 1, False, None),
        ("namespace", 2, False, None),
        ("containers", 3, True, "ContainerResources"),
    ),
    "ContainerResources": (
        ("name", 1, False, None),
        ("devices", 2, True, "ContainerDevices"),
        ("dynamic_resources", 5, True, "DynamicResource"),
    ),
    "ContainerDevices": (("resource_name", 1, False, None), ("device_ids", 2, True, None)),
    "DynamicResource": (
        ("claim_name", 2, False, None),
        ("claim_namespace", 3, False, None),
        ("claim_resources", 4, True, "ClaimResource"),
    ),
    "ClaimResource": (
        ("driver_name", 2, False, None),
        ("pool_name", 3, False, None),
        ("device_name", 4, False, None),
    ),
    "AllocatableResourcesRequest": (),
    "AllocatableResourcesResponse": (("devices", 1, True, "ContainerDevices"),),
}


class PodResourcesError(Exception):
    """The kubelet could not be asked, or its answer not read; the message says why."""


class ClaimedDevice(msgspec.Struct, frozen=True):
    """A device a container holds through a DRA claim, as the kubelet names it."""

    claim: str
    """`namespace/name` of the ResourceClaim."""
    driver: str
    pool: str
    device: str


class ContainerDevices(msgspec.Struct, frozen=True):
    """The devices one container of one pod holds, as the kubelet names them."""

    namespace: str
    pod: str
    container: str
    devices: tuple[tuple[str, str], ...]
    """(resource name, device id) of each device, e.g. `("nvidia.com/gpu", "GPU-...")`."""
    claims: tuple[ClaimedDevice, ...] = ()
    """The devices it holds through DRA claims (`dynamic_resources`)."""


class PodResources(msgspec.Struct, frozen=True):
    """The kubelet's answer: the containers holding devices, and the devices offered."""

    containers: tuple[ContainerDevices, ...]
    allocatable: tuple[tuple[str, str], ...] | None
    """(resource name, device id) of each device the node's device plugins offer; `None`
    where the kubelet cannot tell (no `GetAllocatableResources`: before Kubernetes 1.23,
    or its feature gate off before 1.28)."""


class Deadline:
    """One deadline for a whole question: every call and the reading of its answer."""

    def __init__(self, timeout_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.timeout_s = timeout_s
        self._clock = clock
        self._ends_at = clock() + timeout_s

    def left_s(self) -> float:
        """Seconds left; `PodResourcesError` when none are."""
        left = self._ends_at - self._clock()
        if left <= 0:
            raise PodResourcesError(f"the kubelet did not answer within {self.timeout_s:g}s")
        return left

    def check(self, doing: str) -> None:
        """`PodResourcesError` naming what was being done when the deadline has passed."""
        if self._clock() >= self._ends_at:
            raise PodResourcesError(f"{doing} took over {self.timeout_s:g}s")


def read_pod_resources(socket_path: str, deadline: Deadline) -> PodResources:
    """Every container of every pod on this node holding a device, and the devices the
    node's plugins offer, from the kubelet at `socket_path`; `PodResourcesError` when it
    cannot be asked, or its answer is not read whole by `deadline` (connecting included)."""
    _check_socket(socket_path)
    try:
        import grpc  # here: an optional extra, ~100 ms to import; only a kubelet's node needs it
    except ImportError:
        raise PodResourcesError(
            "grpcio is not installed (pip install 'gpuwatch[kubernetes]')"
        ) from None
    options = [("grpc.max_receive_message_length", MAX_ANSWER_BYTES), ("grpc.enable_retries", 0)]
    with grpc.insecure_channel(f"unix:{os.path.abspath(socket_path)}", options=options) as channel:
        listed = _call(channel, LIST_METHOD, socket_path, deadline)
        containers = tuple(_containers(listed, deadline))
        try:
            offered = _call(channel, ALLOCATABLE_METHOD, socket_path, deadline)
        except _NotOffered:
            return PodResources(containers, None)
    return PodResources(containers, _allocatable(offered, deadline))


class _NotOffered(Exception):
    """The kubelet has no `GetAllocatableResources` (or has it turned off)."""


def _call(channel: Any, method: str, socket_path: str, deadline: Deadline) -> Any:
    """The answer to `method`, asked with the time left (a channel, its messages and its
    errors are grpc's and protobuf's, untyped: `Any`)."""
    import grpc  # imported already by the caller

    request_class, response_class = _messages(method)
    call = channel.unary_unary(
        method,
        request_serializer=request_class.SerializeToString,
        response_deserializer=response_class.FromString,
    )
    try:
        return call(request_class(), timeout=deadline.left_s())
    except grpc.RpcError as error:
        if method == ALLOCATABLE_METHOD and _not_offered(error):
            raise _NotOffered from None
        raise PodResourcesError(_why(error, socket_path, deadline)) from None


def _not_offered(error: Any) -> bool:
    """Whether the kubelet lacks the call (before 1.23) or has it off (1.21-1.27's feature
    gate `KubeletPodResourcesGetAllocatable`, which answers UNKNOWN, saying so)."""
    import grpc  # imported already by the caller

    code = error.code() if isinstance(error, grpc.Call) else None
    if code is grpc.StatusCode.UNIMPLEMENTED:
        return True
    said = str(error.details() or "")
    return code is grpc.StatusCode.UNKNOWN and "GetAllocatableResources disabled" in said


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


def _why(error: Exception, socket_path: str, deadline: Deadline) -> str:
    import grpc  # imported already by the caller

    if not isinstance(error, grpc.Call):
        return cut(f"the kubelet's pod-resources API failed: {error!r}")
    code, details = error.code(), printable(str(error.details() or ""))
    if code is grpc.StatusCode.DEADLINE_EXCEEDED:
        return f"the kubelet did not answer within {deadline.timeout_s:g}s"
    if code is grpc.StatusCode.UNAVAILABLE:
        return cut(_unavailable_why(socket_path))
    if code is grpc.StatusCode.RESOURCE_EXHAUSTED and "larger than max" in details:
        return (
            f"the kubelet's answer is over {MAX_ANSWER_BYTES >> 20} MiB, the most gpuwatch "
            "reads (the kubelet's own limit)"
        )
    if code is grpc.StatusCode.UNIMPLEMENTED:
        return "this kubelet has no pod-resources v1 API (Kubernetes 1.20 or later has it)"
    return cut(f"the kubelet's pod-resources API failed: {code.name}: {details}")


def _unavailable_why(socket_path: str) -> str:
    """Why gRPC found nobody to ask at `socket_path`, told apart by connecting once more
    without it: not permitted, nobody listening, or a listener that hung up."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(socket_path)
        except PermissionError:
            return (
                f"{socket_path}: permission denied connecting (the kubelet's socket is "
                "root's: run as root, or through a relay that is)"
            )
        except OSError as error:
            if error.errno not in (errno.ECONNREFUSED, errno.ENOENT):
                return f"{socket_path}: {error.strerror or error!r} (is the kubelet running?)"
            return f"nothing answers at {socket_path} (is the kubelet running?)"
    return f"{socket_path} closed the connection without answering (is the kubelet running?)"


def cut(text: str, limit: int = MAX_WHY_CHARS) -> str:
    """`text`, cut to at most `limit` characters (an ellipsis ending a cut one)."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


@functools.cache
def _messages(method: str) -> tuple[Any, Any]:
    """The request and response classes of `method`, made by protobuf from `_FIELDS` in a
    pool of their own (another description of package `v1` in the same process cannot
    clash with it)."""
    names = {
        LIST_METHOD: ("ListPodResourcesRequest", "ListPodResourcesResponse"),
        ALLOCATABLE_METHOD: ("AllocatableResourcesRequest", "AllocatableResourcesResponse"),
    }[method]
    pool = _pool()
    request, response = (_message_class(pool.FindMessageTypeByName(f"v1.{name}")) for name in names)
    return request, response


@functools.cache
def _pool() -> Any:
    # here, with grpc: ~60 ms to import, and an optional extra
    from google.protobuf import descriptor_pb2, descriptor_pool

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
    return pool


def _message_class(descriptor: Any) -> Any:
    from google.protobuf import message_factory  # imported already by `_pool`

    return message_factory.GetMessageClass(descriptor)


def _containers(answer: Any, deadline: Deadline) -> Iterator[ContainerDevices]:
    """Each container holding a device, its names checked (a message built from a
    description has no static type: `Any`); `PodResourcesError` past `MAX_CONTAINERS`,
    `MAX_DEVICES` or the deadline."""
    containers = held = 0
    for pod in answer.pod_resources:
        for container in pod.containers:
            devices = _pairs(container.devices, MAX_DEVICES - held)
            claims = tuple(itertools.islice(_claims(container), MAX_DEVICES - held + 1))
            if not devices and not claims:
                continue
            containers, held = containers + 1, held + len(devices) + len(claims)
            if containers > MAX_CONTAINERS:
                raise PodResourcesError(
                    f"the kubelet lists over {MAX_CONTAINERS:,} containers holding devices, "
                    "more than gpuwatch reads"
                )
            if held > MAX_DEVICES:
                raise PodResourcesError(
                    f"the kubelet lists over {MAX_DEVICES:,} devices held, more than gpuwatch reads"
                )
            if containers % CHECK_EVERY == 0:
                deadline.check(f"reading the kubelet's answer ({containers:,} containers so far)")
            yield ContainerDevices(
                _name(pod.namespace), _name(pod.name), _name(container.name), devices, claims
            )


def _pairs(devices: Any, room: int) -> tuple[tuple[str, str], ...]:
    """(resource name, device id) of each device of `devices` (`ContainerDevices`
    messages), at most `room + 1` of them: one more than fits says there are too many."""
    pairs = ((device.resource_name, i) for device in devices for i in device.device_ids)
    return tuple(
        (_name(resource), _name(device_id, MAX_DEVICE_ID_CHARS))
        for resource, device_id in itertools.islice(pairs, max(room, 0) + 1)
    )


def _claims(container: Any) -> Iterator[ClaimedDevice]:
    for claimed in container.dynamic_resources:
        claim = f"{_name(claimed.claim_namespace)}/{_name(claimed.claim_name)}"
        if not claimed.claim_resources:  # a claim that names no device may still hold one
            yield ClaimedDevice(claim, "", "", "")
        for resource in claimed.claim_resources:
            yield ClaimedDevice(
                claim,
                _name(resource.driver_name),
                _name(resource.pool_name),
                _name(resource.device_name),
            )


def _allocatable(answer: Any, deadline: Deadline) -> tuple[tuple[str, str], ...]:
    offered = _pairs(answer.devices, MAX_DEVICES)
    if len(offered) > MAX_DEVICES:
        raise PodResourcesError(
            f"the kubelet's device plugins offer over {MAX_DEVICES:,} devices, "
            "more than gpuwatch reads"
        )
    deadline.check("reading the devices the kubelet offers")
    return offered


def _name(text: str, limit: int = MAX_NAME_CHARS) -> str:
    """A name the kubelet told, printable; one over `limit` is cut and ends in `…`, so that
    it names nothing."""
    return printable(cut(text, limit + 1) if len(text) > limit else text)
