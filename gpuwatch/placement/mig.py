"""Which MIG devices a job gets: the MIG twin of `gpuwatch.placement.gpus`, as pure.

A MIG device qualifies when it is of the profile asked for, inside the job's
CUDA_VISIBLE_DEVICES and outside its `--exclude`, readable, not leased against
the request, not kept for a job waiting ahead, not in use (`policy.in_use()`,
for an exclusive request), and has the free memory asked for. A job waiting
ahead keeps devices only when enough of its profile could ever serve it. The driver reports no
utilization for MIG devices, so none is weighed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpuwatch.models import Lease, MigDevice, ProcessUsage, Snapshot
from gpuwatch.placement.choices import MIG_ANY as ANY
from gpuwatch.placement.choices import Strategy
from gpuwatch.placement.gpus import (
    enough_could_fit,
    in_use,
    keepers,
    lease_conflict,
    memory_nonsense,
)
from gpuwatch.placement.request import Request, Waiter
from gpuwatch.units import format_size

_GIB = 1 << 30


@dataclass(frozen=True, slots=True)
class MigChoice:
    """The outcome: `chosen` best first (empty unless all `count` qualify), and why not the rest."""

    chosen: tuple[MigDevice, ...]
    reasons: tuple[str, ...]
    qualifying: int = 0
    in_use: int = 0
    """How many were left out only because they are in use (see `policy.in_use()`)."""

    @property
    def satisfied(self) -> bool:
        return bool(self.chosen)


@dataclass(slots=True)
class _Candidate:
    """A MIG device weighed for the asking job."""

    device: MigDevice
    free_bytes: int
    leases: list[Lease]
    processes: tuple[ProcessUsage, ...]
    own_pids: frozenset[int]
    """The asking job's processes."""

    @property
    def busy_pids(self) -> list[int]:
        """Processes running in it that are not the asking job's."""
        return sorted(p.pid for p in self.processes if p.pid not in self.own_pids)


def choose_mig(
    snapshot: Snapshot,
    request: Request,
    *,
    leases: Sequence[Lease] = (),
    mine: frozenset[str] = frozenset(),
    own_pids: frozenset[int] = frozenset(),
    waiting_ahead: Sequence[Waiter] = (),
    seed: int = 0,
) -> MigChoice:
    """Chooses `request.count` MIG devices, or says for each why it cannot be had.

    `mine`, `own_pids`, `waiting_ahead` and `seed` mean what they mean to
    `policy.choose()`.
    """
    kept: dict[str, Waiter] = {}
    everyone = _candidates(snapshot, leases, frozenset(), frozenset())
    for waiter in keepers(waiting_ahead, mig=True):
        if not could_ever_serve_mig(snapshot, waiter.request):
            continue
        ranked, _, _ = _qualify(everyone, waiter.request, kept, waiter.pid)
        for candidate in ranked[: waiter.request.count]:
            kept[str(candidate.device.uuid)] = waiter
    candidates = _candidates(snapshot, leases, mine, own_pids)
    ranked, rejected, busy = _qualify(candidates, request, kept, seed)
    if len(ranked) >= request.count:
        chosen = tuple(candidate.device for candidate in ranked[: request.count])
        return MigChoice(chosen, tuple(rejected.values()), len(ranked), busy)
    for candidate in ranked:
        rejected[candidate.device.label] = (
            f"{_name(candidate.device)}: qualifies ({format_size(candidate.free_bytes)} free)"
        )
    ordered = sorted(rejected, key=lambda label: tuple(int(n) for n in label.split(":")))
    return MigChoice((), tuple(rejected[label] for label in ordered), len(ranked), busy)


def usable_mig_devices(snapshot: Snapshot, request: Request) -> list[MigDevice]:
    """The MIG devices `request` may ever have: of its profile, allowed and not excluded."""
    return [
        device
        for device in snapshot.mig_devices
        if (request.mig_allowed is None or device.uuid in request.mig_allowed)
        and device.gpu_index not in request.excluded
        and device.uuid not in request.mig_excluded
        and (request.mig in (None, ANY) or device.profile == request.mig)
    ]


def could_ever_serve_mig(snapshot: Snapshot, request: Request) -> bool:
    """Whether enough MIG devices of the profile could serve `request` once idle."""
    devices = usable_mig_devices(snapshot, request)
    return enough_could_fit((device.memory_total_bytes for device in devices), request)


def free_mig_devices(snapshot: Snapshot, leases: Sequence[Lease]) -> int:
    """How many MIG devices `--mig any` could have now: for the hint when no whole GPU can."""
    return choose_mig(snapshot, Request(mig=ANY), leases=leases).qualifying


def _candidates(
    snapshot: Snapshot, leases: Iterable[Lease], mine: frozenset[str], own_pids: frozenset[int]
) -> list[_Candidate]:
    own_pids = own_pids | {lease.pid for lease in leases if lease.lease_id in mine}
    others = [lease for lease in leases if lease.lease_id not in mine]
    candidates = []
    for device in snapshot.mig_devices:
        held = [lease for lease in others if device.uuid and lease.gpu_uuid == device.uuid]
        processes = snapshot.processes_in(device)
        used_by_pid = {p.pid: p.memory_used_bytes or 0 for p in processes}
        # Memory a shared lease declared but its holder has not allocated yet is promised.
        promised = sum(
            max(0, (lease.mem_bytes or 0) - used_by_pid.get(lease.pid, 0)) for lease in held
        )
        free = (device.memory_free_bytes or 0) - promised
        candidates.append(_Candidate(device, free, held, processes, own_pids))
    return candidates


def _qualify(
    candidates: list[_Candidate], request: Request, kept: Mapping[str, Waiter], seed: int
) -> tuple[list[_Candidate], dict[str, str], int]:
    qualifying, rejected, busy = [], {}, 0
    for candidate in candidates:
        reason = _reason_against(candidate, request, kept)
        if reason is None:
            qualifying.append(candidate)
        else:
            busy += reason.startswith("in use")
            rejected[candidate.device.label] = f"{_name(candidate.device)}: {reason}"
    qualifying.sort(key=lambda candidate: _rank(candidate, request.strategy, seed))
    return qualifying, rejected, busy


def _reason_against(
    candidate: _Candidate, request: Request, kept: Mapping[str, Waiter]
) -> str | None:
    device = candidate.device
    if request.mig_allowed is not None and device.uuid not in request.mig_allowed:
        return "not in CUDA_VISIBLE_DEVICES"
    if device.gpu_index in request.excluded or device.uuid in request.mig_excluded:
        return "excluded"
    if request.mig not in (None, ANY) and device.profile != request.mig:
        return f"profile {device.profile or 'unknown'}, not {request.mig}"
    return _unreadable(device) or _held(candidate, request, kept) or _too_full(candidate, request)


def _unreadable(device: MigDevice) -> str | None:
    if device.error is not None:
        return f"error: {device.error}"
    if device.uuid is None or device.memory_free_bytes is None:
        return "free memory unknown"
    return memory_nonsense(
        device.memory_total_bytes, device.memory_used_bytes, device.memory_free_bytes
    )


def _held(candidate: _Candidate, request: Request, kept: Mapping[str, Waiter]) -> str | None:
    shared = request.mem_bytes is not None
    if reason := lease_conflict(candidate.leases, shared=shared):
        return reason
    if (waiter := kept.get(str(candidate.device.uuid))) is not None:
        return f"kept for pid {waiter.pid} ({waiter.user}), which asked earlier"
    device = candidate.device
    return in_use(
        candidate.processes,
        device.memory_used_bytes,
        None,  # the driver reports no utilization for a MIG device
        request,
        own_pids=candidate.own_pids,
    )


def _too_full(candidate: _Candidate, request: Request) -> str | None:
    needed = max(request.min_free_bytes or 0, request.mem_bytes or 0)
    if candidate.free_bytes >= needed:
        return None
    return f"{format_size(max(0, candidate.free_bytes))} free < {format_size(needed)}"


def _rank(candidate: _Candidate, strategy: Strategy, seed: int) -> tuple[float, ...]:
    free_gib = candidate.free_bytes // _GIB
    tie = _tie_breaker(seed, candidate.device)
    if strategy is Strategy.PACK:
        return (free_gib, tie)
    # Without utilization, the fewest processes stands in for the least busy.
    if strategy is Strategy.LEAST_UTIL:
        return (len(candidate.busy_pids), -free_gib, tie)
    return (-free_gib, len(candidate.leases), len(candidate.busy_pids), tie)


def _tie_breaker(seed: int, device: MigDevice) -> float:
    """A fixed shuffle of MIG devices per seed (Knuth's multiplicative hash)."""
    key = device.gpu_index * 8 + device.index
    return ((seed * 2654435761 + key * 40503) * 2246822519 & 0xFFFFFFFF) / 2**32


def _name(device: MigDevice) -> str:
    return f"MIG {device.label} ({device.profile or '?'})"


def stale_mig_leases(snapshot: Snapshot, leases: Sequence[Lease]) -> list[Lease]:
    """Leases of MIG devices that are gone: their GPU reads, its MIG devices are all known,
    and the leased one is not among them (the GPU was reconfigured, or left MIG mode).

    Only leases older than the snapshot count: a snapshot from the daemon may predate a MIG
    device created since, and leased by a picker that read the driver itself.
    """
    present = {device.uuid for device in snapshot.mig_devices}
    known = {gpu.index for gpu in snapshot.gpus if gpu.mig_enabled is not None}
    return [
        lease
        for lease in leases
        if lease.gpu_uuid.startswith("MIG-")
        and lease.gpu_index in known
        and lease.gpu_uuid not in present
        and lease.started_at < snapshot.taken_at
    ]
