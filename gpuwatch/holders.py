"""Who holds each GPU and MIG device of a node, as its cluster tells: the one model every
path reads.

A device is held by a job of the node's scheduler (a Slurm job) or by a Kubernetes pod;
or nobody can tell (`unknown_of`): the node's job engine is down, slow, malformed, too
large or not permitted (every device, `unknown_why`), or one of its records could not be
believed (the devices it names, `unknown`). `Holders` is built once per node, by one
function (`holders_on`) from what the node's engine said - in the process that asks it
(`gpuwatch.jobs.job_table.JobTable.holders`), or read back from a daemon's series by the
fleet (`gpuwatch.fleet.node_work`) - and read the same way by pick, `select()`, the
daemon's verdicts and `where`: a held device is never given out, nor one whose holders
are unknown (unless the request allows it: `Request.allow_unknown_holders`).

What holds a device in the node's own sample (its processes) and in the lease directory
(its leases) is read beside it by the placement rules, which weigh them (a shared lease,
the job's own processes); a screen shows all four.

A node without a job engine (no scheduler there, or an exporter that tells none) has
`NO_HOLDERS`: nothing held, nothing unknown.

Every holder passes one check (`holder_problem`) wherever it enters: the daemon checks
the jobs its engine tells before it publishes them, and every reader of its answers and
series checks them again by the same rules.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence

import msgspec

from gpuwatch.models import Device, MigDevice, Snapshot
from gpuwatch.text import printable, printable_fields

MAX_NAME_CHARS = 320
"""A Slurm job id is short; a pod's `namespace/name` is at most 63 + 1 + 253 characters."""
MAX_USER_CHARS = 128
"""Longer than any user name (`useradd` takes 32; a directory's `user@realm` more)."""
MAX_CONTAINER_CHARS = 253
"""The longest name Kubernetes gives anything (a DNS subdomain)."""
MAX_HOLDERS_PER_DEVICE = 1024
"""Time-sliced GPUs are shared by their replicas' pods: tens, never thousands."""
MAX_WHY_CHARS = 200
"""The longest reason a device's holders are unknown."""


class HolderKind(enum.StrEnum):
    """What holds a device for the cluster."""

    JOB = "job"
    """A job of the node's scheduler (Slurm)."""
    POD = "pod"
    """A container of a Kubernetes pod."""


class Holder(msgspec.Struct, frozen=True):
    """One holder of a device: a scheduler's job (`name` its id, with its `user`), or a
    pod's container (`name` its `namespace/pod`, with its `container`)."""

    kind: HolderKind
    name: str
    user: str | None = None
    container: str | None = None

    def __post_init__(self) -> None:
        printable_fields(self, "name", "user", "container")

    def __str__(self) -> str:
        """`job 1234 (alice)`, `pod ml/train-0 (container main)`."""
        if self.kind is HolderKind.POD:
            return f"pod {self.name}" + (f" (container {self.container})" if self.container else "")
        return f"job {self.name}" + (f" ({self.user})" if self.user else "")


def holder_problem(
    kind: HolderKind, name: object, user: object = None, container: object = None
) -> str | None:
    """Why a holder with these fields cannot be believed, or `None`: the one check every
    path applies, so that nothing the daemon publishes is refused by its readers. A pod's
    name is `namespace/pod`, neither part empty."""
    if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME_CHARS:
        return f"{kind} name: not 1 to {MAX_NAME_CHARS} characters"
    if kind is HolderKind.POD and any(not part for part in name.partition("/")):
        return f"pod name {printable(name)!r}: not namespace/pod"
    if user is not None and (not isinstance(user, str) or len(user) > MAX_USER_CHARS):
        return f"{kind} {printable(name)}: user not text of at most {MAX_USER_CHARS} characters"
    if container is not None and (
        not isinstance(container, str) or len(container) > MAX_CONTAINER_CHARS
    ):
        return f"pod {printable(name)}: container not text of at most {MAX_CONTAINER_CHARS}"
    return None


def device_key(device: Device) -> str:
    """How a device is named among a node's holders: its UUID, else (a MIG device an
    exporter tells no UUID of) its GPU and GPU instance, `0/GI-3`, else its GPU's index."""
    if device.uuid:
        return device.uuid
    if isinstance(device, MigDevice):
        return f"{device.gpu_index}/GI-{device.gpu_instance_id}"
    return str(device.index)


class Holders(msgspec.Struct, frozen=True):
    """Who holds each device of one node (by `device_key`), and whose holders are unknown.

    `unknown_why` set: the node's job engine did not tell, and every device's holders are
    unknown. Else `unknown` names the devices one of its records made unknown. A MIG
    device is held by whatever holds its GPU whole, and unknown where its GPU is: that is
    made so where the model is built (`holders_on`).
    """

    held: Mapping[str, tuple[Holder, ...]] = msgspec.field(default_factory=dict)
    unknown: Mapping[str, str] = msgspec.field(default_factory=dict)
    unknown_why: str | None = None

    def __post_init__(self) -> None:
        printable_fields(self, "unknown_why")

    def holders_of(self, device: Device) -> tuple[Holder, ...]:
        """Who holds `device`; none when nobody does (or nobody can tell: `unknown_of`)."""
        return self.held.get(device_key(device), ())

    def unknown_of(self, device: Device) -> str | None:
        """Why nobody can tell who holds `device`, or `None` when that is known."""
        return self.unknown_why or self.unknown.get(device_key(device))

    @property
    def known(self) -> bool:
        """Whether the node's engine told (some devices may still be unknown: `unknown`)."""
        return self.unknown_why is None

    def jobs(self) -> tuple[Holder, ...]:
        """Every holder once, in the order first met."""
        return tuple(dict.fromkeys(h for holders in self.held.values() for h in holders))


NO_HOLDERS = Holders()
"""A node whose cluster holds nothing: no job engine there, or none its exporter tells."""


def unknown_holders(why: str) -> Holders:
    """A node whose engine did not tell: every device's holders unknown, for `why`."""
    return Holders(unknown_why=_cut(why))


def holders_on(
    snapshot: Snapshot,
    held: Mapping[str, Sequence[Holder]],
    unknown: Mapping[str, str] | None = None,
    *,
    unknown_why: str | None = None,
) -> Holders:
    """The holders of `snapshot`'s devices, from what holds each (`held`, by `device_key`)
    and which are unknown (`unknown`, or all for `unknown_why`): a GPU's holders and
    unknowns are its MIG devices' too (a job given a whole GPU holds every slice of it),
    each device's holders once, at most `MAX_HOLDERS_PER_DEVICE` (more is a device nobody
    can tell about)."""
    unknown = unknown or {}
    by_gpu = {gpu.index: device_key(gpu) for gpu in snapshot.gpus}
    devices: list[Device] = [*snapshot.gpus, *snapshot.mig_devices]
    holders: dict[str, tuple[Holder, ...]] = {}
    doubts: dict[str, str] = {}
    for device in devices:
        key = device_key(device)
        parent = by_gpu.get(device.gpu_index) if isinstance(device, MigDevice) else None
        found = _once([*held.get(key, ()), *(held.get(parent, ()) if parent else ())])
        why = unknown.get(key) or (unknown.get(parent) if parent else None)
        if len(found) > MAX_HOLDERS_PER_DEVICE:
            found, why = (), why or f"over {MAX_HOLDERS_PER_DEVICE} holders told"
        if found:
            holders[key] = found
        if why is not None:
            doubts[key] = _cut(why)
    return Holders(holders, doubts, None if unknown_why is None else _cut(unknown_why))


def _once(holders: Iterable[Holder]) -> tuple[Holder, ...]:
    return tuple(dict.fromkeys(holders))


def _cut(text: str) -> str:
    return text if len(text) <= MAX_WHY_CHARS else text[: MAX_WHY_CHARS - 1] + "…"
