"""Which GPUs a job gets: filters and ranking, as a pure function of what is known.

`choose()` takes a snapshot, the leases in force and the jobs waiting ahead in
line, and returns the GPUs to give and, for every other GPU, one line saying
why not. No I/O happens here; `gpuwatch.selector` gathers the inputs.

A job waiting ahead keeps the GPUs it could use from jobs behind it, so that
small jobs do not starve a large one. Since anyone can join the line, that is
bounded: only each user's first job in line keeps GPUs, only for
`KEEP_LIMIT_S`, and only when this node could ever meet its request.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from gpuwatch.choices import Strategy
from gpuwatch.models import GpuSample, Lease, Snapshot
from gpuwatch.units import format_size

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing at run time
if TYPE_CHECKING:
    from typing import Any

_GIB = 1 << 30
_MAX_NAME_CHARS = 128
KEEP_LIMIT_S = 1800.0
"""How long a waiting job keeps GPUs from later jobs; after that it waits as their equal."""
_MAX_COUNT = 1 << 16
_MAX_BYTES = 1 << 53


@dataclass(frozen=True, slots=True)
class Request:
    """What a job asks for. GPU sets hold NVML indices."""

    count: int = 1
    min_free_bytes: int | None = None
    max_util_pct: float | None = None
    mem_bytes: int | None = None
    """Memory the job declares it will use: the lease is then shared. `None`: exclusive."""
    strategy: Strategy = Strategy.MOST_FREE
    allowed: frozenset[int] | None = None
    """The GPUs it may have (from CUDA_VISIBLE_DEVICES); `None`: any."""
    excluded: frozenset[int] = frozenset()
    mig: str | None = None
    """A MIG profile (`1g.10gb`) or `any`: MIG devices are wanted, not whole GPUs."""
    mig_allowed: frozenset[str] | None = None
    """The MIG devices (UUIDs) it may have, from CUDA_VISIBLE_DEVICES; `None`: any."""
    mig_excluded: frozenset[str] = frozenset()

    def to_dict(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "min_free_bytes": self.min_free_bytes,
            "max_util_pct": self.max_util_pct,
            "mem_bytes": self.mem_bytes,
            "strategy": self.strategy.value,
            "allowed": None if self.allowed is None else sorted(self.allowed),
            "excluded": sorted(self.excluded),
            **_mig_to_dict(self),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Request:
        """The inverse of `to_dict`, strict: raises `ValueError` for anything malformed
        (waiting tickets come from a directory every user can write to)."""
        allowed = data.get("allowed")
        strategy = data.get("strategy", Strategy.MOST_FREE.value)
        if not isinstance(strategy, str):
            raise ValueError(f"not a strategy: {strategy!r}")
        return cls(
            count=_number(data["count"], int, 1, _MAX_COUNT),
            min_free_bytes=_optional(data.get("min_free_bytes"), int, _MAX_BYTES),
            max_util_pct=_optional(data.get("max_util_pct"), float, 100),
            mem_bytes=_optional(data.get("mem_bytes"), int, _MAX_BYTES),
            strategy=Strategy(strategy),
            allowed=None if allowed is None else _indices(allowed),
            excluded=_indices(data.get("excluded", [])),
            **_mig_from_dict(data),
        )


def _mig_to_dict(request: Request) -> dict[str, Any]:
    if request.mig is None:
        return {}  # a ticket as older versions write it
    allowed = request.mig_allowed
    return {
        "mig": request.mig,
        "mig_allowed": None if allowed is None else sorted(allowed),
        "mig_excluded": sorted(request.mig_excluded),
    }


def _mig_from_dict(data: Mapping[str, Any]) -> dict[str, Any]:
    mig, allowed = data.get("mig"), data.get("mig_allowed")
    if mig is not None and not (isinstance(mig, str) and 0 < len(mig) <= _MAX_NAME_CHARS):
        raise ValueError(f"not a MIG profile: {mig!r}")
    return {
        "mig": mig,
        "mig_allowed": None if allowed is None else _uuids(allowed),
        "mig_excluded": _uuids(data.get("mig_excluded", [])),
    }


def _uuids(values: object) -> frozenset[str]:
    if not isinstance(values, list) or not all(
        isinstance(value, str) and value.startswith("MIG-") and len(value) <= _MAX_NAME_CHARS
        for value in values
    ):
        raise ValueError(f"not a list of MIG device UUIDs: {values!r}")
    return frozenset(values)


def _number(value: object, kind: type, minimum: float, maximum: float) -> Any:
    ok_types = (int, float) if kind is float else (int,)
    # Range first: NaN fails it, and an int too large for a float never meets float().
    if (
        isinstance(value, bool)
        or not isinstance(value, ok_types)
        or not minimum <= value <= maximum
    ):
        raise ValueError(f"not a {kind.__name__} in [{minimum}, {maximum}]: {value!r}")
    return kind(value)


def _optional(value: object, kind: type, maximum: float) -> Any:
    return None if value is None else _number(value, kind, 0, maximum)


def _indices(values: object) -> frozenset[int]:
    if not isinstance(values, list) or len(values) > _MAX_COUNT:
        raise ValueError("not a list of GPU indices")
    return frozenset(_number(value, int, 0, _MAX_COUNT) for value in values)


@dataclass(frozen=True, slots=True)
class Waiter:
    """A job that asked earlier and is still waiting: GPUs it can use are kept for it."""

    pid: int
    user: str
    request: Request
    waited_s: float = 0.0
    """How long it has been in line."""


@dataclass(frozen=True, slots=True)
class Choice:
    """The outcome: `chosen` best first (empty unless all `count` qualify), and why not the rest."""

    chosen: tuple[GpuSample, ...]
    reasons: tuple[str, ...]
    qualifying: int = 0

    @property
    def satisfied(self) -> bool:
        return bool(self.chosen)


class _Candidate:
    """A GPU as a candidate: its free memory net of promises, and its leases."""

    __slots__ = ("free_bytes", "gpu", "leases")

    def __init__(self, gpu: GpuSample) -> None:
        self.gpu = gpu
        self.free_bytes = 0
        self.leases: list[Lease] = []


def choose(
    snapshot: Snapshot,
    request: Request,
    *,
    leases: Sequence[Lease] = (),
    mine: frozenset[str] = frozenset(),
    waiting_ahead: Sequence[Waiter] = (),
    seed: int = 0,
) -> Choice:
    """Chooses `request.count` GPUs, or says for each GPU why it cannot be had.

    Leases whose ids are in `mine` belong to the job asking (it runs under
    them), so they do not keep it from their GPUs; they do keep waiters off.
    `seed` breaks ties between equally good GPUs; giving each process its own
    (its pid) spreads jobs started together over equal GPUs.
    """
    everyone = _candidates(snapshot, leases)
    kept: dict[int, Waiter] = {}
    for waiter in keepers(waiting_ahead, mig=False):
        if not _could_ever_serve(snapshot, waiter.request):
            continue
        ranked, _ = _qualify(everyone, waiter.request, kept, waiter.pid)
        for candidate in ranked[: waiter.request.count]:
            kept[candidate.gpu.index] = waiter
    others = [lease for lease in leases if lease.lease_id not in mine]
    candidates = _candidates(snapshot, others) if mine else everyone
    ranked, rejected = _qualify(candidates, request, kept, seed)
    if len(ranked) >= request.count:
        chosen = tuple(candidate.gpu for candidate in ranked[: request.count])
        return Choice(chosen, tuple(rejected.values()), len(ranked))
    for candidate in ranked:
        rejected[candidate.gpu.index] = (
            f"GPU {candidate.gpu.index}: qualifies ({format_size(candidate.free_bytes)} free)"
        )
    return Choice((), tuple(rejected[index] for index in sorted(rejected)), len(ranked))


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


def _could_ever_serve(snapshot: Snapshot, request: Request) -> bool:
    """Whether enough of these GPUs could serve `request` once idle (a GPU whose size is
    unknown might)."""
    needed = max(request.min_free_bytes or 0, request.mem_bytes or 0)
    big_enough = sum(
        1
        for gpu in snapshot.gpus
        if (request.allowed is None or gpu.index in request.allowed)
        and gpu.index not in request.excluded
        and (gpu.memory_total_bytes is None or gpu.memory_total_bytes >= needed)
    )
    return big_enough >= request.count


def _candidates(snapshot: Snapshot, leases: Iterable[Lease]) -> list[_Candidate]:
    by_uuid = {gpu.uuid: _Candidate(gpu) for gpu in snapshot.gpus if gpu.uuid}
    for lease in leases:
        if lease.gpu_uuid in by_uuid:
            by_uuid[lease.gpu_uuid].leases.append(lease)
    used_by_pid: dict[tuple[int, int], int] = {}
    for process in snapshot.processes:
        key = (process.gpu_index, process.pid)
        used_by_pid[key] = used_by_pid.get(key, 0) + (process.memory_used_bytes or 0)
    candidates = []
    for gpu in snapshot.gpus:
        candidate = by_uuid.get(gpu.uuid) if gpu.uuid else None
        candidate = candidate or _Candidate(gpu)
        # Memory a shared lease declared but its holder has not allocated yet is promised.
        promised = sum(
            max(0, (lease.mem_bytes or 0) - used_by_pid.get((gpu.index, lease.pid), 0))
            for lease in candidate.leases
        )
        candidate.free_bytes = (gpu.memory_free_bytes or 0) - promised
        candidates.append(candidate)
    return candidates


def _qualify(
    candidates: list[_Candidate], request: Request, kept: Mapping[int, Waiter], seed: int
) -> tuple[list[_Candidate], dict[int, str]]:
    qualifying, rejected = [], {}
    for candidate in candidates:
        reason = _reason_against(candidate, request, kept)
        if reason is None:
            qualifying.append(candidate)
        else:
            rejected[candidate.gpu.index] = f"GPU {candidate.gpu.index}: {reason}"
    qualifying.sort(key=lambda candidate: _rank(candidate, request.strategy, seed))
    return qualifying, rejected


def _reason_against(
    candidate: _Candidate, request: Request, kept: Mapping[int, Waiter]
) -> str | None:
    """Why `candidate` cannot serve `request`, or `None` when it can."""
    for check in (_outside_request, _split_by_mig, _unreadable, _held, _too_busy, _too_full):
        if (reason := check(candidate, request, kept)) is not None:
            return reason
    return None


def _outside_request(
    candidate: _Candidate, request: Request, _: Mapping[int, Waiter]
) -> str | None:
    if request.allowed is not None and candidate.gpu.index not in request.allowed:
        return "not in CUDA_VISIBLE_DEVICES"
    return "excluded" if candidate.gpu.index in request.excluded else None


def _split_by_mig(candidate: _Candidate, _: Request, __: Mapping[int, Waiter]) -> str | None:
    if candidate.gpu.mig_enabled:
        return "MIG enabled: it is given out only as MIG devices (use --mig PROFILE|any)"
    return None


def _unreadable(candidate: _Candidate, _: Request, __: Mapping[int, Waiter]) -> str | None:
    gpu = candidate.gpu
    if gpu.error is not None:
        return f"error: {gpu.error}"
    if gpu.memory_free_bytes is None or gpu.uuid is None:
        return "free memory unknown"
    return None


def _held(candidate: _Candidate, request: Request, kept: Mapping[int, Waiter]) -> str | None:
    if reason := lease_conflict(candidate.leases, shared=request.mem_bytes is not None):
        return reason
    if (waiter := kept.get(candidate.gpu.index)) is not None:
        return f"kept for pid {waiter.pid} ({waiter.user}), which asked earlier"
    return None


def _too_busy(candidate: _Candidate, request: Request, _: Mapping[int, Waiter]) -> str | None:
    utilization = candidate.gpu.utilization_pct
    if request.max_util_pct is None:
        return None
    if utilization is None:
        return "utilization unknown"
    if utilization > request.max_util_pct:
        return f"{utilization}% busy > {request.max_util_pct:g}%"
    return None


def _too_full(candidate: _Candidate, request: Request, _: Mapping[int, Waiter]) -> str | None:
    needed = max(request.min_free_bytes or 0, request.mem_bytes or 0)
    if candidate.free_bytes >= needed:
        return None
    promised = (candidate.gpu.memory_free_bytes or 0) - candidate.free_bytes
    note = f" after {format_size(promised)} promised to shared leases" if promised else ""
    return f"{format_size(max(0, candidate.free_bytes))} free{note} < {format_size(needed)}"


def lease_conflict(leases: list[Lease], *, shared: bool) -> str | None:
    """Why `leases` keep a job off their GPU (or MIG device), or `None` when they do not."""
    holder = next((lease for lease in leases if lease.exclusive), None)
    if holder is None and leases and not shared:
        holder = leases[0]
    if holder is None:
        return None
    others = f" and {len(leases) - 1} more" if len(leases) > 1 else ""
    how = "leased" if holder.exclusive else "shared"
    return f"{how} by pid {holder.pid} ({holder.user}){others}"


def _rank(candidate: _Candidate, strategy: Strategy, seed: int) -> tuple[float, ...]:
    free_gib = candidate.free_bytes // _GIB  # GPUs within a GiB of each other count as equal
    utilization = candidate.gpu.utilization_pct
    busy = 100.0 if utilization is None else float(utilization)
    tie = _tie_breaker(seed, candidate.gpu.index)
    if strategy is Strategy.LEAST_UTIL:
        return (busy, -free_gib, tie)
    if strategy is Strategy.PACK:
        return (free_gib, busy, tie)
    return (-free_gib, len(candidate.leases), busy, tie)


def _tie_breaker(seed: int, index: int) -> float:
    """A fixed shuffle of GPU indices per seed (Knuth's multiplicative hash)."""
    return ((seed * 2654435761 + index * 40503) * 2246822519 & 0xFFFFFFFF) / 2**32
