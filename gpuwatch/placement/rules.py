"""The placement rules, written once for whole GPUs and MIG devices alike.

    candidates -> qualify -> keep for waiters -> rank -> claim

`place()` runs them on plain inputs (a snapshot, the leases in force, who the cluster
says holds each device - a scheduler's job, a Kubernetes pod, or nobody can tell -, the
jobs waiting ahead) and returns a
`Choice`: the devices to give and, for every other device, one line saying why not.
No I/O happens here, so the same code answers for this machine
(`gpuwatch.placement.acquire` gathers the inputs and claims the leases) and for a
remote node's snapshot (`gpuwatch where`).

What differs between a whole GPU and a MIG device is a `Kind`: which devices
there are, which of them a request may ever have, how a device is named, and
how busy it looks (a GPU reports utilization; a MIG device does not, so its
count of other processes stands in). `gpuwatch.placement.gpus` and
`gpuwatch.placement.mig` each define one.

A job waiting ahead keeps the devices it could use from jobs behind it, so that
small jobs do not starve a large one. Since anyone can join the line, that is
bounded: only each user's first job in line keeps devices, only for
`KEEP_LIMIT_S`, and only when this node could ever meet its request.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence

import msgspec

from gpuwatch.choices import Strategy
from gpuwatch.holders import NO_HOLDERS, Holder, Holders
from gpuwatch.models import Device, Lease, ProcessKind, ProcessUsage, Snapshot
from gpuwatch.request import Request, Waiter
from gpuwatch.units import format_size

_GIB = 1 << 30
KEEP_LIMIT_S = 1800.0
"""How long a waiting job keeps devices from later jobs; after that it waits as their equal."""
GRAPHICS_ALLOWANCE_BYTES = 256 << 20
"""A graphics process using at most this much (Xorg, a desktop) does not make a GPU in use."""
HOLDERS_UNKNOWN = "holders unknown"
"""How a device whose holders nobody can tell is refused (`Choice.reasons` start so)."""


class Choice(msgspec.Struct, frozen=True):
    """The outcome: `chosen` best first (empty unless all `count` qualify), and why not the rest."""

    chosen: tuple[Device, ...]
    reasons: tuple[str, ...]
    qualifying: int = 0
    in_use: int = 0
    """How many were left out only because they are in use (see `in_use()`)."""
    holders_unknown: int = 0
    """How many were left out because nobody can tell who holds them (`Holders`)."""
    free_bytes: tuple[int, ...] = ()
    """The free memory of each chosen device, less what shared leases there have declared
    and not yet allocated: what the job can count on."""

    @property
    def satisfied(self) -> bool:
        return bool(self.chosen)


class Candidate(msgspec.Struct):
    """A device weighed for one job: its free memory net of promises, its leases, its
    processes, and what the asking job owns there."""

    device: Device
    free_bytes: int = 0
    promised_bytes: int = 0
    """Declared by shared leases and not yet allocated by their holders."""
    leases: list[Lease] = msgspec.field(default_factory=list)
    processes: Sequence[ProcessUsage] = ()
    own_pids: frozenset[int] = frozenset()
    held_alone: bool = False
    """Leased to the asking job alone: whatever runs there is its own."""
    recent_util_pct: float | None = None
    fault: str | None = None
    """Why the device cannot be told apart from another (two GPUs with one UUID)."""
    holders: tuple[Holder, ...] = ()
    """Who holds it for the cluster (a Slurm job, a Kubernetes pod)."""
    holders_unknown: str | None = None
    """Why nobody can tell who holds it for the cluster; `None` when that is known."""


class Kind:
    """What the rules need to know of one kind of device. Subclasses fill in the blanks."""

    mig = False
    """Whether it is the MIG devices (`Request.mig` set) this kind places."""
    noun = "GPU"

    def devices(self, snapshot: Snapshot) -> Sequence[Device]:
        raise NotImplementedError

    def outside(self, device: Device, request: Request) -> str | None:
        """Why `request` may never have `device` (not visible, excluded, the wrong
        kind or profile), or `None`."""
        raise NotImplementedError

    def processes(self, snapshot: Snapshot, device: Device) -> Sequence[ProcessUsage]:
        raise NotImplementedError

    def faults(self, snapshot: Snapshot) -> dict[tuple[int, ...], str]:
        """Devices (by `order`) that cannot be told apart from another, and why."""
        return {}

    def name(self, device: Device) -> str:
        raise NotImplementedError

    def identified(self, device: Device) -> bool:
        """Whether the device can be named to a job, and leases matched to it: its UUID."""
        return device.uuid is not None

    def order(self, device: Device) -> tuple[int, ...]:
        """Where the device's line stands among the reasons, and its key for ties."""
        raise NotImplementedError

    def utilization_pct(self, device: Device) -> float | None:
        return None

    def busyness(self, candidate: Candidate) -> float:
        """How busy the device looks, for ranking: lower is idler."""
        raise NotImplementedError


def place(
    kind: Kind,
    snapshot: Snapshot,
    request: Request,
    *,
    leases: Sequence[Lease] = (),
    mine: frozenset[str] = frozenset(),
    own_pids: frozenset[int] = frozenset(),
    recent_util_pct: Mapping[str, float] | None = None,
    waiting_ahead: Sequence[Waiter] = (),
    seed: int = 0,
    holders: Holders = NO_HOLDERS,
    explain: bool = True,
) -> Choice:
    """Chooses `request.count` devices of `kind`, or says for each why it cannot be had.

    Leases whose ids are in `mine` belong to the job asking (it runs under
    them), so they do not keep it from their devices; they do keep waiters off.
    The processes of those leases and `own_pids` (the job's other processes)
    do not make a device in use for it. `recent_util_pct` is each GPU's (by UUID)
    highest utilization over the last minute, where known. `seed` breaks ties
    between equally good devices; giving each process its own (its pid) spreads
    jobs started together over equal devices. `holders` says who the cluster says holds
    each device (a Slurm job, a Kubernetes pod, the asking job's own left out): a held
    device is never given, nor one whose holders are unknown unless the request allows it.
    `explain=False` leaves `Choice.reasons` empty (a caller that shows none: `where`,
    but for the nodes it explains), and the rest as it is.
    """
    recent = recent_util_pct or {}
    held = holders
    everyone = _candidates(kind, snapshot, leases, frozenset(), frozenset(), recent, held)
    kept = _kept_for_waiters(kind, snapshot, everyone, waiting_ahead)
    own = own_pids | {lease.pid for lease in leases if lease.lease_id in mine}
    candidates = everyone
    if own or mine:
        others = [lease for lease in leases if lease.lease_id not in mine]
        alone = frozenset(
            lease.gpu_uuid for lease in leases if lease.lease_id in mine and lease.exclusive
        )
        candidates = _candidates(kind, snapshot, others, own, alone, recent, held)
    ranked, rejected, (busy, unknown) = _qualify(kind, candidates, request, kept, seed, explain)
    if len(ranked) >= request.count:
        best = ranked[: request.count]
        reasons = tuple(rejected[key] for key in sorted(rejected))
        free = tuple(candidate.free_bytes for candidate in best)
        return Choice(tuple(c.device for c in best), reasons, len(ranked), busy, unknown, free)
    for candidate in ranked if explain else ():
        rejected[kind.order(candidate.device)] = (
            f"{kind.name(candidate.device)}: qualifies ({format_size(candidate.free_bytes)} free)"
        )
    reasons = tuple(rejected[key] for key in sorted(rejected))
    return Choice((), reasons, len(ranked), busy, unknown)


def usable(kind: Kind, snapshot: Snapshot, request: Request) -> list[Device]:
    """The devices `request` may ever have: visible to it, not excluded, of its kind."""
    return [device for device in kind.devices(snapshot) if kind.outside(device, request) is None]


class Never(msgspec.Struct, frozen=True):
    """Why no amount of waiting lets a request have enough devices of a node: it may have
    too few at all (`usable`), or too few of them are large enough (`large_enough` of them
    have `needed_bytes` of memory in all, the largest `largest_bytes`)."""

    usable: int
    large_enough: int
    needed_bytes: int
    largest_bytes: int | None


def never(kind: Kind, snapshot: Snapshot, request: Request) -> Never | None:
    """Why `request` could never be served on `snapshot`'s node, even with every device idle,
    or `None` when it could (a device of unknown size might be large enough). The one rule
    for "never": pick and `select()` refuse such a request at once, wait or not; a waiter
    must pass it to keep devices from later jobs; `where` says it of a node."""
    devices = usable(kind, snapshot, request)
    needed = needed_bytes(request)
    sizes = [device.memory_total_bytes for device in devices]
    large = sum(1 for total in sizes if total is None or total >= needed)
    if large >= request.count:
        return None
    largest = max((total for total in sizes if total is not None), default=None)
    return Never(len(devices), large, needed, largest)


def needed_bytes(request: Request) -> int:
    return max(request.min_free_bytes or 0, request.mem_bytes or 0)


def keepers(waiting_ahead: Sequence[Waiter], *, mig: bool) -> Iterator[Waiter]:
    """The waiters ahead that may keep devices of their kind (MIG devices with `mig`, else
    whole GPUs): each user's first in line, for `KEEP_LIMIT_S`."""
    users: set[str] = set()
    for waiter in waiting_ahead:
        if (waiter.request.mig is not None) is not mig or waiter.user in users:
            continue
        users.add(waiter.user)
        if waiter.waited_s <= KEEP_LIMIT_S:
            yield waiter


def qualifying(
    kind: Kind,
    snapshot: Snapshot,
    leases: Sequence[Lease] = (),
    holders: Holders = NO_HOLDERS,
) -> list[Device]:
    """The devices `Request()` could have now (whole and idle, at the default limits, any
    free memory, held by no job or pod, their holders known) for a job that holds nothing
    there, best first:
    the verdict a node publishes on each of its GPUs, so that `where` needs no more of it
    than its free memory. Jobs waiting in line and the last minute's load are left out, as
    `where` knows neither of a node it reads from Prometheus."""
    candidates = _candidates(kind, snapshot, leases, frozenset(), frozenset(), {}, holders)
    ranked, _, _ = _qualify(kind, candidates, Request(), {}, 0)
    return [candidate.device for candidate in ranked]


def _kept_for_waiters(
    kind: Kind, snapshot: Snapshot, everyone: list[Candidate], waiting_ahead: Sequence[Waiter]
) -> dict[tuple[int, ...], Waiter]:
    kept: dict[tuple[int, ...], Waiter] = {}
    for waiter in keepers(waiting_ahead, mig=kind.mig):
        if never(kind, snapshot, waiter.request) is not None:
            continue
        ranked, _, _ = _qualify(kind, everyone, waiter.request, kept, waiter.pid)
        for candidate in ranked[: waiter.request.count]:
            kept[kind.order(candidate.device)] = waiter
    return kept


def _candidates(
    kind: Kind,
    snapshot: Snapshot,
    leases: Iterable[Lease],
    own_pids: frozenset[int],
    own_devices: frozenset[str],
    recent_util_pct: Mapping[str, float],
    holders: Holders,
) -> list[Candidate]:
    faults = kind.faults(snapshot)
    by_uuid: dict[str, list[Lease]] = {}
    for lease in leases:
        by_uuid.setdefault(lease.gpu_uuid, []).append(lease)
    candidates = []
    for device in kind.devices(snapshot):
        uuid = device.uuid
        fault = faults.get(kind.order(device))
        # Two devices with one UUID are both in error: no lease can tell which it is for.
        held = by_uuid.get(uuid, []) if uuid and fault is None else []
        processes = kind.processes(snapshot, device)
        used_by_pid: dict[int, int] = {}
        for process in processes:
            used_by_pid[process.pid] = used_by_pid.get(process.pid, 0) + (
                process.memory_used_bytes or 0
            )
        # Memory a shared lease declared but its holder has not allocated yet is promised.
        promised = sum(
            max(0, (lease.mem_bytes or 0) - used_by_pid.get(lease.pid, 0)) for lease in held
        )
        candidates.append(
            Candidate(
                device,
                free_bytes=(device.memory_free_bytes or 0) - promised,
                promised_bytes=promised,
                leases=held,
                processes=processes,
                own_pids=own_pids,
                # Even its processes in another PID namespace, which no pid tells.
                held_alone=uuid in own_devices,
                recent_util_pct=recent_util_pct.get(uuid) if uuid else None,
                fault=fault,
                holders=holders.holders_of(device),
                holders_unknown=holders.unknown_of(device),
            )
        )
    return candidates


def _qualify(
    kind: Kind,
    candidates: list[Candidate],
    request: Request,
    kept: Mapping[tuple[int, ...], Waiter],
    seed: int,
    explain: bool = True,
) -> tuple[list[Candidate], dict[tuple[int, ...], str], tuple[int, int]]:
    """The candidates that qualify, best first; why each other does not (where `explain`);
    and how many of those are in use, and of unknown holders."""
    qualifying, rejected, busy, unknown = [], {}, 0, 0
    for candidate in candidates:
        reason = _reason_against(kind, candidate, request, kept)
        if reason is None:
            qualifying.append(candidate)
        else:
            busy += reason.startswith("in use")
            unknown += reason.startswith(HOLDERS_UNKNOWN)
            if explain:
                rejected[kind.order(candidate.device)] = f"{kind.name(candidate.device)}: {reason}"
    qualifying.sort(key=lambda candidate: _rank(kind, candidate, request.strategy, seed))
    return qualifying, rejected, (busy, unknown)


def _reason_against(
    kind: Kind, candidate: Candidate, request: Request, kept: Mapping[tuple[int, ...], Waiter]
) -> str | None:
    """Why `candidate` cannot serve `request`, or `None` when it can."""
    device = candidate.device
    if (reason := kind.outside(device, request)) is not None:
        return reason
    if (reason := _unreadable(kind, candidate)) is not None:
        return reason
    shared = request.mem_bytes is not None
    if reason := lease_conflict(candidate.leases, shared=shared) or _holding(candidate, request):
        return reason
    if (waiter := kept.get(kind.order(device))) is not None:
        return f"kept for pid {waiter.pid} ({waiter.user}), which asked earlier"
    if not candidate.held_alone:
        reason = in_use(
            candidate.processes,
            device.memory_used_bytes,
            kind.utilization_pct(device),
            request,
            own_pids=candidate.own_pids,
            recent_util_pct=candidate.recent_util_pct,
        )
        if reason is not None:
            return reason
    return _too_full(candidate, request)


def _unreadable(kind: Kind, candidate: Candidate) -> str | None:
    device = candidate.device
    if device.error is not None:
        return f"error: {device.error}"
    if candidate.fault is not None:
        return f"error: {candidate.fault}"
    if device.memory_free_bytes is None or not kind.identified(device):
        return "free memory unknown"
    return memory_nonsense(
        device.memory_total_bytes, device.memory_used_bytes, device.memory_free_bytes
    )


def _holding(candidate: Candidate, request: Request) -> str | None:
    """`held by job 1234 (alice)`, `held by pod ml/a and 2 more`; `holders unknown: why`
    unless the request takes such devices."""
    if holders := candidate.holders:
        more = f" and {len(holders) - 1} more" if len(holders) > 1 else ""
        return f"held by {holders[0]}{more}"
    if candidate.holders_unknown is not None and not request.allow_unknown_holders:
        return f"{HOLDERS_UNKNOWN}: {candidate.holders_unknown}"
    return None


def memory_nonsense(total: int | None, used: int | None, free: int | None) -> str | None:
    """`free memory unknown (...)` when the driver's memory figures cannot be true: more
    used or free than exists (a wrapped-around counter). Such a device is never chosen."""
    if total is None:
        return None
    for name, value in (("free", free), ("used", used)):
        if value is not None and not 0 <= value <= total:
            return (
                f"free memory unknown (the driver reports {format_size(value)} {name} "
                f"of {format_size(total)})"
            )
    return None


def lease_conflict(leases: list[Lease], *, shared: bool) -> str | None:
    """Why `leases` keep a job off their GPU (or MIG device), or `None` when they do not."""
    holder = next((lease for lease in leases if lease.exclusive), None)
    if holder is None and leases and not shared:
        holder = leases[0]
    if holder is None:
        return None
    others = f" and {len(leases) - 1} more" if len(leases) > 1 else ""
    how = "leased" if holder.exclusive else "shared"
    # A lease read from a node's metrics (`gpuwatch where`) has no holder to name.
    by = f" by pid {holder.pid} ({holder.user})" if holder.pid else ""
    return f"{how}{by}{others}"


def _too_full(candidate: Candidate, request: Request) -> str | None:
    needed = needed_bytes(request)
    if candidate.free_bytes >= needed:
        return None
    promised = candidate.promised_bytes
    note = f" after {format_size(promised)} promised to shared leases" if promised else ""
    return f"{format_size(max(0, candidate.free_bytes))} free{note} < {format_size(needed)}"


def in_use(
    processes: Iterable[ProcessUsage],
    used_bytes: int | None,
    utilization_pct: float | None,
    request: Request,
    *,
    own_pids: frozenset[int] = frozenset(),
    recent_util_pct: float | None = None,
) -> str | None:
    """Why a GPU or MIG device is in use for `request`, or `None` when it is not.

    For a job that wants an idle device (`Request.wants_idle`), any compute
    process of another job makes it in use, and so does a graphics process
    using more than `GRAPHICS_ALLOWANCE_BYTES`. Memory in use and utilization
    count against the limits the request sets (or its defaults). The job's own
    processes (`own_pids`) count for nothing: their memory is not counted, and
    utilization is theirs while they run there.
    """
    mine = [p for p in processes if p.pid in own_pids]
    others = [p for p in processes if p.pid not in own_pids and _occupies(p)]
    if used_bytes is not None:
        used_bytes = max(0, used_bytes - sum(p.memory_used_bytes or 0 for p in mine))
    busy_pct = _busiest(utilization_pct, recent_util_pct) if not mine else None
    if others and request.wants_idle:
        return _in_use_by(others, used_bytes, utilization_pct)
    used_limit = request.used_limit_bytes
    if used_limit is not None and used_bytes is not None and used_bytes > used_limit:
        flag = "--max-used" if request.max_used_bytes is not None else "default; see --max-used"
        return f"in use: {format_size(used_bytes)} used > {format_size(used_limit)} ({flag})"
    util_limit = request.util_limit_pct
    if request.max_util_pct is not None and utilization_pct is None and not mine:
        return "utilization unknown"
    if util_limit is not None and busy_pct is not None and busy_pct > util_limit:
        when = "" if busy_pct == utilization_pct else " in the last minute"
        flag = "--max-util" if request.max_util_pct is not None else "default; see --max-util"
        return f"in use: {busy_pct:g}% busy{when} > {util_limit:g}% ({flag})"
    return None


def _occupies(process: ProcessUsage) -> bool:
    if process.kind is not ProcessKind.GRAPHICS:
        return True
    return (process.memory_used_bytes or 0) > GRAPHICS_ALLOWANCE_BYTES


def _busiest(now_pct: float | None, recent_pct: float | None) -> float | None:
    known = [value for value in (now_pct, recent_pct) if value is not None]
    return max(known) if known else None


def _in_use_by(
    others: list[ProcessUsage], used_bytes: int | None, utilization_pct: float | None
) -> str:
    """`in use by svc-infer, pids 40500 40501, 36.0GiB used, 48% busy` (`in use by pid 7`
    where the user cannot be told: another PID namespace, or the host was not asked)."""
    users = sorted({p.user for p in others if p.user})
    pids = sorted({p.pid for p in others})
    who = f"{_first(users, 3, ', ')}, " if users else ""
    parts = [f"in use by {who}{'pid' if len(pids) == 1 else 'pids'} {_first(pids, 6, ' ')}"]
    if used_bytes is not None:
        parts.append(f"{format_size(used_bytes)} used")
    if utilization_pct is not None:
        parts.append(f"{utilization_pct:g}% busy")
    return ", ".join(parts)


def _first(items: Sequence[object], most: int, separator: str) -> str:
    """The first `most` items, and `...` when there are more: a reason stays one line."""
    return separator.join(str(item) for item in items[:most]) + (
        " ..." if len(items) > most else ""
    )


def _rank(kind: Kind, candidate: Candidate, strategy: Strategy, seed: int) -> tuple[float, ...]:
    free_gib = candidate.free_bytes // _GIB  # devices within a GiB of each other count as equal
    busy = kind.busyness(candidate)
    tie = tie_breaker(seed, kind.order(candidate.device))
    if strategy is Strategy.LEAST_UTIL:
        return (busy, -free_gib, tie)
    if strategy is Strategy.PACK:
        return (free_gib, busy, tie)
    return (-free_gib, len(candidate.leases), busy, tie)


def tie_breaker(seed: int, key: tuple[int, ...]) -> float:
    """A fixed shuffle of devices per seed (Knuth's multiplicative hash of the key)."""
    flat = 0
    for part in key:
        flat = flat * 8 + part
    return ((seed * 2654435761 + flat * 40503) * 2246822519 & 0xFFFFFFFF) / 2**32
